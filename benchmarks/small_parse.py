"""What a track pass's parse costs in DuckDB (`parse_duckdb`) and walked in Python
(`parse_small`), by the pass's size: where the two cross is `parsing.SMALL_PARSE_BYTES`
(issue 57, item 4).

    cd /work/main && uv run python benchmarks/small_parse.py [--requests 1,8,64,256,1024] [--seconds 1]

Each pass is N requests of `server.py`'s shape (75 attribute objects, each a new user). The two
paths parse it in turn, over and over for about `--seconds` each (three times at least, after
a warm-up parse), and the table gives per call the best wall time and the best process CPU
(DuckDB's threads counted), and the ratio Python / DuckDB of each: below 1, Python is the
cheaper. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import pyarrow as pa
from rich.console import Console
from rich.table import Table

from engagelake.rules.profile.parse import ParsedTrack, parse_duckdb
from engagelake.rules.profile.parse_small import parse_small
from engagelake.rules.profile.parsing import SMALL_PARSE_BYTES
from server import OBJECTS, body

console = Console(width=120)


def timed(paths: list[Callable[[pa.Table], ParsedTrack]], bodies: pa.Table,
          seconds: float) -> list[tuple[float, float]]:
    """(best wall, best process CPU) of one call of each path, in seconds: the paths called in
    turn, so that a busy machine weighs on each alike (the best of many is what the call
    itself costs)."""
    for parse in paths:
        parse(bodies)  # warm-up: DuckDB's connection, the first query's plans
    best = [(math.inf, math.inf) for _ in paths]
    started = time.perf_counter()
    rounds = 0
    while rounds < 3 or time.perf_counter() - started < seconds * len(paths):
        for n, parse in enumerate(paths):
            wall, cpu = time.perf_counter(), time.process_time()
            parse(bodies)
            best[n] = (min(best[n][0], time.perf_counter() - wall), min(best[n][1], time.process_time() - cpu))
        rounds += 1
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", default="1,8,64,256,1024", help="pass sizes in requests, comma-separated")
    ap.add_argument("--seconds", type=float, default=1.0, help="time spent on each path at each size")
    args = ap.parse_args()
    table = Table(title=f"parse of a track pass ({OBJECTS} attribute objects a request; "
                        f"SMALL_PARSE_BYTES = {SMALL_PARSE_BYTES:,})")
    for column in ("requests", "text (bytes)", "DuckDB wall", "Python wall", "ratio", "DuckDB CPU", "Python CPU",
                   "ratio"):
        table.add_column(column, justify="right", no_wrap=True)
    for size in (int(s) for s in args.requests.split(",")):
        texts = [body(0, i).decode() for i in range(size)]
        bodies = pa.table({"req": pa.array(range(size), pa.int64()), "body": pa.array(texts, pa.string())})
        (duck_wall, duck_cpu), (py_wall, py_cpu) = timed([parse_duckdb, parse_small], bodies, args.seconds)
        table.add_row(f"{size:,}", f"{sum(map(len, texts)):,}", f"{duck_wall * 1e3:,.1f} ms",
                      f"{py_wall * 1e3:,.1f} ms", f"{py_wall / duck_wall:.2f}", f"{duck_cpu * 1e3:,.1f} ms",
                      f"{py_cpu * 1e3:,.1f} ms", f"{py_cpu / duck_cpu:.2f}")
    console.print(table)


if __name__ == "__main__":
    main()
