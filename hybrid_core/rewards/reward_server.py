"""`hybrid serve-reward`: any reward file served as an OpenRLHF reward server (a Starlette app on uvicorn).

POST <path> {"query": [...], "prompts": [...], "labels": [...]} answers {"rewards", "scores", "extra_logs"} with what
the file's `reward_func` returned, tensors and arrays turned into lists (its output is checked by the client, which
names the server and the batch: the server does not second-guess it). A malformed request is answered 400 with the
reason; the function raising, 500 with its error. GET /health answers 200. Requests are served concurrently: the
function runs in worker threads, so it must be safe to call from several threads at once (pure functions are).
It knows nothing of Ray, the store or the configuration.
"""
from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Callable

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PATH = "/get_reward"


def jsonable(value):
    """Tensors, numpy arrays and scalars as lists and Python numbers, inside lists, tuples and dicts too."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def request_problem(payload) -> str | None:
    """Why a request body is not {"query": [str, ...], "prompts": [...], "labels": [...]} (None when it is)."""
    if not isinstance(payload, dict):
        return f"the body must be a JSON object with 'query', 'prompts' and 'labels': got {type(payload).__name__}"
    missing = [key for key in ("query", "prompts", "labels") if key not in payload]
    if missing:
        return f"the body lacks {', '.join(repr(k) for k in missing)}; send 'query', 'prompts' and 'labels' lists"
    for key in ("query", "prompts", "labels"):
        if not isinstance(payload[key], list):
            return f"{key!r} must be a list: got {type(payload[key]).__name__}"
    if not all(isinstance(q, str) for q in payload["query"]):
        return "'query' must be a list of strings"
    lengths = {key: len(payload[key]) for key in ("query", "prompts", "labels")}
    if len(set(lengths.values())) > 1:
        return f"'query', 'prompts' and 'labels' must have one entry per sample: got lengths {lengths}"
    return None


def build_app(reward_func: Callable, path: str = DEFAULT_PATH, source: str = "reward_func"):
    """The ASGI app answering POST `path` with `reward_func` and GET /health."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    async def get_reward(request: Request) -> Response:
        try:
            payload = json.loads(await request.body())
        except ValueError as err:
            return PlainTextResponse(f"the body is not JSON: {err}", status_code=400)
        if problem := request_problem(payload):
            return PlainTextResponse(problem, status_code=400)
        try:
            out = await run_in_threadpool(reward_func, payload["query"], payload["prompts"], payload["labels"])
        except Exception as err:  # the user's code: any exception is the answer
            return PlainTextResponse(f"{source} raised {type(err).__name__}: {err}", status_code=500)
        # NaN and inf pass through (as JSON's NaN/Infinity), so the client can name the sample
        body = json.dumps(jsonable(out), allow_nan=True)
        return Response(body, media_type="application/json")

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "serves": source})

    routes = [Route(path, get_reward, methods=["POST"]), Route("/health", health, methods=["GET"])]
    return Starlette(routes=routes)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free port, read back from the socket)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def served_url(sock: socket.socket, path: str) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"


def uvicorn_server(app, log_level: str = "warning"):
    """A uvicorn server for `app` (run it with `.run(sockets=[sock])`; `.should_exit = True` stops it)."""
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off", timeout_graceful_shutdown=5)
    return uvicorn.Server(config)


def file_app(reward_file: str, path: str = DEFAULT_PATH):
    """The app serving `reward_file`'s reward_func on POST `path`."""
    from hybrid_core.rewards.reward_func import load_reward_func

    if not path.startswith("/"):
        raise ValueError(f"--path must start with '/': got {path!r}")
    if not Path(reward_file).is_file():
        raise FileNotFoundError(f"--reward-func {reward_file!r}: no such file; give a .py file defining "
                                f"reward_func(queries, prompts, labels, **kwargs)")
    return build_app(load_reward_func(reward_file), path, source=f"reward_func of {reward_file}")


def serve(reward_file: str, host: str = DEFAULT_HOST, port: int = 0, path: str = DEFAULT_PATH) -> None:
    """Serve `reward_file`'s reward_func until interrupted; prints the URL it serves on."""
    app = file_app(reward_file, path)
    sock = bind(host, port)
    print(f"serving reward_func of {reward_file} on {served_url(sock, path)} (GET /health)", flush=True)
    uvicorn_server(app).run(sockets=[sock])
