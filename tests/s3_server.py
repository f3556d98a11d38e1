"""A real S3 server for the tests of stores on object storage: moto's, started as a process of
its own on the loopback (delta-rs holds the GIL while it waits on a request, so a server in a
thread of the test process would never answer). Credentials, region and endpoint reach
delta-rs, Polars and pyarrow through the environment, as they would on a worker
(`docs/object-storage.md`). Use with `pytest_plugins = ["tests.s3_server"]`."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

BUCKET = "engagelake-tests"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class S3:
    """The server of the `s3` fixture: called, a new store URI (a prefix of its own); `requests`
    lists the requests it answered so far, from its access log, as (method, path) pairs."""

    def __init__(self, log: Path):
        self.log = log

    def __call__(self) -> str:
        return f"s3://{BUCKET}/{uuid.uuid4().hex}"

    def requests(self) -> list[tuple[str, str]]:
        found = (_REQUEST.search(line) for line in self.log.read_text().splitlines())
        return [(m.group(1), m.group(2)) for m in found if m is not None]

    def settled(self) -> int:
        """How many requests so far, once the log is still (a line lands just after its answer)."""
        count = len(self.requests())
        while True:
            time.sleep(0.05)
            if (now := len(self.requests())) == count:
                return count
            count = now

    def during(self, step: Callable[[], object]) -> tuple[list[tuple[str, str]], float]:
        """The requests the server answered while `step` ran, and its seconds."""
        before = self.settled()
        started = time.perf_counter()
        step()
        seconds = time.perf_counter() - started
        self.settled()
        return self.requests()[before:], seconds


_REQUEST = re.compile(r'"(GET|PUT|HEAD|POST|DELETE) (\S+) HTTP')


def start_moto(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """moto's S3 server as a process on a free loopback port, its access log to `log`; returns
    the process and its endpoint once it answers."""
    port = _free_port()
    with open(log, "wb") as out:  # its access log (one line per request, written as answered)
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=out)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
            return server, endpoint
        except OSError:
            time.sleep(0.05)
    server.terminate()
    raise RuntimeError("moto's S3 server did not start")


def environment(endpoint: str) -> dict[str, str]:
    """The variables that point delta-rs, Polars, pyarrow and boto3 at the server."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    """A moto S3 server with one bucket, the environment pointing at it."""
    log = tmp_path_factory.mktemp("moto") / "requests.log"
    server, endpoint = start_moto(log)
    try:
        with pytest.MonkeyPatch.context() as env:
            for name, value in environment(endpoint).items():
                env.setenv(name, value)
            import boto3

            boto3.client("s3").create_bucket(Bucket=BUCKET)
            yield S3(log)
    finally:
        server.terminate()
        server.wait(timeout=10)
