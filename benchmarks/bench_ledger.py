"""Compaction of a store whose ledger is long: its memory must follow the memory budget, not the
number of batches ever committed.

    cd /work/main && uv run python benchmarks/bench_ledger.py [--batches 2000000]

The ledger holds a row per batch: the server's group commit makes a few a second (about 260,000
a day). This builds a small store (100 users), then appends `--batches` ledger rows as such
batches leave them (no stored responses, the head's table versions), and times `engagelake
check`, then `engagelake compact`, each in a fresh process: wall time and peak RSS. Asserts
nothing.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
from deltalake import DeltaTable, write_deltalake
from rich.console import Console
from rich.table import Table

from engagelake import Workspace

RUN = """
import json, resource, subprocess, sys, time
t = time.perf_counter()
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(json.dumps({"s": time.perf_counter() - t,
                  "rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))
"""
CHUNK = 250_000  # ledger rows appended at once


def build(store: Path, batches: int) -> None:
    ws = Workspace.open(store, seed="bench-ledger")
    ws.call("POST", "/users/track", {"attributes": [{"external_id": f"u{i}", "plan": "pro"} for i in range(75)]})
    ws.call("POST", "/users/track", {"attributes": [{"external_id": f"v{i}", "plan": "free"} for i in range(25)]})
    ledger = str(store / "_ledger")
    head = pl.from_arrow(DeltaTable(ledger).to_pyarrow_table())
    assert isinstance(head, pl.DataFrame)
    last = head.sort("batch_no").tail(1)
    first = int(last["batch_no"].item()) + 1
    for start in range(first, first + batches, CHUNK):
        n = min(CHUNK, first + batches - start)
        rows = pl.concat([last] * n).with_columns(batch_no=pl.int_range(start, start + n, dtype=pl.Int64),
                                                  batch_key=pl.lit(None, pl.String), kind=pl.lit("batch"))
        write_deltalake(ledger, rows.to_arrow(), mode="append")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=2_000_000, help="ledger rows appended (batches committed)")
    args = ap.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory(prefix="engagelake-bench-ledger-") as tmp:
        store = Path(tmp) / "store"
        started = time.perf_counter()
        build(store, args.batches)
        console.print(f"built a store with {args.batches:,} ledger rows in {time.perf_counter() - started:.1f} s")
        cli = str(Path(sys.executable).parent / "engagelake")
        figures = {}
        for command in ("check", "compact"):
            out = subprocess.run([sys.executable, "-c", RUN, cli, command, "--store", str(store)],
                                 check=True, capture_output=True, text=True)
            figures[command] = json.loads(out.stdout.strip().splitlines()[-1])
        rows = DeltaTable(str(store / "_ledger")).to_pyarrow_table(columns=["batch_no"]).num_rows
    table = Table(title=f"a store of {args.batches:,} batches")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for command, measured in figures.items():
        table.add_row(f"engagelake {command}: wall time", f"{measured['s']:.1f} s")
        table.add_row(f"engagelake {command}: peak RSS", f"{measured['rss'] / 2**20:,.0f} MiB")
    table.add_row("ledger rows after", f"{rows:,}")
    table.add_row("this process's peak RSS (the build)", f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB")
    console.print(table)


if __name__ == "__main__":
    main()
