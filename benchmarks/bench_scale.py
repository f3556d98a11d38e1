"""Figures of issue 9 on a big store built by `build_store.py` (default: 10M users).

    cd /work/main && uv run python benchmarks/build_store.py --users 10000000 --out /tmp/store10m
    cd /work/main && uv run python benchmarks/bench_scale.py --store /tmp/store10m --users 10000000
    cd /work/main && uv run python benchmarks/bench_scale.py --store /tmp/store10m --users 10000000 --p1

- cold: a fresh process opens the store and exports 50 random external IDs (wall time of the
  whole process, its peak RSS, and at its exit its anonymous and file-backed resident pages:
  the memory-mapped filters and record copies count as far as the page cache holds their
  files, so the peak follows the cache); and `engagelake export -e <id>` as a fresh process.
- P3 warm: 50 exports of 50 random external IDs with every field in one process, p50/p95.
- P2: 10,000 track objects into the big store vs into an empty store (median of 3 batches each,
  the same generator as `bench_track.py`), with the peak RSS of this process.
- `--p1`: P1 at this size: 1M mixed track objects (`--p1-objects`) in one `apply`, into a copy of
  the store (made beside it, or in `--p1-work`, and removed after), in a fresh process that
  holds the input as NDJSON lines as `bench_track.py` does; then the same batch hand-written
  as a DuckDB `MERGE` and a delta-rs merge against a users table of the same size
  (`baseline.py`), and the ratios.

Applying P2 adds users to the store. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from rich.table import Table

from engagelake import Workspace
from engagelake.rules.messages import EXPORT_FIELDS
from harness import console, errors_in, max_rss, mib, open_ws, vm_rss
from workload import EXPORT, IdSpace, ext_ids, mixed_requests

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


def p1_requests(users: int, objects: int, seed: int) -> list[dict[str, Any]]:
    """P1's batch at this size: new users numbered past those P2 runs may have added."""
    ids = IdSpace(users)
    ids.next_new = users + objects
    return mixed_requests(objects, ids, np.random.default_rng(seed))


def p1_engine(store: str, users: int, objects: int, seed: int) -> dict[str, float]:
    """P1 into `store` (run in a fresh process): wall and CPU seconds, the peak VmRSS."""
    lines = [orjson.dumps(r) for r in p1_requests(users, objects, seed)]
    ws = open_ws(Path(store))
    peak, done = [vm_rss()], threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], vm_rss())

    threading.Thread(target=sample, daemon=True).start()
    t, c = time.perf_counter(), time.process_time()
    bad = errors_in(ws.apply(orjson.loads(line) for line in lines))
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    done.set()
    ws.close()
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss": max(peak[0], vm_rss()), "errors": bad}


def p1_baselines(users: int, objects: int, seed: int, folder: str) -> dict[str, float]:
    from baseline import hand_written
    return hand_written(p1_requests(users, objects, seed), users, Path(folder))


def p1_rows(store: Path, users: int, objects: int, work: Path | None, seed: int) -> list[tuple[str, str, str]]:
    """P1 into a copy of `store`, and the hand-written baselines: the figure rows."""
    folder = Path(tempfile.mkdtemp(prefix="p1-", dir=work or store.parent))
    try:
        console.print(f"  P1: copying {store} to {folder} ...")
        shutil.copytree(store, folder / "store")
        os.sync()  # the copy's writes must not compete with the reads timed
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(1, mp_context=spawn) as child:
            engine = child.submit(p1_engine, str(folder / "store"), users, objects, seed).result()
        shutil.rmtree(folder / "store")
        console.print(f"  P1 engine: {engine['wall_s']:.2f} s; the baselines ...")
        with ProcessPoolExecutor(1, mp_context=spawn) as child:
            base = child.submit(p1_baselines, users, objects, seed, str(folder / "baseline")).result()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    merge, delta = base["duckdb_merge_s"], base["delta_merge_s"]
    return [
        (f"P1 {objects:,} objects in one apply, into a copy of the store",
         f"{engine['wall_s']:.2f} s wall, {engine['cpu_s']:.1f} s CPU, peak VmRSS {mib(engine['peak_rss'])}, "
         f"{engine['errors']:.0f} errors", ""),
        ("  hand-written without the rules: DuckDB MERGE / delta-rs merge", f"{merge:.2f} / {delta:.2f} s", ""),
        ("  P1 engine / DuckDB MERGE; / delta-rs merge",
         f"{engine['wall_s'] / merge:.1f}x; {engine['wall_s'] / delta:.1f}x", "< 1x"),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--users", type=int, default=10_000_000, help="users the store was built with")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--p1", action="store_true", help="also time P1 into a copy of the store, and its baselines")
    ap.add_argument("--p1-objects", type=int, default=1_000_000)
    ap.add_argument("--p1-work", type=Path, help="where the copy goes (default: beside the store)")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    rows: list[tuple[str, str, str]] = []
    if args.p1:  # first: the store as built, before P2 adds to it
        rows += p1_rows(args.store, args.users, args.p1_objects, args.p1_work, args.seed)

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
