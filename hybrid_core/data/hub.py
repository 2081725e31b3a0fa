"""Hugging Face hub names: telling a hub id (`Qwen/Qwen3-4B`, `zhuzilin/dapo-math-17k`) from a local path, whether
the hub may be used (HF_HUB_OFFLINE), whether a model or dataset is in the local cache, and whether the hub answers.

Datasets and models call it to word their checks and errors; it knows nothing about what is loaded. The network is
touched once, by `dataset_hub_problems`, for a hub dataset that is not cached: one metadata request with a timeout.
"""
from __future__ import annotations

import os
from pathlib import Path

LOCAL_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".arrow", ".py", ".yaml", ".yml", ".txt")
OFFLINE_FLAGS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
TRUE_VALUES = ("1", "ON", "YES", "TRUE")
HUB_PROBE_TIMEOUT_S = 10.0  # one metadata request; a DNS failure or a refused connection answers in milliseconds


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


def dataset_in_cache(name: str) -> bool:
    """A hub dataset was downloaded here: its repository in the hub cache, or its prepared Arrow files in
    `datasets`' cache (HF_DATASETS_CACHE, else HF_HOME/datasets, where `owner/name` is written `owner___name`)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    hub_folder = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=name, repo_type="dataset")
    prepared = Path(os.environ.get("HF_DATASETS_CACHE") or Path(constants.HF_HOME) / "datasets")
    return hub_folder.is_dir() or (prepared / name.replace("/", "___")).is_dir()


def hub_dataset_error(name: str, timeout_s: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """Why the hub cannot serve dataset `name` (None when it answers for it): not found, or not reachable."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().dataset_info(name, timeout=timeout_s)
    except GatedRepoError:
        return None  # it exists; the loader reads it with the user's token
    except RepositoryNotFoundError:
        return "the hub has no such dataset (or it is private and no token is set)"
    except Exception as err:  # httpx's, requests' and the OS's network errors differ by version: all mean unreachable
        return f"the hub cannot be reached ({type(err).__name__}: {err})"
    return None


def dataset_hub_problems(field: str, value: str | None) -> list[str]:
    """A hub dataset that cannot be had: not cached, and HF_HUB_OFFLINE set or the hub not answering for it."""
    if not is_hub_name(value) or dataset_in_cache(value):
        return []
    why = "HF_HUB_OFFLINE=1 forbids downloading it" if hub_offline() else hub_dataset_error(value)
    if why is None:
        return []
    return [f"{field} {value!r} is a Hugging Face hub dataset that is not in the local cache, and {why}: give a local "
            f"path (a JSONL/Parquet file or a save_to_disk folder), or download it where the hub can be reached "
            f"(`hf download --repo-type dataset {value}`) and run with HF_HUB_OFFLINE=1"]
