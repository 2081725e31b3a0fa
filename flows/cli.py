"""The `hybrid` console script: `hybrid train [--config FILE] [flags]` and `hybrid plan [--config FILE] [flags]`.

Owns the command line: parsing into RunConfig, the preflight refusal (one message, exit 2, before Ray or Prefect
start) and running the `rl-train` flow on Prefect's embedded server unless PREFECT_API_URL points elsewhere.
"""
from __future__ import annotations

import os
import sys

USAGE = """usage: hybrid {train,plan} [--config FILE.yaml] [--<namespace>.<flag> VALUE ...]
       hybrid deploy

  train   run the rl-train flow (refuses unimplemented flags and missing hardware first)
  plan    validate the configuration and print the placement, without starting anything
  deploy  register the deployments of prefect.yaml with the Prefect server (`prefect deploy --all`)
"""


def _fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 2


def _parse(argv: list[str]):
    from hybrid_core.flags import ConfigError, parse_cli

    try:
        return parse_cli(argv), None
    except ConfigError as err:
        return None, "invalid configuration:\n" + "\n".join(f"  - {p}" for p in err.problems)
    except (FileNotFoundError, ValueError) as err:
        return None, f"invalid configuration: {err}"


def plan_command(argv: list[str]) -> int:
    from hybrid_core.plan import render_plan

    cfg, error = _parse(argv)
    if error:
        return _fail(error)
    print(render_plan(cfg))
    return 0


def train_command(argv: list[str]) -> int:
    from hybrid_core.plan import count_gpus, preflight_problems

    cfg, error = _parse(argv)
    if error:
        return _fail(error)
    problems = preflight_problems(cfg, count_gpus())
    if problems:
        return _fail("hybrid train cannot start:\n" + "\n".join(f"  - {p}" for p in problems))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.rl_train import rl_train

    result = rl_train(cfg)
    print(f"run data: {result['run_dir']}")
    return 0


def deploy_command(argv: list[str]) -> int:
    """`prefect deploy --all` from the directory that holds prefect.yaml (the repository root)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if not (root / "prefect.yaml").is_file():
        return _fail(f"prefect.yaml not found in {root}; run hybrid deploy from a checkout of this repository")
    prefect = Path(sys.executable).with_name("prefect")
    return subprocess.run([str(prefect), "--no-prompt", "deploy", "--all", *argv], cwd=root).returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"train": train_command, "plan": plan_command, "deploy": deploy_command}
    if not argv or argv[0] not in commands:
        print(USAGE, file=sys.stderr)
        return 2 if argv and argv[0] not in ("-h", "--help") else 0
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
