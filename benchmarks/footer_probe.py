"""What parsed Parquet footers cost a reader: per table, the footers' size on disk, their column
chunks and the memory pyarrow takes to hold them parsed (each table in a fresh process, so the
figures do not share an allocator).

    cd /work/main && uv run python benchmarks/footer_probe.py --store /tmp/store10m

A cold export parses the footer of every file it reads a row group of; this prints what that
costs per table. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
from pathlib import Path

from rich.table import Table

from harness import console

TABLES = ("profiles", "external_ids", "attributes", "events", "purchases")

ONE = """
import gc, json, sys
import pyarrow.parquet as pq
from deltalake import DeltaTable
from urllib.parse import unquote
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
files = [unquote(uri.removeprefix("file://")) for uri in DeltaTable(sys.argv[1]).file_uris()]
gc.collect()
before = rss()
kept = [pq.read_metadata(f) for f in files]
print(json.dumps({"files": len(files), "disk": sum(m.serialized_size for m in kept),
                  "chunks": sum(m.num_row_groups * m.num_columns for m in kept), "parsed": rss() - before}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True)
    args = ap.parse_args()
    table = Table(title=f"footers of {args.store}")
    for col in ("table", "files", "footers on disk", "column chunks", "parsed", "bytes per chunk"):
        table.add_column(col, justify="right")
    total = 0
    for name in TABLES:
        gc.collect()
        out = subprocess.run([sys.executable, "-c", ONE, str(args.store / name)], check=True,
                             capture_output=True, text=True)
        f = json.loads(out.stdout.strip().splitlines()[-1])
        total += f["parsed"]
        table.add_row(name, str(f["files"]), f"{f['disk'] / 2**20:,.1f} MiB", f"{f['chunks']:,}",
                      f"{f['parsed'] / 2**20:,.1f} MiB", f"{f['parsed'] / max(f['chunks'], 1):,.0f}")
    table.add_row("all", "", "", "", f"{total / 2**20:,.1f} MiB", "")
    console.print(table)


if __name__ == "__main__":
    main()
