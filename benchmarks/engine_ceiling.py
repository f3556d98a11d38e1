"""The most requests/s the server's group commit could reach on this machine: the engine alone
(no HTTP, no clients on the machine) applying `server.py`'s requests, 75 attribute objects
each creating its own user, in batches of N requests, into one store that grows as it goes.

    cd /work/main && uv run python benchmarks/engine_ceiling.py [--requests 1,64,256,1024,4096] [--batches 5]

The server answers a request once its batch is durable (`docs/server.md`), so its rate is at
most what `Workspace.apply` does with batches of the size the writer sees, and 64 clients in a
closed loop see batches of at most 64. Prints, per batch size: the median batch's wall and CPU
time, requests/s and objects/s, CPU microseconds per object, and how far the best rate is from
issue 10's 1,000 requests/s. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from server import OBJECTS, TARGET_RPS, body

console = Console()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", default="1,64,256,1024,4096", help="batch sizes in requests, comma-separated")
    ap.add_argument("--batches", type=int, default=5, help="batches applied at each size (the median is shown)")
    ap.add_argument("--work", type=Path, default=None, help="where the store goes (default: a temporary folder)")
    args = ap.parse_args()
    from engagelake import Workspace

    work = Path(tempfile.mkdtemp(prefix="engine-ceiling-")) if args.work is None else args.work
    store = work / "store"
    shutil.rmtree(store, ignore_errors=True)
    ws = Workspace.open(store, create=True)
    table = Table(title=f"Workspace.apply of track requests ({OBJECTS} new users each), no HTTP")
    for column in ("requests a batch", "wall (median)", "CPU", "requests/s", "objects/s", "CPU µs an object"):
        table.add_column(column, justify="right")
    ws.apply([{"method": "POST", "path": "/users/track", "body": body(1, i)} for i in range(8)])  # warm-up
    made, best = 0, 0.0
    for size in (int(s) for s in args.requests.split(",")):
        walls, cpus = [], []
        for _ in range(args.batches):
            batch = [{"method": "POST", "path": "/users/track", "body": body(0, made + i)} for i in range(size)]
            made += size
            started, cpu = time.perf_counter(), time.process_time()
            responses = ws.apply(batch)
            walls.append(time.perf_counter() - started)
            cpus.append(time.process_time() - cpu)
            refused = [r for r in responses if r.status != 201]
            if refused:
                raise SystemExit(f"a request was refused: {refused[0]}")
        wall, cpu = statistics.median(walls), statistics.median(cpus)
        best = max(best, size / wall)
        table.add_row(f"{size:,}", f"{wall * 1000:,.0f} ms", f"{cpu * 1000:,.0f} ms", f"{size / wall:,.0f}",
                      f"{size * OBJECTS / wall:,.0f}", f"{cpu / (size * OBJECTS) * 1e6:,.1f}")
        ws.store.wait_for_merges()  # each size starts without the last one's merges running
    ws.close()
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    console.print(table)
    console.print(f"best: {best:,.0f} requests/s ({best * OBJECTS:,.0f} objects/s); issue 10's target "
                  f"{TARGET_RPS:,} requests/s is {TARGET_RPS / best:.2f}x that")


if __name__ == "__main__":
    main()
