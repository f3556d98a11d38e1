"""What a small batch costs the process, its share of run merges counted: issue 57's first two
figures (process CPU of one 1-request and of one 64-request batch, 75 objects a request).

    cd /work/main && uv run python benchmarks/small_batches.py [--requests 1,64] [--batches 40] [--work DIR]
        [--layer both|on|off]

Applies `--batches` batches of N `/users/track` requests (`server.py`'s bodies: 75 attribute
objects, each a new user) to one store, after a warm-up, and prints per size: process CPU per
batch (`time.process_time` over all of them, the merge thread's included, the last merges
waited for), wall p50 and p99 of `apply`, the run merges they caused and the merges' own wall
time. `--layer both` (the default) measures each size twice in one run, on a store of its own:
a Delta commit per batch, and the in-memory layer (`store/layer.py`: the batch answered once its
log record is synced, every batch written at a flush, whose CPU counts), and prints the ratio.
`ENGAGELAKE_SYNC=0` before the command measures without syncing. Prints figures; asserts
nothing.
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

from server import OBJECTS, body

console = Console()


def measure(ws: object, size: int, batches: int, first: int) -> tuple[float, list[float], list[tuple[str, int, float]]]:
    """Process CPU a batch (flushes and merges counted), the walls of `apply`, the merges made."""
    from engagelake import Workspace

    assert isinstance(ws, Workspace)
    merges_before = len(ws.store.merges)
    walls = []
    cpu = time.process_time()
    for n in range(batches):
        batch = [{"method": "POST", "path": "/users/track", "body": body(0, first + n * size + i)} for i in range(size)]
        started = time.perf_counter()
        responses = ws.apply(batch)
        walls.append(time.perf_counter() - started)
        if any(r.status != 201 for r in responses):
            raise SystemExit(f"a request was refused: {next(r for r in responses if r.status != 201)}")
    ws.flush()
    ws.store.wait_for_merges()
    cpu = time.process_time() - cpu
    return cpu / batches, sorted(walls), ws.store.merges[merges_before:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", default="1,64", help="batch sizes in requests, comma-separated")
    ap.add_argument("--batches", type=int, default=40, help="batches applied at each size")
    ap.add_argument("--work", type=Path, default=None, help="where the store goes (default: a temporary folder)")
    ap.add_argument("--layer", choices=("both", "on", "off"), default="both",
                    help="the in-memory layer: off (a commit per batch), on, or both in one run")
    args = ap.parse_args()
    from engagelake import Workspace

    work = Path(tempfile.mkdtemp(prefix="small-batches-")) if args.work is None else args.work
    modes = {"both": ["off", "on"], "on": ["on"], "off": ["off"]}[args.layer]
    spaces = {}
    for mode in modes:
        store = work / f"store-{mode}"
        shutil.rmtree(store, ignore_errors=True)
        spaces[mode] = Workspace.open(store, create=True, layer=mode == "on")
        for warm in range(8):  # warm-up: the tables' first files, a merge or two
            spaces[mode].apply([{"method": "POST", "path": "/users/track", "body": body(1, warm)}])
        spaces[mode].flush()
        spaces[mode].store.wait_for_merges()
    table = Table(title=f"Workspace.apply of small track batches ({OBJECTS} new users a request)")
    for column in ("requests a batch", "layer", "CPU a batch (merges, flushes counted)", "ratio to no layer",
                   "wall p50", "wall p99", "merges", "merge wall a batch"):
        table.add_column(column, justify="right")
    made = 0
    for size in (int(s) for s in args.requests.split(",")):
        cpus = {}
        for mode in modes:  # the same batches, one store after the other, in one run
            cpu, walls, merges = measure(spaces[mode], size, args.batches, made)
            cpus[mode] = cpu
            ratio = f"{cpu / cpus['off']:.2f}" if "off" in cpus and mode != "off" else ""
            table.add_row(f"{size:,}", mode, f"{cpu * 1e3:,.1f} ms", ratio, f"{statistics.median(walls) * 1e3:,.1f} ms",
                          f"{walls[min(len(walls) - 1, int(len(walls) * 0.99))] * 1e3:,.1f} ms", f"{len(merges)}",
                          f"{sum(s for _, _, s in merges) / args.batches * 1e3:,.1f} ms")
        made += size * args.batches
    for ws in spaces.values():
        ws.close()
    console.print(table)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
