"""Secrets from Prefect Secret blocks: object-store credentials (`--store.credentials_block NAME`) and the W&B API
key (`--logger.wandb.secret_block NAME`).

The block's value is JSON with `aws_access_key_id`, `aws_secret_access_key` and optionally `aws_session_token`,
`region_name`, `endpoint_url`. They are put into this flow process's environment as the AWS_* variables that s3fs
reads, and the workers receive them as a constructor argument (not through Ray's runtime env, which Ray's agent
logs in plain text): they never enter flow parameters, logs, the manifest or Parquet metadata. The W&B key becomes
WANDB_API_KEY the same way.
"""
from __future__ import annotations

import json
import os

from prefect.blocks.system import Secret

ENV_NAMES = {"aws_access_key_id": "AWS_ACCESS_KEY_ID", "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
             "aws_session_token": "AWS_SESSION_TOKEN", "region_name": "AWS_DEFAULT_REGION",
             "endpoint_url": "AWS_ENDPOINT_URL"}


def export_store_credentials(block_name: str) -> list[str]:
    """Load the Secret block and export its values; returns the variable names set (never the values)."""
    value = Secret.load(block_name).get()
    fields = json.loads(value) if isinstance(value, str) else dict(value)
    unknown = sorted(set(fields) - set(ENV_NAMES))
    if unknown:
        raise ValueError(f"store.credentials_block {block_name!r} has unknown keys {unknown}; use "
                         f"{sorted(ENV_NAMES)}")
    for key, val in fields.items():
        os.environ[ENV_NAMES[key]] = str(val)
    return [ENV_NAMES[key] for key in fields]


def export_wandb_key(block_name: str) -> str:
    """Load the W&B API key from the Secret block into WANDB_API_KEY; returns the variable's name (never the key)."""
    value = Secret.load(block_name).get()
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"logger.wandb.secret_block {block_name!r} must hold the W&B API key as a string")
    os.environ["WANDB_API_KEY"] = value.strip()
    return "WANDB_API_KEY"
