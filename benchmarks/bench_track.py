"""Benchmark `/users/track` ingestion and `/users/export/ids` on a large engagelake store.

    cd /work/main && uv run python benchmarks/bench_track.py [--users N] [--objects N] [--big]
                                                              [--baseline] [--out DIR] [--json FILE]

Phases (generation of request dictionaries is timed separately and never counted as engine time):

- load: a base store of `--users` users, built from attribute-only `/users/track` requests
  (plain sets of profile fields and custom attributes), `--load-chunk` objects per `apply`.
- P1: `--objects` mixed track objects (attributes with `{"inc": n}`, `{"add": [...]}` and plain
  sets; events; purchases), 60% of them for users already in the store, applied with one
  `ws.apply(...)` (or applies of `--apply-objects` objects each). The requests are held as
  NDJSON lines, as a landing file holds them, and `apply` draws them from a generator that
  decodes one line at a time (the decoding counts as engine time). Reports objects/s, the peak
  RSS of the process (`ru_maxrss`) and the VmRSS peak/delta during P1 (sampled in a thread), and
  a raw I/O floor measured in the same run: the same bodies written as NDJSON, read back with
  Polars and written as Parquet with as many rows as the engine appended to its tables.
- `--baseline`: P1 hand-written as a DuckDB `MERGE` and as a delta-rs merge, without the rules
  (`baseline.py`), on the same input in the same run: the mission's bar is to be faster.
- P2: 10,000 objects into the big store vs into an empty store (median of 3 fresh batches).
- P3: `/users/export/ids` of 50 existing external IDs with every field: warm p50/p95 over 50
  calls after 3 warm-up calls; with `--big` also on a 10M-user store.

The script prints figures beside their targets; it asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl
from deltalake import DeltaTable
from rich.table import Table

from engagelake.rules.messages import EXPORT_FIELDS
from engagelake.tables.schema import TABLES
from engagelake.workspace import Response, Workspace
from harness import RssSampler, build_store, console, errors_in, max_rss, mib, open_ws, vm_rss
from workload import BODY_SCHEMA, EXPORT, KIND_NAMES, IdSpace, ext_ids, mixed_requests

TARGET_OBJECTS_PER_S = 250_000
TARGET_FLOOR_RATIO = 3.0
TARGET_RSS_BYTES = 2 * 1024**3
TARGET_P2_RATIO = 3.0
TARGET_P3_P50_MS = 50.0


# --- measuring ----------------------------------------------------------------------------------
def rows_appended(ws: Workspace, batch_before: int) -> dict[str, int]:
    """Rows of the data tables the batches after `batch_before` added: the engine's output, the
    rows the I/O floor writes (not the rows run merges rewrote, nor index entries)."""
    out: dict[str, int] = {}
    for name in TABLES:
        files = ws.store.files(name, ws.store.head.versions.get(name))
        out[name] = (pl.scan_parquet(files).filter(pl.col("_batch") > batch_before).select(pl.len())
                     .collect().item()) if files else 0
    return out


def rows_written(ws: Workspace, before: dict[str, int]) -> dict[str, int]:
    """Rows the engine wrote to each table since the table versions in `before` (new rows, run
    merges' rewrites and index entries), read from the Delta logs (`num_added_rows` of every
    commit after that version)."""
    out: dict[str, int] = {}
    for name, version in ws.store.head.versions.items():
        if version <= before[name]:
            out[name] = 0
            continue
        table = DeltaTable(ws.store.place.path(name))  # merges after `version` may be newer
        history = table.history(table.version() - before[name])
        out[name] = sum(
            int(h.get("operationMetrics", {}).get("num_added_rows", 0))
            for h in history
            if before[name] < h["version"] <= version
        )
    return out


def statuses(responses: list[Response]) -> Counter[int]:
    return Counter(r.status for r in responses)


# --- the input ----------------------------------------------------------------------------------
def deep_size(obj: Any) -> int:
    """Bytes of a JSON-like Python value and everything it holds (shared objects counted again)."""
    if isinstance(obj, dict):
        return sys.getsizeof(obj) + sum(deep_size(k) + deep_size(v) for k, v in obj.items())
    if isinstance(obj, list):
        return sys.getsizeof(obj) + sum(deep_size(v) for v in obj)
    return sys.getsizeof(obj)


def count_objects(requests: list[dict[str, Any]]) -> int:
    return sum(len(r["body"].get(k, ())) for r in requests for k in KIND_NAMES)


def split_by_objects(requests: list[dict[str, Any]], per_apply: int) -> Iterator[list[dict[str, Any]]]:
    """Consecutive groups of requests holding about `per_apply` objects each."""
    group: list[dict[str, Any]] = []
    n = 0
    for r in requests:
        group.append(r)
        n += sum(len(r["body"].get(k, ())) for k in KIND_NAMES)
        if n >= per_apply:
            yield group
            group, n = [], 0
    if group:
        yield group


# --- phases ------------------------------------------------------------------------------------
def table_rows(store: str) -> dict[str, int]:
    """Current rows of every table (run in a child process: counting reads every key)."""
    ws = Workspace.open(store)
    return {name: int(ws.table(name).select(pl.len()).collect().item()) for name in ws.table_names()}


def p1_input(objects: int, existing: int, next_new: int, rng_state: Mapping[str, Any],
             apply_objects: int) -> dict[str, Any]:
    """P1's requests as NDJSON lines, with their counts (run in a child process)."""
    rng = np.random.default_rng()
    rng.bit_generator.state = rng_state
    ids = IdSpace(existing)
    ids.next_new = next_new
    t = time.perf_counter()
    requests = mixed_requests(objects, ids, rng)
    generation_s = time.perf_counter() - t
    sample = requests[:: max(1, len(requests) // 200)]
    return {
        "lines": [orjson.dumps(r) for r in requests], "generation_s": generation_s,
        "objects": count_objects(requests),
        "kinds": {k: sum(len(r["body"].get(k, ())) for r in requests) for k in KIND_NAMES},
        "dicts_bytes": deep_size(sample) * len(requests) // max(len(sample), 1),  # estimate
        "groups": ([len(g) for g in split_by_objects(requests, apply_objects)] if apply_objects
                   else [len(requests)]),
        "rng_state": rng.bit_generator.state, "next_new": ids.next_new,
    }


def baseline_p1(objects: int, users: int, next_new: int, rng_state: dict[str, Any], folder: str) -> dict[str, float]:
    """P1's batch regenerated, hand-written without the rules (`baseline.py`)."""
    from baseline import hand_written
    rng, ids = np.random.default_rng(), IdSpace(users)
    rng.bit_generator.state, ids.next_new = rng_state, next_new
    return hand_written(mixed_requests(objects, ids, rng), users, Path(folder))


def io_floor(requests: list[dict[str, Any]], rows: dict[str, int], folder: Path) -> dict[str, Any]:
    """Raw I/O floor: bodies -> NDJSON file -> Polars read (with the generator's known schema)
    -> Parquet with the engine's row count.

    The Parquet output has as many rows as the engine appended in all (events and purchases
    tables get one row per event/purchase object; the rest is filled with attributes-object rows,
    repeated as needed)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "bodies.ndjson"
    total_rows = sum(rows.values())

    t0 = time.perf_counter()
    with open(path, "wb") as f:
        f.write(b"\n".join(orjson.dumps(r["body"]) for r in requests))
        f.write(b"\n")
    t1 = time.perf_counter()
    frame = pl.read_ndjson(path, schema=BODY_SCHEMA)
    t2 = time.perf_counter()
    parts: dict[str, pl.DataFrame] = {}
    for name in KIND_NAMES:
        if name in frame.columns:
            parts[name] = frame.select(pl.col(name).explode()).drop_nulls().unnest(name)
    n_events = parts["events"].height if "events" in parts else 0
    n_purchases = parts["purchases"].height if "purchases" in parts else 0
    rest = max(total_rows - n_events - n_purchases, 0)
    attrs = parts.get("attributes")
    if attrs is not None and attrs.height and rest:
        parts["attributes"] = attrs[np.arange(rest) % attrs.height]
    written = 0
    for name, part in parts.items():
        part.write_parquet(folder / f"{name}.parquet")
        written += part.height
    t3 = time.perf_counter()
    return {
        "seconds": t3 - t0, "write_ndjson_s": t1 - t0, "read_ndjson_s": t2 - t1,
        "write_parquet_s": t3 - t2, "ndjson_bytes": path.stat().st_size, "parquet_rows": written,
    }


def timed_apply(ws: Workspace, requests: list[dict[str, Any]]) -> tuple[float, list[Response]]:
    t = time.perf_counter()
    responses = ws.apply(requests)
    return time.perf_counter() - t, responses


def export_latency(ws: Workspace, users: int, rng: np.random.Generator, calls: int = 50,
                   warmup: int = 3) -> dict[str, Any]:
    """Warm latency of exporting 50 random existing users with every field."""
    fields = list(EXPORT_FIELDS)
    times: list[float] = []
    bad = 0
    for i in range(warmup + calls):
        body = {"external_ids": ext_ids(rng.choice(users, 50, replace=False)), "fields_to_export": fields}
        t = time.perf_counter()
        r = ws.call("POST", EXPORT, body)
        dt = time.perf_counter() - t
        if r.status != 200 or len((r.body or {}).get("users", ())) != 50:
            bad += 1
        if i >= warmup:
            times.append(dt * 1000)
    return {"p50_ms": float(np.percentile(times, 50)), "p95_ms": float(np.percentile(times, 95)),
            "max_ms": max(times), "calls": calls, "bad_responses": bad}


# --- report ------------------------------------------------------------------------------------
def verdict(value: float | None, target: float | None, higher_is_better: bool) -> str:
    if value is None or target is None:
        return "-"
    ok = value >= target if higher_is_better else value <= target
    return "[green]met[/green]" if ok else "[red]not met[/red]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=1_000_000, help="users in the base store")
    ap.add_argument("--objects", type=int, default=1_000_000, help="track objects in P1")
    ap.add_argument("--apply-objects", type=int, default=0,
                    help="P1 objects per ws.apply (0 = the whole P1 in one apply)")
    ap.add_argument("--load-chunk", type=int, default=100_000, help="users created per apply when loading")
    ap.add_argument("--p2-objects", type=int, default=10_000)
    ap.add_argument("--big", action="store_true", help="also build a 10M-user store for P3")
    ap.add_argument("--big-users", type=int, default=10_000_000, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None, help="folder for the stores (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--baseline", action="store_true",
                    help="also time P1 hand-written as a DuckDB MERGE and a delta-rs merge (benchmarks/baseline.py)")
    args = ap.parse_args()

    out = args.out or Path(tempfile.mkdtemp(prefix="bench-track-"))
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    fig: dict[str, Any] = {"users": args.users, "objects": args.objects, "cpus": os.cpu_count(),
                           "out": str(out)}
    console.rule(f"engagelake bench_track — {args.users:,} users, {args.objects:,} objects, "
                 f"{os.cpu_count()} CPUs, stores in {out}")

    # load -------------------------------------------------------------------------------------
    console.print(f"[bold]load[/bold]: {args.users:,} users, attribute-only requests, "
                  f"{args.load_chunk:,} users per apply")
    load = build_store(out / "big", args.users, args.load_chunk, rng, "load")
    ws: Workspace = load.pop("ws")
    fig["load"] = {**load, "users_per_s": args.users / load["seconds"]}
    console.print(f"  load: {load['seconds']:.2f} s engine ({args.users / load['seconds']:,.0f} users/s) "
                  f"in {load['applies']} applies, generation {load['generation_s']:.2f} s, "
                  f"{load['profiles']:,} profiles, {load['bad_responses']} bad responses")
    gc.collect()

    # P1 ---------------------------------------------------------------------------------------
    ids = IdSpace(args.users)
    p1_rng_state, p1_next_new = rng.bit_generator.state, ids.next_new  # the I/O floor regenerates them
    # the input as a landing file holds it: NDJSON lines, decoded one request at a time as the
    # engine draws them (`apply` takes a generator). A child process makes them, so that the
    # dicts' freed memory does not stay in this process's RSS.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
        p1 = child.submit(p1_input, args.objects, args.users, ids.next_new, p1_rng_state, args.apply_objects).result()
    lines, gen_s, n_objects, kinds, input_rss, groups = (
        p1["lines"], p1["generation_s"], p1["objects"], p1["kinds"], p1["dicts_bytes"], p1["groups"])
    rng.bit_generator.state, ids.next_new = p1["rng_state"], p1["next_new"]  # as if drawn here
    n_requests = len(lines)
    input_bytes = sum(map(len, lines))
    mode = (f"{len(groups)} applies of ~{args.apply_objects:,} objects" if args.apply_objects
            else "one ws.apply")
    console.print(f"[bold]P1[/bold]: {n_objects:,} objects in {n_requests:,} requests "
                  f"({', '.join(f'{v:,} {k}' for k, v in kinds.items())}), {mode}; "
                  f"generation {gen_s:.2f} s; input held as NDJSON lines, {mib(input_bytes)} "
                  f"(as dicts ~{mib(input_rss)}, sizeof estimate), decoded as the engine draws them")
    versions_before = dict(ws.store.head.versions)
    batch_before = ws.store.head.batch_no
    ws.store.wait_for_merges()  # the load's merges are not P1's
    ws.store.merges.clear()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
        heights_before = child.submit(table_rows, str(out / "big")).result()
    gc.collect()
    p1_responses: list[Response] = []
    with RssSampler() as rss:
        t = time.perf_counter()
        start = 0
        for size in groups:
            p1_responses.extend(ws.apply(orjson.loads(line) for line in lines[start:start + size]))
            start += size
        p1_s = time.perf_counter() - t
        apply_peak = max(rss.peak, vm_rss())  # the batch itself, before its merges end
        t = time.perf_counter()
        ws.store.wait_for_merges()  # P1's own merges run after its commit, in a thread
        merge_wait_s = time.perf_counter() - t
    appended = rows_appended(ws, batch_before)
    written = rows_written(ws, versions_before)
    p1_merges = list(ws.store.merges)
    growth = {n: ws.table(n).collect().height - heights_before[n] for n in ws.table_names()}
    p1_rate = n_objects / p1_s
    console.print(f"  engine: {p1_s:.2f} s = {p1_rate:,.0f} objects/s; responses {dict(statuses(p1_responses))}, "
                  f"{errors_in(p1_responses)} with errors")
    console.print(f"  rows appended: {sum(appended.values()):,} "
                  f"({', '.join(f'{k} {v:,}' for k, v in appended.items() if v)}); "
                  f"table growth: {', '.join(f'{k} {v:+,}' for k, v in growth.items() if v)}")
    console.print(f"  rows written with run merges and indexes: {sum(written.values()):,} "
                  f"({', '.join(f'{k} {v:,}' for k, v in written.items() if v)})")
    merge_s = sum(s for _, _, s in p1_merges)
    console.print(f"  run merges after the commit, in a thread (not in the engine time): {merge_s:.2f} s, "
                  f"still running {merge_wait_s:.2f} s after the apply returned "
                  f"({', '.join(f'{t} {n} runs {s:.2f} s' for t, n, s in p1_merges) or 'none'})")
    console.print(f"  RSS: VmRSS before P1 {mib(rss.baseline)}, peak during P1 {mib(rss.peak)} "
                  f"(delta {mib(rss.delta)}; until the apply returned {mib(apply_peak)}, the rest while "
                  f"its run merges ran); ru_maxrss {mib(max_rss())}")
    del lines
    rng_again, ids_again = np.random.default_rng(), IdSpace(args.users)
    rng_again.bit_generator.state, ids_again.next_new = p1_rng_state, p1_next_new
    floor = io_floor(mixed_requests(args.objects, ids_again, rng_again), appended, out / "floor")
    ratio = p1_s / floor["seconds"]
    console.print(f"  I/O floor: {floor['seconds']:.2f} s (write NDJSON {floor['write_ndjson_s']:.2f} s, "
                  f"{floor['ndjson_bytes'] / 1024**2:,.0f} MiB; read with Polars {floor['read_ndjson_s']:.2f} s; "
                  f"{floor['parquet_rows']:,} rows to Parquet {floor['write_parquet_s']:.2f} s); "
                  f"engine/floor = {ratio:.1f}")
    baseline: dict[str, float] = {}
    if args.baseline:
        # in a child process: its memory is not P1's (this process's ru_maxrss is a figure)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
            baseline = child.submit(baseline_p1, args.objects, args.users, p1_next_new, p1_rng_state,
                                    str(out / "baseline")).result()
        console.print(f"  hand-written without the rules: DuckDB MERGE {baseline['duckdb_merge_s']:.2f} s, "
                      f"delta-rs merge {baseline['delta_merge_s']:.2f} s; engine / DuckDB MERGE = "
                      f"{p1_s / baseline['duckdb_merge_s']:.1f}, engine / delta-rs merge = "
                      f"{p1_s / baseline['delta_merge_s']:.1f}")
    fig["p1"] = {
        "mode": mode, "objects": n_objects, "requests": n_requests, "kinds": kinds,
        "generation_s": gen_s, "seconds": p1_s, "objects_per_s": p1_rate,
        "status_counts": {str(k): v for k, v in statuses(p1_responses).items()},
        "responses_with_errors": errors_in(p1_responses),
        "rows_appended": appended, "rows_written": written, "table_growth": growth,
        "merges": p1_merges, "merge_wait_s": merge_wait_s,
        "input_dicts_rss_bytes": input_rss, "input_ndjson_bytes": input_bytes, "rss_before_bytes": rss.baseline,
        "rss_peak_bytes": rss.peak, "rss_apply_peak_bytes": apply_peak, "rss_delta_bytes": rss.delta,
        "ru_maxrss_bytes": max_rss(),
        "floor": floor, "engine_floor_ratio": ratio, "baseline": baseline,
    }
    del groups, p1_responses
    gc.collect()

    # P2 ---------------------------------------------------------------------------------------
    console.print(f"[bold]P2[/bold]: {args.p2_objects:,} objects, big store vs empty store, median of 3")
    big_s: list[float] = []
    empty_s: list[float] = []
    for run in range(3):
        reqs = mixed_requests(args.p2_objects, ids, rng)
        ws.store.wait_for_merges()  # each run starts from a settled store
        s_big, r_big = timed_apply(ws, reqs)
        empty_ws = open_ws(out / f"empty-{run}")
        s_empty, r_empty = timed_apply(empty_ws, reqs)
        big_s.append(s_big)
        empty_s.append(s_empty)
        console.print(f"  run {run + 1}: big {s_big * 1000:,.0f} ms, empty {s_empty * 1000:,.0f} ms "
                      f"(errors {errors_in(r_big)}/{errors_in(r_empty)})")
        del empty_ws
        shutil.rmtree(out / f"empty-{run}", ignore_errors=True)
    p2_big, p2_empty = statistics.median(big_s), statistics.median(empty_s)
    fig["p2"] = {"objects": args.p2_objects, "big_s": big_s, "empty_s": empty_s,
                 "big_median_s": p2_big, "empty_median_s": p2_empty, "ratio": p2_big / p2_empty}
    console.print(f"  median: big {p2_big * 1000:,.0f} ms, empty {p2_empty * 1000:,.0f} ms, "
                  f"ratio {p2_big / p2_empty:.2f}")

    # P3 ---------------------------------------------------------------------------------------
    console.print(f"[bold]P3[/bold]: export 50 external IDs, all {len(EXPORT_FIELDS)} fields, "
                  f"{ws.table('profiles').collect().height:,}-user store")
    ws.store.wait_for_merges()
    p3 = export_latency(ws, args.users, rng)
    fig["p3"] = p3
    console.print(f"  p50 {p3['p50_ms']:.1f} ms, p95 {p3['p95_ms']:.1f} ms, max {p3['max_ms']:.1f} ms, "
                  f"{p3['bad_responses']} bad responses")
    del ws
    gc.collect()

    if args.big:
        console.print(f"[bold]P3 big[/bold]: building a {args.big_users:,}-user store")
        big = build_store(out / "big10m", args.big_users, max(args.load_chunk, 1_000_000), rng, "load 10M")
        ws10: Workspace = big.pop("ws")
        p3b = export_latency(ws10, args.big_users, rng)
        fig["p3_big"] = {**p3b, "users": args.big_users, "load": big}
        console.print(f"  load {big['seconds']:.1f} s; p50 {p3b['p50_ms']:.1f} ms, p95 {p3b['p95_ms']:.1f} ms")
        del ws10

    fig["ru_maxrss_bytes"] = max_rss()

    # summary ----------------------------------------------------------------------------------
    table = Table(title=f"bench_track: {args.users:,} users, {args.objects:,} objects, {os.cpu_count()} CPUs")
    for col in ("figure", "value", "target", "status"):
        table.add_column(col, justify="left" if col == "figure" else "right")
    gib = 1024**3

    def row(name: str, value: str, target: str = "", ok: str = "-") -> None:
        table.add_row(name, value, target, ok)

    row("load (engine)", f"{fig['load']['seconds']:.2f} s  ({fig['load']['users_per_s']:,.0f} users/s)")
    row("P1 generation (excluded)", f"{gen_s:.2f} s")
    row(f"P1 throughput ({mode})", f"{p1_rate:,.0f} obj/s", f"≥ {TARGET_OBJECTS_PER_S:,}",
        verdict(p1_rate, TARGET_OBJECTS_PER_S, True))
    row("P1 engine time", f"{p1_s:.2f} s")
    row("P1 raw I/O floor", f"{floor['seconds']:.2f} s")
    row("P1 engine / floor", f"{ratio:.1f}×", f"≤ {TARGET_FLOOR_RATIO:g}×",
        verdict(ratio, TARGET_FLOOR_RATIO, False))
    if baseline:  # the mission's bar: faster than the same batch hand-written without the rules
        for label, key in (("DuckDB MERGE", "duckdb_merge_s"), ("delta-rs merge", "delta_merge_s")):
            row(f"P1 engine / hand-written {label}", f"{p1_s / baseline[key]:.1f}×  ({baseline[key]:.2f} s)",
                "< 1×", verdict(p1_s / baseline[key], 1.0, False))
    row("peak RSS (ru_maxrss)", f"{max_rss() / gib:.2f} GiB", "≤ 2 GiB",
        verdict(max_rss(), TARGET_RSS_BYTES, False))
    row("P1 peak VmRSS (sampled)", f"{rss.peak / gib:.2f} GiB", "≤ 2 GiB",
        verdict(rss.peak, TARGET_RSS_BYTES, False))
    row("P1 peak VmRSS until the apply returned", f"{apply_peak / gib:.2f} GiB")
    row("P1 VmRSS delta", f"{mib(rss.delta)}  (input: NDJSON lines, {mib(input_bytes)})")
    row(f"P2 {args.p2_objects:,} obj, big store (median)", f"{p2_big * 1000:,.0f} ms")
    row(f"P2 {args.p2_objects:,} obj, empty store (median)", f"{p2_empty * 1000:,.0f} ms")
    row("P2 big / empty", f"{p2_big / p2_empty:.2f}×", f"≤ {TARGET_P2_RATIO:g}×",
        verdict(p2_big / p2_empty, TARGET_P2_RATIO, False))
    row("P3 export 50 ids, p50", f"{p3['p50_ms']:.1f} ms", f"≤ {TARGET_P3_P50_MS:g} ms",
        verdict(p3["p50_ms"], TARGET_P3_P50_MS, False))
    row("P3 export 50 ids, p95", f"{p3['p95_ms']:.1f} ms")
    if "p3_big" in fig:
        b = fig["p3_big"]
        row(f"P3 {b['users']:,} users, p50", f"{b['p50_ms']:.1f} ms", f"≤ {TARGET_P3_P50_MS:g} ms",
            verdict(b["p50_ms"], TARGET_P3_P50_MS, False))
        row(f"P3 {b['users']:,} users, p95", f"{b['p95_ms']:.1f} ms")
    console.print(table)

    fig["targets"] = {
        "objects_per_s": TARGET_OBJECTS_PER_S, "engine_floor_ratio": TARGET_FLOOR_RATIO,
        "rss_bytes": TARGET_RSS_BYTES, "p2_ratio": TARGET_P2_RATIO, "p3_p50_ms": TARGET_P3_P50_MS,
    }
    if args.json:
        args.json.write_text(json.dumps(fig, indent=2, default=str))
        console.print(f"figures written to {args.json}")
    if args.out is None:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
