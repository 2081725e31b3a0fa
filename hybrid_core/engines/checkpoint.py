"""DeepSpeed checkpoints of a train engine, on local disk or an object store, with client state and RNG states.

Owns the layout `<ckpt.path>/_<role>/global_step<k>/` (DeepSpeed's own format: model, optimizer, scheduler and
`client_state`), HF exports `<ckpt.path>/global_step<k>_hf/`, rotation to `ckpt.max_num`, and staging through a local
temporary folder when the checkpoint root is `s3://…` (DeepSpeed writes local files only).
A LoRA policy's checkpoints hold its adapters and their optimizer states only (the frozen base is the model it was
loaded from). It knows nothing about Ray, Prefect or what the client state means.
"""
from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path

import fsspec
import numpy as np
import torch

from hybrid_core.engines.deepspeed_train import DeepSpeedTrainEngine


def tag_of(step: int) -> str:
    return f"global_step{step}"


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(engine: DeepSpeedTrainEngine, ckpt_root: str, role: str, step: int, client_state: dict) -> str:
    """Save `engine` as `<ckpt_root>/_<role>/global_step<step>`; returns that URI."""
    fs, root = fsspec.core.url_to_fs(ckpt_root)
    is_local = "file" in fs.protocol
    local_root = Path(root if is_local else tempfile.mkdtemp(prefix="hybrid-ckpt-")) / f"_{role}"
    engine.finish_sleep()  # the optimizer states are whole again (in host memory) before DeepSpeed reads them
    engine.engine.save_checkpoint(str(local_root), tag=tag_of(step), client_state=client_state,
                                  exclude_frozen_parameters=engine.has_adapters)
    if not is_local:  # each data-parallel rank uploads the files it wrote (its optimizer partition; rank 0 the model)
        local_tag = local_root / tag_of(step)
        for path in sorted(p for p in local_tag.rglob("*") if p.is_file()):
            fs.put_file(str(path), f"{root}/_{role}/{tag_of(step)}/{path.relative_to(local_tag).as_posix()}")
        shutil.rmtree(local_root.parent, ignore_errors=True)
    return f"{ckpt_root.rstrip('/')}/_{role}/{tag_of(step)}"


def load_checkpoint(engine: DeepSpeedTrainEngine, ckpt_root: str, role: str, step: int) -> dict:
    """Load `<ckpt_root>/_<role>/global_step<step>` into `engine`; returns its client state."""
    fs, root = fsspec.core.url_to_fs(ckpt_root)
    is_local = "file" in fs.protocol
    local_root = Path(root if is_local else tempfile.mkdtemp(prefix="hybrid-ckpt-")) / f"_{role}"
    if not is_local:
        fs.get(f"{root}/_{role}/{tag_of(step)}", str(local_root / tag_of(step)), recursive=True)
    if not (local_root / tag_of(step)).is_dir():
        raise FileNotFoundError(f"checkpoint {tag_of(step)} of the {role} not found under {ckpt_root}")
    engine.finish_sleep()
    _, client_state = engine.engine.load_checkpoint(str(local_root), tag=tag_of(step), load_optimizer_states=True,
                                                    load_lr_scheduler_states=True,
                                                    load_module_strict=not engine.has_adapters)
    if not is_local:
        shutil.rmtree(local_root.parent, ignore_errors=True)
    return client_state or {}


def newest_checkpoint(ckpt_root: str, role: str = "actor") -> int:
    """The highest step with a saved `<ckpt_root>/_<role>/global_step<k>`, or 0 when there is none."""
    fs, root = fsspec.core.url_to_fs(ckpt_root)
    steps = [int(p.rsplit("global_step", 1)[1]) for p in fs.glob(f"{root}/_{role}/global_step*")
             if p.rsplit("global_step", 1)[1].isdigit()]
    return max(steps, default=0)


def remove_checkpoints(ckpt_root: str, steps: list[int]) -> None:
    """Rotation: delete the given steps' checkpoints of every role and their HF exports."""
    fs, root = fsspec.core.url_to_fs(ckpt_root)
    for step in steps:
        for path in fs.glob(f"{root}/_*/{tag_of(step)}") + fs.glob(f"{root}/{tag_of(step)}_hf"):
            fs.rm(path, recursive=True)


def export_hf(engine: DeepSpeedTrainEngine, out_uri: str, tokenizer, with_merged: bool = False) -> str:
    """HF weights (+ tokenizer) to `out_uri`, staged locally for object stores, written by rank 0 (a LoRA policy's
    adapter, and with `with_merged` its merged model; see `save_hf`). Under ZeRO-3 every rank calls it: the others
    only join the gather of the weights."""
    if engine.rank != 0:
        engine.save_hf(out_uri)  # writes nothing off rank 0
        return out_uri
    fs, root = fsspec.core.url_to_fs(out_uri)
    if "file" in fs.protocol:
        engine.save_hf(root, tokenizer, with_merged)
        return out_uri
    local = tempfile.mkdtemp(prefix="hybrid-hf-")
    engine.save_hf(local, tokenizer, with_merged)
    fs.put(local, root, recursive=True)
    shutil.rmtree(local, ignore_errors=True)
    return out_uri
