"""The `hybrid` console script: `hybrid train [--config FILE] [flags]`, `hybrid plan [--config FILE] [flags]` and the
small commands (`rollouts`, `deploy`, `serve-reward`).

Owns the command line: parsing into RunConfig, the preflight refusal (one message, exit 2, before Ray or Prefect
start) and running the `rl-train` flow on Prefect's embedded server unless PREFECT_API_URL points elsewhere.
"""
from __future__ import annotations

import os
import sys

USAGE = """usage: hybrid train [--run_id ID] [--config FILE.yaml] [--<namespace>.<flag> VALUE ...]
       hybrid train --resume RUN_DIR [--train.max_steps N] [--train.stage_timeout_s S] [--train.stage_retries N]
                                     [--train.retry_delay_s S]
       hybrid plan [--config FILE.yaml] [flags]
       hybrid rollouts RUN_DIR [--step K] [--stage rollout|reward|advantage|metrics] [--head N]
       hybrid deploy
       hybrid serve-reward --reward-func FILE.py --port P [--host 127.0.0.1] [--path /get_reward] [--max-body-mib 16]

  train   run the rl-train flow (refuses unimplemented flags and missing hardware first)
  plan    validate the configuration and print the placement and per-GPU memory, without starting anything
  rollouts  print per-step summaries and samples of a run's datasets
  deploy  register the deployments of prefect.yaml with the Prefect server (`prefect deploy --all`)
  serve-reward  serve a reward file's reward_func over HTTP, for --reward.remote_url http://HOST:P/PATH
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
    from hybrid_core.plan.gpu_probe import gpu_memory_gib
    from hybrid_core.plan.report import ASSUMED_GPU_GIB, render_plan

    cfg, error = _parse(argv)
    if error:
        return _fail(error)
    found = gpu_memory_gib()
    print(render_plan(cfg, found or ASSUMED_GPU_GIB, is_gpu_assumed=not found))
    return 0


def _take(argv: list[str], flag: str) -> tuple[str | None, list[str]]:
    """Remove `flag VALUE` (or `flag=VALUE`) from argv; returns (VALUE or None, the rest)."""
    for i, token in enumerate(argv):
        if token == flag and i + 1 < len(argv):
            return argv[i + 1], argv[:i] + argv[i + 2:]
        if token.startswith(flag + "="):
            return token.split("=", 1)[1], argv[:i] + argv[i + 1:]
    return None, argv


def _resume_config(run_dir: str, argv: list[str]):
    """The run's saved configuration (with the flags a resume may change), refused when it no longer matches the
    manifest."""
    from hybrid_core.data.rollout_store import ManifestError, RolloutStore
    from hybrid_core.flags import RESUME_CHANGEABLE, config_differences

    changeable = tuple(f"--{path}" for path in RESUME_CHANGEABLE if path != "store.root")
    extra = [t for t in argv if t.startswith("--") and t.split("=", 1)[0] not in changeable]
    if extra:
        return None, f"hybrid train --resume takes only {', '.join(changeable)}: got {' '.join(extra)}"
    store = RolloutStore(run_dir.rstrip("/"))
    if not store.exists("manifest.json"):
        return None, f"--resume: no run at {run_dir!r} (no manifest.json); give the directory of a run"
    try:
        saved = store.manifest().get("config")
    except ManifestError as err:
        return None, f"--resume refused: {err}"
    if saved is None or not store.exists("config.yaml"):
        return None, f"--resume refused: {store.damaged('it holds no configuration')}"
    parent = run_dir.rstrip("/").rsplit("/", 1)[0] if "/" in run_dir.rstrip("/") else "."
    cfg, error = _parse_saved(store.fs.cat_file(f"{store.root}/config.yaml"), [*argv, "--store.root", parent])
    if error:
        return None, error
    if differing := config_differences(saved | {"store": {"root": parent}}, cfg):
        return None, "--resume refused: the saved configuration was changed: " + "; ".join(differing)
    return cfg, None


def _parse_saved(config_yaml: bytes, argv: list[str]):
    """`_parse` of a run's saved config.yaml (written to a temporary file, removed after parsing) and ARGV."""
    import tempfile

    with tempfile.NamedTemporaryFile(prefix="hybrid-resume-", suffix=".yaml") as saved:
        saved.write(config_yaml)
        saved.flush()
        return _parse(["--config", saved.name, *argv])


def _take_wandb_key(argv: list[str]) -> list[str]:
    """`--logger.wandb.key KEY` (the seed's flag) moves the key into WANDB_API_KEY of this process, which the run's
    processes inherit; only `offline` stays a flag. The key is never part of the configuration."""
    key, rest = _take(argv, "--logger.wandb.key")
    if key is None or key.lower() in ("offline", "none", "null"):
        return argv
    os.environ["WANDB_API_KEY"] = key
    return rest


def _train_config(argv: list[str]):
    """(config, run id, is_resume, error) of `hybrid train ARGS`."""
    from flows.run_names import default_run_id

    argv = _take_wandb_key(argv)
    run_id, argv = _take(argv, "--run_id")
    resume_dir, argv = _take(argv, "--resume")
    if resume_dir:
        cfg, error = _resume_config(resume_dir, argv)
        return cfg, resume_dir.rstrip("/").rsplit("/", 1)[-1], True, error
    cfg, error = _parse(argv)
    return cfg, run_id or (default_run_id(cfg) if cfg else None), False, error


def train_command(argv: list[str]) -> int:
    from hybrid_core.plan.gpu_probe import count_gpus, gpu_memory_gib
    from hybrid_core.plan.preflight import refusal, run_problems
    from hybrid_core.types import run_dir_of

    cfg, run_id, is_resume, error = _train_config(argv)
    if error:
        return _fail(error)
    # on a Ray cluster the flow counts the cluster's GPUs; a Secret block's store credentials load in the flow
    num_gpus = None if os.environ.get("RAY_ADDRESS") else count_gpus()
    problems = run_problems(cfg, run_dir_of(cfg.store.root, run_id), num_gpus, gpu_memory_gib(),
                            must_exist=is_resume, can_reach_store=not cfg.store.credentials_block)
    if problems:
        return _fail(refusal(problems))
    return _run_flow(cfg, run_id, is_resume)


def _run_flow(cfg, run_id: str, is_resume: bool) -> int:
    """The `rl-train` flow, on Prefect's embedded server unless PREFECT_API_URL names one (the embedded server
    does not outlive this process, however it ends)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.embedded_server import embedded_api
    from flows.rl_train import rl_train
    from hybrid_core.types import PermanentError

    try:
        with embedded_api():
            result = rl_train(cfg, run_id=run_id, resume=is_resume)
    except PermanentError as err:  # the run cannot go on as it is: say why and what to do, without a traceback
        return _fail(f"hybrid train stopped: {err}")
    print(f"run data: {result.run_dir}")
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


SERVE_REWARD_USAGE = ("usage: hybrid serve-reward --reward-func FILE.py --port P [--host 127.0.0.1] "
                      "[--path /get_reward] [--max-body-mib 16]")


def _serve_options(options: dict):
    """ServeOptions from the parsed `--flag VALUE` strings, or the refusal."""
    from hybrid_core.rewards.reward_server import ServeOptions

    port, max_body = options["--port"], options["--max-body-mib"]
    if not port.isdigit() or int(port) > 65535:
        return None, f"hybrid serve-reward: --port must be a port number 0-65535: got {port!r}"
    try:
        max_body_mib = float(max_body)
    except ValueError:
        max_body_mib = 0.0
    if not 0 < max_body_mib < float("inf"):  # NaN too
        return None, f"hybrid serve-reward: --max-body-mib must be a number of MiB > 0: got {max_body!r}"
    return ServeOptions(host=options["--host"], port=int(port), path=options["--path"], max_body_mib=max_body_mib), None


def serve_reward_command(argv: list[str]) -> int:
    """Serve a reward file as an OpenRLHF reward server until interrupted (port 0: a free port, printed)."""
    from hybrid_core.rewards.reward_server import DEFAULT_HOST, DEFAULT_MAX_BODY_MIB, DEFAULT_PATH, serve

    options = {"--reward-func": None, "--port": None, "--host": DEFAULT_HOST, "--path": DEFAULT_PATH,
               "--max-body-mib": f"{DEFAULT_MAX_BODY_MIB:g}"}
    rest = list(argv)
    for flag in options:
        value, rest = _take(rest, flag)
        options[flag] = value if value is not None else options[flag]
    if rest or options["--reward-func"] is None or options["--port"] is None:
        return _fail(f"{SERVE_REWARD_USAGE}\n(got: {' '.join(argv) or 'no arguments'})")
    settings, error = _serve_options(options)
    if error:
        return _fail(error)
    try:
        serve(options["--reward-func"], settings)
    except (FileNotFoundError, ValueError, SyntaxError, ImportError, OSError) as err:
        return _fail(f"hybrid serve-reward cannot start: {type(err).__name__}: {err}")
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from flows.rollouts_cli import rollouts_command

    commands = {"train": train_command, "plan": plan_command, "deploy": deploy_command, "rollouts": rollouts_command,
                "serve-reward": serve_reward_command}
    if not argv or argv[0] not in commands:
        print(USAGE, file=sys.stderr)
        return 2 if argv and argv[0] not in ("-h", "--help") else 0
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
