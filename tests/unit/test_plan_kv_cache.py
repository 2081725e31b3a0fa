"""plan: an fp8 KV cache (`--vllm.kv_cache_dtype fp8`) in `hybrid plan`'s rollout lines, and its refusal on a CPU
whose vLLM attention has no fp8 path (neither AVX-512 nor AMX)."""
from hybrid_core.flags import parse_cli
from hybrid_core.plan.refusals import preflight_problems
from hybrid_core.plan.report import render_plan
from test_plan import INPUT_FLAGS


def test_an_fp8_kv_cache_is_shown_in_the_plan_and_needs_avx512_or_amx_on_cpu(monkeypatch, tmp_path):
    from hybrid_core.plan import refusals

    cpu = ["--vllm.kv_cache_dtype", "fp8", "--vllm.num_engines", "1", "--train.device", "cpu", *INPUT_FLAGS]
    monkeypatch.setattr(refusals, "cpu_has_fp8_attention", lambda: True)
    assert preflight_problems(parse_cli(cpu), num_gpus_found=0) == []
    assert ("KV cache: fp8 (e4m3, one byte a value, scale 1): the rollout samples from a slightly different policy "
            "than the trainer's; nothing corrects for that (--algo.advantage.is_correction_enable would)"
            ) in render_plan(parse_cli(cpu)).splitlines()
    corrected = render_plan(parse_cli([*cpu, "--algo.advantage.is_correction_enable"]))
    assert "; the IS correction weighs the difference" in corrected
    assert "KV cache" not in render_plan(parse_cli(INPUT_FLAGS))
    monkeypatch.setattr(refusals, "cpu_has_fp8_attention", lambda: False)
    assert preflight_problems(parse_cli(cpu), num_gpus_found=0) == [
        "vllm.kv_cache_dtype fp8 on CPU needs x86 with AVX-512 or AMX (vLLM's CPU attention): this machine has "
        "neither; drop --vllm.kv_cache_dtype"]
    monkeypatch.undo()
    (tmp_path / "avx2").write_text("processor : 0\nflags : fpu sse2 avx avx2 fma\n")
    (tmp_path / "avx512").write_text("processor : 0\nflags : fpu sse2 avx avx2 avx512f avx512bw\n")
    (tmp_path / "amx").write_text("processor : 0\nflags : fpu avx2 amx_bf16 amx_tile\n")
    assert [refusals.cpu_has_fp8_attention(tmp_path / name) for name in ("avx2", "avx512", "amx", "none")] == [
        False, True, True, True]
