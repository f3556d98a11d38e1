"""Figures of issue 9 on a big store built by `build_store.py` (default: 10M users).

    cd /work/main && uv run python benchmarks/build_store.py --users 10000000 --out /tmp/store10m
    cd /work/main && uv run python benchmarks/bench_scale.py --store /tmp/store10m --users 10000000

- cold: a fresh process opens the store and exports 50 random external IDs (wall time of the
  whole process, its peak RSS, and at its exit its anonymous and file-backed resident pages:
  the memory-mapped filters and record copies count as far as the page cache holds their
  files, so the peak follows the cache); and `engagelake export -e <id>` as a fresh process.
- P3 warm: 50 exports of 50 random external IDs with every field in one process, p50/p95.
- P2: 10,000 track objects into the big store vs into an empty store (median of 3 batches each,
  the same generator as `bench_track.py`), with the peak RSS of this process.

Applying P2 adds users to the store. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.table import Table

from bench_track import (
    EXPORT,
    IdSpace,
    console,
    errors_in,
    ext_ids,
    max_rss,
    mib,
    mixed_requests,
    open_ws,
)
from engagelake import Workspace
from engagelake.rules.messages import EXPORT_FIELDS

COLD = """
import json, resource, sys, time
t = time.perf_counter()
from engagelake import Workspace
ws = Workspace.open(sys.argv[1])
r = ws.call("POST", "/users/export/ids", {"external_ids": json.loads(sys.argv[2]), "fields_to_export": json.loads(sys.argv[3])})
assert r.status == 200 and len(r.body["users"]) == len(json.loads(sys.argv[2])), r
status = dict(line.split(":", 1) for line in open("/proc/self/status") if line.startswith(("RssAnon", "RssFile")))
print(json.dumps({"inner_s": time.perf_counter() - t, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  **{k.lower(): int(v.split()[0]) * 1024 for k, v in status.items()}}))
"""


def cold_export(store: Path, ids: list[str]) -> dict[str, float]:
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", COLD, str(store), json.dumps(ids), json.dumps(list(EXPORT_FIELDS))],
                         check=True, capture_output=True, text=True)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    return {"wall_s": time.perf_counter() - t, **figures}


def cli_export(store: Path, external_id: str) -> float:
    t = time.perf_counter()
    cli = str(Path(sys.executable).parent / "engagelake")
    out = subprocess.run([cli, "export", "-e", external_id, "--store", str(store)],
                         check=True, capture_output=True, text=True)
    assert external_id in out.stdout, out.stdout[:500]
    return time.perf_counter() - t


def runs_and_files(ws: Workspace, name: str) -> str:
    """The sorted runs of a table and their files: a point read pays per file it opens, so P3
    follows them (a compaction leaves one run; batches add runs until merges fold them)."""
    runs = ws.store.runs(name, ws.store.head.versions.get(name))
    return f"{len(runs)} ({sum(len(run.files) for run in runs)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--users", type=int, default=10_000_000, help="users the store was built with")
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    rows: list[tuple[str, str, str]] = []

    colds = [cold_export(args.store, ext_ids(rng.choice(args.users, 50, replace=False))) for _ in range(3)]
    cold = sorted(colds, key=lambda c: c["wall_s"])[1]
    rows.append(("fresh process: open + export 50 ids (median of 3)",
                 f"{cold['wall_s']:.2f} s wall, {mib(cold['rss'])}", "<= 1.5 s, <= 500 MiB"))
    if "rssfile" in cold:  # Linux: mapped files' pages count in the peak as the page cache holds them
        rows.append(("  its resident pages at exit: anonymous / mapped files",
                     f"{mib(cold['rssanon'])} / {mib(cold['rssfile'])}", ""))
    clis = sorted(cli_export(args.store, ext_ids(rng.choice(args.users, 1))[0]) for _ in range(3))
    rows.append(("`engagelake export` of one user, fresh process (median of 3)", f"{clis[1]:.2f} s", "<= 2 s"))

    ws = open_ws(args.store)
    rows.append(("runs (files) a probe may open: profiles, attributes, events, purchases",
                 ", ".join(runs_and_files(ws, name) for name in ("profiles", "attributes", "events", "purchases")),
                 "after `compact`: 1 (1) each"))
    times = []
    for i in range(53):
        body = {"external_ids": ext_ids(rng.choice(args.users, 50, replace=False)), "fields_to_export": list(EXPORT_FIELDS)}
        t = time.perf_counter()
        r = ws.call("POST", EXPORT, body)
        if i >= 3:
            times.append((time.perf_counter() - t) * 1000)
        assert r.status == 200 and len(r.body["users"]) == 50
    rows.append(("P3 warm export of 50 ids, p50 / p95",
                 f"{np.percentile(times, 50):.1f} / {np.percentile(times, 95):.1f} ms", "p50 <= 50 ms"))

    big, empty = [], []
    ids = IdSpace(args.users)
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(3):
            requests = mixed_requests(10_000, ids, rng)
            ws.store.wait_for_merges()  # each run starts from a settled store
            t = time.perf_counter()
            bad = errors_in(ws.apply(requests))
            big.append(time.perf_counter() - t)
            fresh = open_ws(Path(tmp) / f"empty{run}")
            t = time.perf_counter()
            bad += errors_in(fresh.apply(requests))
            empty.append(time.perf_counter() - t)
            console.print(f"  P2 run {run + 1}: big {big[-1] * 1000:,.0f} ms, empty {empty[-1] * 1000:,.0f} ms, "
                          f"errors {bad}")
    ratio = statistics.median(big) / statistics.median(empty)
    rows.append(("P2 10,000 objects: big store / empty store (median of 3)",
                 f"{statistics.median(big) * 1000:,.0f} / {statistics.median(empty) * 1000:,.0f} ms = {ratio:.2f}x",
                 "<= 3x"))
    rows.append(("peak RSS of this process (warm exports + P2)", mib(max_rss()), "<= 2 GiB"))

    table = Table(title=f"bench_scale: {args.store} ({args.users:,} users built)")
    for col in ("figure", "value", "target"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    console.print(table)


if __name__ == "__main__":
    main()
