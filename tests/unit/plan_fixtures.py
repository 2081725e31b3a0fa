"""What the memory-plan tests share: a colocated Qwen3-1.7B run config, its parameter count by hand, a phase's
terms by name, and the autouse fixtures `logprob_kernels` and `liger` (import them into a test module to apply
them there; not a conftest.py: the integration tests import the root conftest by its module name, which a second
one would shadow)."""
import pytest

from hybrid_core.config import RunConfig

H200_GIB = 139.8

# Qwen3-1.7B by hand (its config.json: hidden 2048, intermediate 6144, 28 layers, 16 heads, 8 KV heads, head_dim 128,
# vocab 151936, tied): embedding 151936·2048 = 311,164,928; per layer q 2048·2048 = 4,194,304, k and v
# 2048·1024 = 2,097,152 each, o 4,194,304, MLP 3·2048·6144 = 37,748,736, norms 2·2048 + 2·128 = 4,352 →
# 50,336,000; 28 layers 1,409,408,000; final norm 2,048. Tied: 1,720,574,976 (transformers counts the same).
QWEN3_1_7B_PARAMS = 1_720_574_976

# The head weight's gradient summed over the vocabulary-head chunks: 151936 · 2048 · 2 bytes = 0.57958984375 GiB
HEAD_GRADIENT_SUM = 0.57958984375


def config(world: int = 1, **blocks) -> RunConfig:
    """A colocated Qwen3-1.7B run on `world` GPUs (one vLLM engine per GPU) plus `blocks` merged in."""
    base = {"actor": {"model_name_or_path": "Qwen/Qwen3-1.7B", "num_gpus_per_node": world},
            "ref": {"num_gpus_per_node": world}, "vllm": {"num_engines": world, "sync_bucket_mb": 256},
            "train": {"colocate_all": True}, "data": {"max_len": 2048},
            "algo": {"advantage": {"estimator": "reinforce"}, "kl": {"init_coef": 0.0}}}
    for ns, block in blocks.items():
        base[ns] = base.get(ns, {}) | block
    return RunConfig.model_validate(base)


def terms(phase) -> dict[str, float]:
    return {term.name: term.gib for term in phase.terms}


@pytest.fixture(autouse=True)
def liger(monkeypatch):
    """Whether the liger-kernel package is installed, as the plan sees it: not, unless a test says so (the figures
    by hand are the model's own kernels, whatever this machine has installed)."""
    import hybrid_core.plan.memory as memory_plan

    def installed(value: bool) -> None:
        monkeypatch.setattr(memory_plan, "liger_installed", lambda: value)
    installed(False)
    return installed


@pytest.fixture(autouse=True)
def logprob_kernels(monkeypatch):
    """Whether Triton is installed, as the memory plan sees it: not, unless a test says so (the plan's figures by hand
    are the PyTorch head's, whatever this machine has installed: the CPU build's vLLM brings Triton)."""
    import hybrid_core.plan.memory as memory_plan

    def installed(value: bool) -> None:
        monkeypatch.setattr(memory_plan, "triton_installed", lambda: value)
    monkeypatch.delenv("HYBRID_LOGPROB_KERNEL", raising=False)
    installed(False)
    return installed
