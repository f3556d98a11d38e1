"""P1 on a copy of an existing store: `bench_track.py`'s mixed track objects (seed 7) applied
with one `ws.apply` to a fresh copy of the store, timed with its CPU and peak RSS.

    cd /work/main && uv run python benchmarks/build_store.py --users 1000000 --out /tmp/store1m
    uv run python benchmarks/p1_on_copy.py /tmp/store1m [--objects 1000000] [--copy /tmp/p1store]

Quicker than `bench_track.py` (no store built each run) and the same batch each run, so two
versions of the code can be compared pair by pair (`farm-bench --vs`, with `PYTHONPATH`
naming the other version's `src`). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import time
from pathlib import Path

import numpy as np
import orjson

from engagelake import Workspace
from harness import RssSampler
from workload import IdSpace, mixed_requests


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store", type=Path, help="the store to copy (left as it is)")
    ap.add_argument("--objects", type=int, default=1_000_000)
    ap.add_argument("--users", type=int, default=1_000_000, help="the users build_store.py made (user-0..)")
    ap.add_argument("--copy", type=Path, default=Path("/tmp/p1-on-copy"), help="where the copy goes (replaced)")
    args = ap.parse_args()
    shutil.rmtree(args.copy, ignore_errors=True)
    shutil.copytree(args.store, args.copy)
    ws = Workspace.open(args.copy, create=False)
    users = args.users
    lines = [orjson.dumps(r) for r in mixed_requests(args.objects, IdSpace(users), np.random.default_rng(7))]
    ws.store.wait_for_merges()
    gc.collect()
    with RssSampler() as rss:
        started, cpu = time.perf_counter(), time.process_time()
        responses = ws.apply(orjson.loads(line) for line in lines)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    ws.store.wait_for_merges()
    print(f"P1 {args.objects:,} objects into {users:,} users: {wall:.2f} s wall, {cpu:.1f} s CPU, "
          f"peak RSS {rss.peak / 2**30:.2f} GiB, {len(responses):,} responses")
    shutil.rmtree(args.copy, ignore_errors=True)


if __name__ == "__main__":
    main()
