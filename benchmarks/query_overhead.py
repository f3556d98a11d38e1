"""What bounds a small pass's CPU (issue 57, item 4): Polars' fixed cost per query, and how
many queries a track pass of one request runs.

    cd /work/main && uv run python benchmarks/query_overhead.py [--passes 20]

Part 1 times single Polars operations on a 75-row frame (each eager operation is one lazy
query collected), and the same three operations as one lazy plan against three eager ones:
whether "one lazy plan per rule" would make a small pass cheaper. Part 2 counts the Polars
queries (collects), DuckDB queries and their share of process CPU in `--passes` track passes
of one request of 75 attribute objects each (new users, as `server.py` sends them),
through `Workspace.apply` on a fresh store in `/dev/shm`. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from typing import Any

import polars as pl
from polars.lazyframe.frame import LazyFrame
from rich.console import Console
from rich.table import Table

from engagelake import Workspace
from server import OBJECTS, body

console = Console(width=120)


def per_call(f: Callable[[], object], seconds: float = 0.5) -> float:
    """Best-of-batches process CPU of one call of `f`, in microseconds."""
    for _ in range(50):
        f()
    best = float("inf")
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.process_time()
        for _ in range(200):
            f()
        best = min(best, (time.process_time() - start) / 200)
    return best * 1e6


def operations(rows: int) -> None:
    frame = pl.DataFrame({"service_id": [f"s{i}" for i in range(rows)], "n": list(range(rows)),
                          "name": ["visits"] * rows})
    def three_lazy() -> pl.DataFrame:
        return frame.lazy().with_columns(m=pl.col("n") * 2).filter(pl.col("n") > 2).select("service_id", "m").collect()

    def three_eager() -> pl.DataFrame:
        return frame.with_columns(m=pl.col("n") * 2).filter(pl.col("n") > 2).select("service_id", "m")

    table = Table(title=f"Polars, one query on a {rows}-row frame (process CPU, best of batches)")
    table.add_column("operation")
    table.add_column("us a call", justify="right")
    for label, f in [("select", lambda: frame.select(pl.col("n") + 1)),
                     ("with_columns", lambda: frame.with_columns(m=pl.col("n") * 2)),
                     ("filter", lambda: frame.filter(pl.col("n") > 2)),
                     ("join (left, on service_id)", lambda: frame.join(frame, on="service_id", how="left")),
                     ("group_by + agg", lambda: frame.group_by("name").agg(pl.col("n").sum())),
                     ("three eager operations", three_eager),
                     ("the same three as one lazy plan", three_lazy)]:
        table.add_row(label, f"{per_call(f):.0f}")
    console.print(table)


def passes(count: int) -> None:
    collects = [0]
    # an eager operation collects through `_collect_eager`, a lazy plan through `collect`
    originals = {name: getattr(LazyFrame, name) for name in ("collect", "_collect_eager")}

    def counting(original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(self: LazyFrame, *args: Any, **kwargs: Any) -> Any:
            collects[0] += 1
            return original(self, *args, **kwargs)
        return counted

    ws = Workspace.open(tempfile.mkdtemp(dir="/dev/shm") + "/store", layer=True)
    request = {"method": "POST", "path": "/users/track", "body": None}
    ws.apply([{**request, "body": body(0, 0)}])  # warm-up: plans, connections, imports
    for name, original in originals.items():
        setattr(LazyFrame, name, counting(original))
    try:
        start = time.process_time()
        for i in range(1, count + 1):
            ws.apply([{**request, "body": body(0, i)}])
        cpu = (time.process_time() - start) / count
    finally:
        for name, original in originals.items():
            setattr(LazyFrame, name, original)
    ws.close()
    fixed = collects[0] / count * per_call(lambda: pl.DataFrame({"a": [1]}).select(pl.col("a") + 1)) / 1e6
    table = Table(title=f"one track pass of 1 request, {OBJECTS} objects, layered, mean of {count}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("process CPU a pass (ms)", f"{cpu * 1e3:.1f}")
    table.add_row("Polars queries a pass", f"{collects[0] / count:.0f}")
    table.add_row("their fixed cost at a 1-row select's price (ms)", f"{fixed * 1e3:.1f}")
    table.add_row("share of the pass", f"{fixed / cpu:.0%}")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=20)
    args = parser.parse_args()
    operations(OBJECTS)
    passes(args.passes)


if __name__ == "__main__":
    main()
