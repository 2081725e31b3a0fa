"""The `prefect deploy` build step that reads a deployment's parameter set from `deployments/<name>.yaml`.

prefect.yaml names the file; the step returns {"cfg": <the configuration tree>} for `{{ <step id>.cfg }}` (a lone
placeholder keeps the value's type), after validating it as a RunConfig, so a broken set fails `prefect deploy`
with the fields named rather than the first run. It holds no parameters of its own.
"""
from __future__ import annotations

from pathlib import Path


def read_parameters(path: str) -> dict:
    """The parameter set at `path` (relative to the repository root) as the deployment's `cfg`."""
    from hybrid_core.flags import config_from_dict, load_config_file

    file = Path(path) if Path(path).is_absolute() else Path(__file__).resolve().parents[1] / path
    data = load_config_file(file)
    config_from_dict(data)  # a ConfigError names every problem
    return {"cfg": data}
