"""What packing a wide table's fields into one column would buy a point read (issue 9).

    cd /work/main && uv run python benchmarks/packing_probe.py --file STORE/profiles/<bottom-run file>.parquet

Rewrites one data file of a keyed table five ways (29 columns or the key columns plus the
other fields packed as one JSON column; 1,024, 256 or 128 rows a row group) and reads 50
random keys, each in its own row group, as an export probe does: footer size and parse time,
and the read (row groups, filter by key in Arrow, convert to Polars, decode the packed
column). Prints the median of 7 reads; asserts nothing. Results: `docs/decisions.md`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

KEEP = ["service_id", "_batch", "_deleted"]  # the columns probes and runs read by themselves
LAYOUTS = [("wide", 1024), ("wide", 256), ("packed", 1024), ("packed", 256), ("packed", 128)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", type=Path, required=True, help="a big data file of a table keyed by service_id")
    ap.add_argument("--keys", type=int, default=50)
    args = ap.parse_args()
    wide = pl.read_parquet(args.file)
    rest = [c for c in wide.columns if c not in KEEP]
    dtype = wide.select(pl.struct(rest)).to_series().dtype
    packed = wide.select(*KEEP, pl.struct(rest).struct.json_encode().alias("fields"))
    rng = np.random.default_rng(0)
    print(f"{args.file.name}: {wide.height:,} rows, {wide.width} columns")
    with tempfile.TemporaryDirectory() as tmp:
        for name, rows in LAYOUTS:
            path = Path(tmp) / f"{name}-{rows}.parquet"
            frame, stats = (wide, True) if name == "wide" else (packed, ["service_id", "_batch"])
            pq.write_table(frame.to_arrow(), path, row_group_size=rows, compression="snappy", write_statistics=stats)
            parse = []
            for _ in range(5):
                t = time.perf_counter()
                metadata = pq.read_metadata(path)
                parse.append(time.perf_counter() - t)
            reader = pq.ParquetFile(path, metadata=metadata)
            reads = []
            for _ in range(7):
                groups = sorted(rng.choice(metadata.num_row_groups, args.keys, replace=False).tolist())
                keys = pa.array(wide["service_id"].gather([g * rows + 7 for g in groups]).to_list())
                t = time.perf_counter()
                table = reader.read_row_groups(groups)
                found = pl.from_arrow(table.filter(pc.is_in(table.column("service_id"), keys)))
                assert isinstance(found, pl.DataFrame)
                if name == "packed":
                    found = found.with_columns(pl.col("fields").str.json_decode(dtype)).unnest("fields")
                reads.append(time.perf_counter() - t)
                assert found.height == args.keys
            print(f"{name:6s} {rows:5d} rows a group: file {os.path.getsize(path) >> 20} MiB, footer "
                  f"{metadata.serialized_size >> 10:,} KiB parsed in {min(parse) * 1000:.1f} ms; "
                  f"{args.keys} keys read in {np.median(reads) * 1000:.1f} ms (median of 7)")


if __name__ == "__main__":
    main()
