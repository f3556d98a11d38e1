"""Whole-store jobs on a big store: they must stream, so their memory follows a chunk, not the store.

    cd /work/main && uv run python benchmarks/bench_whole_store.py --store /tmp/store10m

- publish: `engagelake publish --store S --out <tmp>` (every table's current rows as plain Delta
  tables, through DuckDB within the memory budget);
- export all: `engagelake export --all --out <tmp> --store S` (every user, streamed in chunks of
  50,000 by key range into users.ndjson and users.parquet).

Each runs as a fresh process; prints its wall time, rows or users per second and peak RSS. The
outputs go to a temporary folder, removed afterwards. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

# one fresh process, its wall time and peak RSS (the children's maximum: each runs alone)
RUN = """
import json, resource, subprocess, sys, time
t = time.perf_counter()
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(json.dumps({"s": time.perf_counter() - t,
                  "rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))
"""


def timed(command: list[str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", RUN, *command], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True)
    args = ap.parse_args()
    cli = str(Path(sys.executable).with_name("engagelake"))
    console = Console()
    table = Table("job", "seconds", "rows or users", "per second", "peak RSS (MiB)")
    with tempfile.TemporaryDirectory(prefix="whole-store-") as scratch:
        published = Path(scratch) / "published"
        run = timed([cli, "publish", "--store", str(args.store), "--out", str(published)])
        marker = json.loads((published / "_published.json").read_text())
        rows = sum(t["rows"] for t in marker["tables"].values())
        table.add_row("publish", f"{run['s']:.1f}", f"{rows:,}", f"{rows / run['s']:,.0f}", f"{run['rss'] / 2**20:,.0f}")
        shutil.rmtree(published)
        exported = Path(scratch) / "export"
        run = timed([cli, "export", "--all", "--out", str(exported), "--store", str(args.store)])
        with (exported / "users.ndjson").open("rb") as lines:
            users = sum(1 for _ in lines)
        table.add_row("export --all", f"{run['s']:.1f}", f"{users:,}", f"{users / run['s']:,.0f}",
                      f"{run['rss'] / 2**20:,.0f}")
    console.print(table)
    console.print(f"this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10:,} MiB; "
                  f"finished {time.strftime('%H:%M:%S')}")


if __name__ == "__main__":
    main()
