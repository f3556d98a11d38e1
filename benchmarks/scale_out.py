"""Bulk export in parts: one process against a Dask cluster of worker processes.

    cd /work/main && uv run python benchmarks/scale_out.py --store /tmp/store1m [--workers 2] [--parts 4]

Runs the Prefect flow `export_all` over a store (a copy is not needed: an export only reads)
three ways, each into a fresh folder, under a temporary Prefect server:

1. `parts=1`: one task in the flow's process (the export as it always ran);
2. `--parts` parts on the flow's default task runner (threads of the flow's process);
3. `--parts` parts on a `DaskTaskRunner` over a `LocalCluster` of `--workers` worker processes
   (one thread each), started before the timing.

It prints each run's wall time, users per second and the speed-up against the first, checks
that the three pairs of files are the same (the lines byte for byte), and measures the fixed
cost of a Prefect task on the cluster with no-op tasks. The model built on these figures is in
`docs/scale-out.md`.

    uv run python benchmarks/scale_out.py --store /tmp/store1m --compaction [--workers 2] [--parts 4]

times the flow `compact_store` instead, on two fresh copies of the store: in one piece in the
flow's process, and with each big table cut into `--parts` key ranges written on the Dask
cluster; then checks that both copies hold the same current rows in every table.

    uv run python benchmarks/scale_out.py --store /tmp/store1m --track [--objects 1000000] [--workers 2]

times the flow `track_batch` on P1's batch (`bench_track.py`: mixed track objects into the
store's users, one request file) on fresh copies of the store: `parts=1` in the flow's process
(the batch as it always ran), then `parts=N` with each pass's requests read (parsed and
checked) in N shares on a `LocalCluster` of 1 worker process and of N (one thread each); then
checks that the responses and the stores' current rows are the same.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # flows/ beside src/

from distributed import LocalCluster  # noqa: E402
from prefect import flow, task  # noqa: E402
from prefect.testing.utilities import prefect_test_harness  # noqa: E402
from prefect_dask import DaskTaskRunner  # noqa: E402

from engagelake import Workspace  # noqa: E402
from engagelake.tables.schema import TABLES  # noqa: E402
from flows.export_batch import ExportResult, export_all  # noqa: E402
from flows.track_batch import compact_store  # noqa: E402


@task
def noop(n: int) -> int:
    return n


@flow
def noops(count: int) -> list[int]:
    return [future.result() for future in noop.map(list(range(count)))]


def timed(label: str, run: Callable[[], ExportResult], baseline: float | None) -> tuple[ExportResult, float]:
    started = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - started
    ratio = f"{baseline / seconds:5.2f}x" if baseline else "  1.00x"
    print(f"{label:<44}{seconds:9.2f} s{result.users / seconds:12,.0f} users/s   {ratio}")
    return result, seconds


def same(a: ExportResult, b: ExportResult) -> bool:
    import polars as pl

    return (a.users == b.users and a.ndjson_path.read_bytes() == b.ndjson_path.read_bytes()
            and pl.read_parquet(a.parquet_path).equals(pl.read_parquet(b.parquet_path)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True, help="the store to export (read only)")
    parser.add_argument("--workers", type=int, default=2, help="Dask worker processes (default 2)")
    parser.add_argument("--parts", type=int, default=4, help="parts of the export (default 4)")
    parser.add_argument("--users-per-chunk", type=int, default=50_000)
    parser.add_argument("--compaction", action="store_true", help="time compact_store instead of export_all")
    parser.add_argument("--track", action="store_true", help="time track_batch on P1's batch instead")
    parser.add_argument("--objects", type=int, default=1_000_000, help="--track: P1's objects")
    args = parser.parse_args()
    if args.compaction:
        compaction(args.store, args.workers, args.parts)
        return
    if args.track:
        track(args.store, args.workers, args.objects)
        return

    out = Path(tempfile.mkdtemp(prefix="bench-scale-out-"))
    batch, ranges = Workspace.open(args.store, create=False).export_ranges(args.users_per_chunk)
    print(f"store {args.store}: batch {batch}, {len(ranges)} key ranges of about {args.users_per_chunk:,} users")
    try:
        with prefect_test_harness(), LocalCluster(n_workers=args.workers, processes=True,
                                                  threads_per_worker=1) as cluster:
            dask = DaskTaskRunner(address=cluster.scheduler_address)
            export = export_all.with_options(task_runner=dask)
            one, base = timed("parts=1, in the flow's process", lambda: export_all(
                str(out / "one"), args.store, users_per_chunk=args.users_per_chunk), None)
            threads, _ = timed(f"parts={args.parts}, threads of the flow's process", lambda: export_all(
                str(out / "threads"), args.store, users_per_chunk=args.users_per_chunk, parts=args.parts), base)
            on_dask, _ = timed(f"parts={args.parts}, {args.workers} Dask worker processes", lambda: export(
                str(out / "dask"), args.store, users_per_chunk=args.users_per_chunk, parts=args.parts), base)
            print(f"same files: threads {same(threads, one)}, Dask {same(on_dask, one)}")
            # the fixed cost of a task on the cluster: no-op tasks, as many as the workers run at once
            count = 8 * args.workers
            noops.with_options(task_runner=dask)(args.workers)  # the workers import Prefect once
            started = time.perf_counter()
            noops.with_options(task_runner=dask)(count)
            overhead = (time.perf_counter() - started) / count * args.workers
            print(f"a Prefect task on the cluster costs {overhead * 1000:.0f} ms of a worker "
                  f"({count} no-op tasks on {args.workers} workers)")
    finally:
        shutil.rmtree(out, ignore_errors=True)


def compaction(store: str, workers: int, parts: int) -> None:
    """`compact_store` on a copy of `store` in one piece, then in `parts` on the cluster."""
    out = Path(tempfile.mkdtemp(prefix="bench-scale-out-", dir=Path(store).parent))
    try:
        for name in ("one", "dask"):
            shutil.copytree(store, out / name)
        with prefect_test_harness(), LocalCluster(n_workers=workers, processes=True, threads_per_worker=1) as cluster:
            dask = DaskTaskRunner(address=cluster.scheduler_address)
            started = time.perf_counter()
            compact_store(str(out / "one"))
            base = time.perf_counter() - started
            print(f"compact_store in one piece, in the flow's process: {base:.2f} s")
            started = time.perf_counter()
            compact_store.with_options(task_runner=dask)(str(out / "dask"), parts=parts)
            seconds = time.perf_counter() - started
            with Workspace.open(out / "dask").compaction(parts) as job:
                count = len(job.plan.parts)
            print(f"compact_store(parts={parts}) on {workers} Dask worker processes: {seconds:.2f} s, "
                  f"{base / seconds:.2f}x ({count} parts)")
        one, dask_copy = Workspace.open(out / "one"), Workspace.open(out / "dask")
        equal = all(one.table(name).collect().equals(dask_copy.table(name).collect()) for name in TABLES)
        print(f"same current rows in every table: {equal}")
    finally:
        shutil.rmtree(out, ignore_errors=True)


def track(store: str, workers: int, objects: int) -> None:
    """`track_batch` over P1's request file, on fresh copies of `store`: in the flow's process,
    then with its passes read in `workers` shares on clusters of 1 and `workers` processes."""
    import numpy as np
    import orjson
    import polars as pl

    from engagelake.files import read_responses_file
    from flows.track_batch import track_batch
    from workload import IdSpace, mixed_requests

    out = Path(tempfile.mkdtemp(prefix="bench-scale-out-", dir=Path(store).parent))
    try:
        users = Workspace.open(store, create=False).table("profiles").select(pl.len()).collect().item()
        rng = np.random.default_rng(7)
        requests = mixed_requests(objects, IdSpace(users), rng)
        (out / "requests").mkdir()
        with open(out / "requests" / "p1.ndjson", "wb") as f:
            f.writelines(orjson.dumps(r) + b"\n" for r in requests)
        print(f"P1: {objects:,} objects in {len(requests):,} requests into {users:,} users")
        del requests
        runs = [("one", "parts=1, in the flow's process", 0, 1),
                ("w1", f"parts={workers}, 1 Dask worker process", 1, workers),
                ("wn", f"parts={workers}, {workers} Dask worker processes", workers, workers)]
        seconds: dict[str, float] = {}
        with prefect_test_harness():
            for name, label, cluster_workers, parts in runs:
                shutil.copytree(store, out / name)
                folder = out / f"requests-{name}"
                shutil.copytree(out / "requests", folder)
                if cluster_workers:
                    with LocalCluster(n_workers=cluster_workers, processes=True, threads_per_worker=1) as cluster:
                        flow_ = track_batch.with_options(task_runner=DaskTaskRunner(address=cluster.scheduler_address))
                        noops.with_options(task_runner=DaskTaskRunner(address=cluster.scheduler_address))(
                            cluster_workers)  # the workers import Prefect before the timing
                        started = time.perf_counter()
                        flow_(str(folder), str(out / name), parts=parts)
                        seconds[name] = time.perf_counter() - started
                else:
                    started = time.perf_counter()
                    track_batch(str(folder), str(out / name), parts=parts)
                    seconds[name] = time.perf_counter() - started
                base = seconds["one"]
                print(f"{label:<44}{seconds[name]:9.2f} s{objects / seconds[name]:12,.0f} objects/s   "
                      f"{base / seconds[name]:5.2f}x")
        print(f"{workers} workers against 1: {seconds['w1'] / seconds['wn']:.2f}x")
        responses = {name: read_responses_file(out / f"requests-{name}" / "p1.responses.ndjson") for name, *_ in runs}
        print("same responses:", all(responses[name] == responses["one"] for name in responses))
        statuses = {name: Workspace.open(out / name).table("profiles").select(pl.len()).collect().item()
                    for name, *_ in runs}
        print("same profiles count:", len(set(statuses.values())) == 1, statuses)
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
