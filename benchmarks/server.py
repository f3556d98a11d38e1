"""Benchmark the REST server: C concurrent connections send `/users/track` requests of 75
attribute objects each for S seconds, with rate limits off, to a real `engagelake serve`
process on a fresh store.

    cd /work/main && uv run python benchmarks/server.py [--connections 64] [--seconds 20] [--client raw]
        [--no-layer]

The load generator shares the machine with the server: `--client raw` (the default) writes
keep-alive HTTP/1.1 on asyncio streams and takes about 0.02 of a core; `--client httpx` took
0.4 of the 2 cores at 128 requests/s. Prints requests/s, objects/s, p50/p99 latency, non-2xx answers and the server's peak RSS; then
checks, by export over HTTP, that a sample of the acknowledged objects is stored (every object
creates its own user, so each is found or lost), and prints the latency of one export at idle.
Target on the 2-core machine (issue 10): >= 1,000 requests/s, p99 <= 500 ms, 0 lost. Prints
figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import orjson
from rich.console import Console
from rich.table import Table

OBJECTS = 75
TARGET_RPS = 1_000
TARGET_P99_MS = 500.0
SAMPLE = 500  # acknowledged objects checked by export

console = Console()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def peak_rss(pid: int) -> int:
    """The peak resident set of a process (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def body(connection: int, number: int) -> bytes:
    """One request: 75 attribute objects, each creating its own user."""
    return orjson.dumps({"attributes": [
        {"external_id": f"c{connection}-r{number}-o{j}", "email": f"c{connection}.{number}.{j}@example.com",
         "plan": "pro" if j % 3 else "free", "request": number, "visits": {"inc": 1}}
        for j in range(OBJECTS)]})


async def load(base: str, key: str, connections: int, seconds: float,
               client: str = "raw") -> tuple[list[float], list[int], list[str]]:
    """Each connection sends requests one after another until the time is up: latencies (ms),
    statuses, and the external IDs of the objects acknowledged with 201."""
    send = _raw_connection if client == "raw" else _httpx_connection
    latencies: list[float] = []
    statuses: list[int] = []
    acknowledged: list[str] = []
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=120) as pool:
        async def run(c: int) -> None:
            post = await send(base, key, pool)
            try:
                n = 0
                while time.perf_counter() < deadline:
                    content = body(c, n)
                    started = time.perf_counter()
                    status = await post(content)
                    latencies.append((time.perf_counter() - started) * 1000)
                    statuses.append(status)
                    if status == 201:
                        acknowledged.append(f"c{c}-r{n}-o{random.randrange(OBJECTS)}")
                    n += 1
            finally:
                await post(None)

        await asyncio.gather(*(run(c) for c in range(connections)))
    return latencies, statuses, acknowledged


Post = Callable[[bytes | None], Awaitable[int]]  # send a body, get the status (None: close)


async def _httpx_connection(base: str, key: str, pool: httpx.AsyncClient) -> Post:
    """A request through httpx's pool (3-4 ms of the load generator's CPU a request)."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    async def post(content: bytes | None) -> int:
        if content is None:
            return 0
        return (await pool.post("/users/track", content=content, headers=headers)).status_code
    return post


async def _raw_connection(base: str, key: str, pool: httpx.AsyncClient) -> Post:
    """One keep-alive HTTP/1.1 connection of its own, written and read with asyncio streams, as
    `wrk` does: the load generator shares the machine's two cores with the server, and httpx
    took 0.43 of them at 128 requests/s, so it would have needed more cores than there are to
    send 1,000 requests/s."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (f"POST /users/track HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
            "Content-Type: application/json\r\nContent-Length: ").encode()

    async def post(content: bytes | None) -> int:
        if content is None:
            writer.close()
            return 0
        writer.write(b"%s%d\r\n\r\n%s" % (head, len(content), content))
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        length, chunked = 0, False
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
            elif name.strip().lower() == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if chunked:  # not what the server sends for JSON, but a load generator must not hang on it
            while (size := int((await reader.readline()).split(b";")[0], 16)) > 0:
                await reader.readexactly(size + 2)
            await reader.readline()
        else:
            await reader.readexactly(length)
        return int(status_line.split()[1])
    return post


def check_stored(client: httpx.Client, key: str, ids: list[str]) -> int:
    """How many of `ids` an export does not find (lost acknowledged objects)."""
    found = 0
    for start in range(0, len(ids), 50):
        part = ids[start:start + 50]
        r = client.post("/users/export/ids", headers={"Authorization": f"Bearer {key}"},
                        content=orjson.dumps({"external_ids": part, "fields_to_export": ["external_id"]}))
        found += len(r.json().get("users", []))
    return len(ids) - found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--client", choices=["raw", "httpx"], default="raw",
                    help="the load generator: raw keep-alive HTTP/1.1 on asyncio streams (light), or httpx")
    ap.add_argument("--store", type=Path, default=None, help="a fresh store folder (default: a temporary one)")
    ap.add_argument("--no-access-log", action="store_true", help="serve with --no-access-log")
    ap.add_argument("--no-layer", action="store_true",
                    help="serve with --no-layer: a Delta commit per batch, no write-ahead log (issue 57's baseline)")
    args = ap.parse_args()
    temporary = None if args.store else Path(tempfile.mkdtemp(prefix="engagelake-server-"))
    store = args.store or temporary / "store"
    cli = [str(Path(sys.executable).with_name("engagelake"))]  # the installed command
    created = subprocess.run([*cli, "keys", "create", "--store", str(store), "--name", "bench",
                              "--permissions", "users.track,users.export.ids"],
                             check=True, capture_output=True, text=True)
    key = created.stdout.strip().splitlines()[-1]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    quiet = (["--no-access-log"] if args.no_access_log else []) + (["--no-layer"] if args.no_layer else [])
    server = subprocess.Popen([*cli, "serve", "--store", str(store), "--port", str(port), "--rate-limits", "off", *quiet],
                              stdout=subprocess.DEVNULL, stderr=(store.parent / "server.log").open("wb"))
    try:
        with httpx.Client(base_url=base, timeout=120) as client:
            for _ in range(600):
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            console.print(f"server up on {base}; {args.connections} connections for {args.seconds:g} s, "
                          f"{OBJECTS} attribute objects per request")
            started = time.perf_counter()
            cpu_before = (cpu_seconds(server.pid), cpu_seconds(os.getpid()))
            latencies, statuses, acknowledged = asyncio.run(load(base, key, args.connections, args.seconds, args.client))
            elapsed = time.perf_counter() - started
            server_cpu, client_cpu = (cpu_seconds(pid) - before
                                      for pid, before in zip((server.pid, os.getpid()), cpu_before, strict=True))
            sample = random.Random(7).sample(acknowledged, min(SAMPLE, len(acknowledged)))
            lost = check_stored(client, key, sample)
            idle = []
            for external_id in sample[:20]:
                t = time.perf_counter()
                client.post("/users/export/ids", headers={"Authorization": f"Bearer {key}"},
                            content=orjson.dumps({"external_ids": [external_id], "fields_to_export": ["external_id"]}))
                idle.append((time.perf_counter() - t) * 1000)
            rss = peak_rss(server.pid)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    ok = sum(1 for s in statuses if 200 <= s < 300)
    rps = len(statuses) / elapsed
    ordered = sorted(latencies)
    p50 = statistics.median(ordered) if ordered else float("nan")
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")
    table = Table("figure", "value", "target", title=f"REST server: {args.connections} connections, {args.client} client, "
                  f"{'no layer' if args.no_layer else 'layer'}")
    table.add_row("requests/s", f"{rps:,.0f} ({len(statuses):,} in {elapsed:.1f} s)", f">= {TARGET_RPS:,}")
    table.add_row("objects/s", f"{ok * OBJECTS / elapsed:,.0f}", "")
    table.add_row("latency p50 / p99", f"{p50:,.0f} / {p99:,.0f} ms", f"p99 <= {TARGET_P99_MS:,.0f} ms")
    table.add_row("non-2xx answers", f"{len(statuses) - ok:,}", "0")
    table.add_row("acknowledged objects lost (sample)", f"{lost} of {len(sample)}", "0")
    table.add_row("one export at idle, p50", f"{statistics.median(idle):,.1f} ms" if idle else "-", "")
    table.add_row("server peak RSS", f"{rss / 1024**2:,.0f} MiB", "")
    # both run on this machine: the cores the load generator takes are not the server's
    table.add_row("CPU cores busy: server / load generator",
                  f"{server_cpu / elapsed:.2f} / {client_cpu / elapsed:.2f} of {os.cpu_count()}", "")
    console.print(table)
    if temporary is not None:  # a run that failed keeps its store and server.log for a look
        shutil.rmtree(temporary, ignore_errors=True)


if __name__ == "__main__":
    main()
