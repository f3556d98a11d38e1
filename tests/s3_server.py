"""A real S3 server for the tests of stores on object storage: moto's, started as a process of
its own on the loopback (delta-rs holds the GIL while it waits on a request, so a server in a
thread of the test process would never answer). Credentials, region and endpoint reach
delta-rs, Polars and pyarrow through the environment, as they would on a worker
(`docs/object-storage.md`). Use with `pytest_plugins = ["tests.s3_server"]`."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator

import pytest

BUCKET = "engagelake-tests"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def s3() -> Iterator[Callable[[], str]]:
    """A moto S3 server with one bucket, the environment pointing at it; gives a new store URI
    (a prefix of its own) per call."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError("moto's S3 server did not start")
        with pytest.MonkeyPatch.context() as env:
            for name, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
                                "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}.items():
                env.setenv(name, value)
            import boto3

            boto3.client("s3").create_bucket(Bucket=BUCKET)
            yield lambda: f"s3://{BUCKET}/{uuid.uuid4().hex}"
    finally:
        server.terminate()
        server.wait(timeout=10)
