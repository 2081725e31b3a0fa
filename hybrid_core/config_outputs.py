"""Where a run's data and figures go: the run store (`--store.*`) and the loggers (`--logger.*`, W&B's
`--logger.wandb.*`).

Part of the configuration tree of `config.py`, which re-exports these names; pydantic only, no torch or Ray.
"""
from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, WithJsonSchema

from hybrid_core.config_blocks import ConfigBlock


# What a flow parameter's `logger.wandb.key` may be, for Prefect's server: a deployment run whose parameters hold a
# key is refused before the server stores them, and jsonschema's `const` message ("'offline' was expected") does not
# repeat the value, as its enum, anyOf and pattern messages would. Pydantic still takes any string, so that the rule
# in config_rules refuses a key without showing it (pydantic's own errors carry their input).
WANDB_KEY_SCHEMA = {"anyOf": [{"const": "offline", "type": "string"}, {"type": "null"}]}


class WandbConfig(ConfigBlock):
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset({"key", "secret_block", "org", "group", "project", "run_name"})
    key: Annotated[str | None, WithJsonSchema(WANDB_KEY_SCHEMA)] = Field(
        None, description="`offline` keeps W&B local; an API key is accepted only on the hybrid train command line, "
        "which moves it into WANDB_API_KEY (a key here would be stored)")
    secret_block: str | None = Field(None, description="PROJECT: Prefect Secret block holding the W&B API key")
    org: str | None = Field(None, description="W&B entity")
    group: str | None = Field(None, description="W&B group")
    project: str = Field("openrlhf_train_ppo", description="W&B project")
    run_name: str | None = Field(None, description="W&B run name")


class LoggerConfig(ConfigBlock):
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset({"logging_steps", "tensorboard_dir"})
    logging_steps: int = Field(1, gt=0, description="log every N steps")
    tensorboard_dir: str | None = Field(None, description="TensorBoard directory")
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="W&B settings")


class StoreConfig(ConfigBlock):
    IMPLEMENTED: ClassVar[frozenset[str]] = frozenset({"root", "credentials_block"})
    root: str = Field("runs", description="PROJECT: run store, a local dir or s3://bucket/prefix")
    credentials_block: str | None = Field(None, description="PROJECT: Prefect Secret block with the object store's "
                                          "credentials (JSON: aws_access_key_id, aws_secret_access_key, …)")
