"""flash_attn.utils of the stand-in: only `distributed`, which OpenRLHF imports."""
