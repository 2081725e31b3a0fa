"""`hybrid serve-reward`: any reward file served as an OpenRLHF reward server (a Starlette app on uvicorn).

POST <path> {"query": [...], "prompts": [...], "labels": [...]} answers {"rewards", "scores", "extra_logs"} with what
the file's `reward_func` returned, tensors and arrays turned into lists (its output is checked by the client, which
names the server and the batch: the server does not second-guess it). A malformed request (not JSON, nested too
deep, a field missing or not a list of strings, lengths that differ) is answered 400 with the reason; a body over
`--max-body-mib` (16 MiB), 413, refused by its Content-Length before it is read and while a chunked one is read;
the function raising, 500 with its error. GET /health answers 200. Requests are served concurrently: the function
runs in worker threads, so it must be safe to call from several threads at once (pure functions are).
It knows nothing of Ray, the store or the configuration.
"""
from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PATH = "/get_reward"
DEFAULT_MAX_BODY_MIB = 16.0  # 32 samples of 128 KiB (~32k tokens) each is 4 MiB
FIELDS = ("query", "prompts", "labels")
# a refused body is still read, and dropped, up to this many bytes: a client sends its whole body before it reads
# the answer (urllib does), and a socket closed on unread data resets, so it would see a reset, not the 413
MAX_DRAIN_BYTES = 2**30


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    """Where `hybrid serve-reward` listens and what it accepts."""

    host: str = DEFAULT_HOST
    port: int = 0  # 0: a free port, printed
    path: str = DEFAULT_PATH
    max_body_mib: float = DEFAULT_MAX_BODY_MIB

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mib * 2**20)


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
    missing = [key for key in FIELDS if key not in payload]
    if missing:
        return f"the body lacks {', '.join(repr(k) for k in missing)}; send 'query', 'prompts' and 'labels' lists"
    for key in FIELDS:
        if not isinstance(payload[key], list):
            return f"{key!r} must be a list: got {type(payload[key]).__name__}"
        bad = next((i for i, entry in enumerate(payload[key]) if not isinstance(entry, str)), None)
        if bad is not None:
            entry = payload[key][bad]
            return (f"{key!r} must be a list of strings: entry {bad} is {type(entry).__name__} "
                    f"{json.dumps(entry)[:80]}; send every entry as a string")
    lengths = {key: len(payload[key]) for key in FIELDS}
    if len(set(lengths.values())) > 1:
        return f"'query', 'prompts' and 'labels' must have one entry per sample: got lengths {lengths}"
    return None


def too_large(size: str, max_body_bytes: int) -> str:
    mib = max_body_bytes / 2**20
    return (f"the body is {size}, over this server's limit of {max_body_bytes} bytes (--max-body-mib {mib:g}); send "
            "fewer samples a request (--reward.remote_batch_size) or start the server with a larger --max-body-mib")


async def read_body(request, max_body_bytes: int) -> tuple[bytes | None, str | None]:
    """(the body, None), or (None, why it is too large): refused by its Content-Length before reading, and while
    reading a body sent without one (chunked), so a large body is never held whole."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        await _drop(request.stream())
        return None, too_large(f"{int(declared)} bytes (Content-Length)", max_body_bytes)
    chunks, size = [], 0
    stream = request.stream()
    async for chunk in stream:
        size += len(chunk)
        if size > max_body_bytes:
            await _drop(stream)
            return None, too_large(f"over {max_body_bytes} bytes (sent without a Content-Length)", max_body_bytes)
        chunks.append(chunk)
    return b"".join(chunks), None


async def _drop(stream) -> None:
    """Read the rest of a refused body without keeping it, up to MAX_DRAIN_BYTES."""
    dropped = 0
    async for chunk in stream:
        dropped += len(chunk)
        if dropped > MAX_DRAIN_BYTES:
            return


def parse_payload(body: bytes) -> tuple[object, str | None]:
    """(the JSON value, None), or (None, why the body is not one)."""
    try:
        return json.loads(body), None
    except RecursionError:  # the C parser recurses once per level: "[[[[…" a million deep raises it
        return None, "the body nests JSON arrays or objects too deeply to parse; send flat lists of strings"
    except ValueError as err:
        return None, f"the body is not JSON: {err}"


def build_app(reward_func: Callable, path: str = DEFAULT_PATH, source: str = "reward_func",
              max_body_bytes: int = int(DEFAULT_MAX_BODY_MIB * 2**20)):
    """The ASGI app answering POST `path` with `reward_func` and GET /health."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    async def get_reward(request: Request) -> Response:
        body, problem = await read_body(request, max_body_bytes)
        if problem:
            return PlainTextResponse(problem, status_code=413)
        payload, problem = parse_payload(body)
        if problem:
            return PlainTextResponse(problem, status_code=400)
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


def file_app(reward_file: str, options: ServeOptions = ServeOptions()):
    """The app serving `reward_file`'s reward_func on POST `options.path`."""
    from hybrid_core.rewards.reward_func import load_reward_func

    if not options.path.startswith("/"):
        raise ValueError(f"--path must start with '/': got {options.path!r}")
    if not options.max_body_mib > 0:
        raise ValueError(f"--max-body-mib must be a number of MiB > 0: got {options.max_body_mib!r}")
    if not Path(reward_file).is_file():
        raise FileNotFoundError(f"--reward-func {reward_file!r}: no such file; give a .py file defining "
                                f"reward_func(queries, prompts, labels, **kwargs)")
    return build_app(load_reward_func(reward_file), options.path, source=f"reward_func of {reward_file}",
                     max_body_bytes=options.max_body_bytes)


def serve(reward_file: str, options: ServeOptions = ServeOptions()) -> None:
    """Serve `reward_file`'s reward_func until interrupted; prints the URL it serves on."""
    app = file_app(reward_file, options)
    sock = bind(options.host, options.port)
    print(f"serving reward_func of {reward_file} on {served_url(sock, options.path)} (GET /health; bodies up to "
          f"{options.max_body_mib:g} MiB)", flush=True)
    uvicorn_server(app).run(sockets=[sock])
