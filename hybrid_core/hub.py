"""Hugging Face hub names: telling a hub id (`Qwen/Qwen3-4B`, `zhuzilin/dapo-math-17k`) from a local path, whether
the hub may be used (HF_HUB_OFFLINE), and whether a model is in the local cache (huggingface_hub's own lookup).

Datasets and models call it to word their checks and errors; it knows nothing about what is loaded and never touches
the network.
"""
from __future__ import annotations

import os
from pathlib import Path

LOCAL_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".arrow", ".py", ".yaml", ".yml", ".txt")
OFFLINE_FLAGS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
TRUE_VALUES = ("1", "ON", "YES", "TRUE")


def is_hub_name(value: str | None) -> bool:
    """True when `value` names a hub repository rather than a local path: it does not exist here, has no file suffix,
    is not written as a path (`/`, `.`, `~`, two slashes or more), its first part is not a local folder
    (`data/missing-model` is a missing local path, `Qwen/Qwen3-4B` a hub id), and the hub accepts it as a repo id."""
    if not value or Path(value).exists() or value.startswith(("/", ".", "~")) or value.count("/") > 1:
        return False
    if Path(value).suffix.lower() in LOCAL_SUFFIXES:
        return False
    if "/" in value and Path(value.split("/")[0]).is_dir():
        return False
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(value)
    except HFValidationError:
        return False
    return True


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or transformers' TRANSFORMERS_OFFLINE) is set: nothing may be downloaded."""
    return any(os.environ.get(flag, "").strip().upper() in TRUE_VALUES for flag in OFFLINE_FLAGS)


def model_in_cache(repo_id: str) -> bool:
    """The model's config.json is in the local hub cache (`huggingface_hub.try_to_load_from_cache`)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def model_hub_problems(field: str, value: str | None) -> list[str]:
    """A hub model that cannot be had: HF_HUB_OFFLINE is set and the model is not in the local cache."""
    if not is_hub_name(value) or not hub_offline() or model_in_cache(value):
        return []
    return [f"{field} {value!r} is a Hugging Face hub id that is not in the local cache, and HF_HUB_OFFLINE=1 forbids "
            f"downloading it: download it first (`hf download {value}` where the hub can be reached, "
            f"into this machine's HF_HOME), unset HF_HUB_OFFLINE, or pass --{field} a local model directory"]
