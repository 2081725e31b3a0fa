"""A real S3-compatible server (moto's) on loopback for the unit tests that need one, as pytest fixtures: import them
into the test module (`from tests.unit.moto_fixtures import moto_url, s3_options`). Not a conftest.py: the integration
tests import their conftest by the bare name `conftest`, which a second one would shadow."""
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_url():
    port = _free_port()
    exe = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # localhost must not go via a proxy
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                opener.open(url, timeout=1)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not answer on {url}")
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def s3_options(moto_url):
    import boto3

    boto3.client("s3", endpoint_url=moto_url, aws_access_key_id="x", aws_secret_access_key="y",
                 region_name="us-east-1").create_bucket(Bucket="bucket")
    return {"client_kwargs": {"endpoint_url": moto_url}, "key": "x", "secret": "y"}


