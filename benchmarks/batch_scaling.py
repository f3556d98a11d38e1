"""How a track batch's cost grows with its size: P1's mixed objects (seed 7), N of them as one
`ws.apply`, into a fresh copy of a store, for several N. The requests stream from an NDJSON
file as a flow reads them (none held in memory by the benchmark), and each size runs in a
process of its own, so that the peaks do not mix.

    cd /work/main && uv run python benchmarks/build_store.py --users 1000000 --out /tmp/store1m
    uv run python benchmarks/batch_scaling.py /tmp/store1m [--objects 1000000,2000000,4000000]

Prints, per size: wall and CPU seconds, seconds per million objects, and the process's peak RSS
(`VmHWM`; the request file does not enter it). A batch whose cost follows its size
has a flat "s / 1M objects" column. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson

from workload import IdSpace, mixed_requests


def one(store: Path, requests: Path, copy: Path) -> dict[str, float]:
    """Apply the request file to a fresh copy of `store`, in this process."""
    from engagelake import Workspace

    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(store, copy)
    ws = Workspace.open(copy, create=False)
    ws.store.wait_for_merges()
    gc.collect()
    with open(requests, "rb") as lines:
        started, cpu = time.perf_counter(), time.process_time()
        responses = ws.apply(orjson.loads(line) for line in lines)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    ws.store.wait_for_merges()
    ws.close()
    shutil.rmtree(copy, ignore_errors=True)
    return {"wall": wall, "cpu": cpu, "responses": len(responses), "peak_gib": _peak_kib() / 2**20}


def _peak_kib() -> int:
    """This process's peak RSS (`VmHWM`: `ru_maxrss` would keep the parent's, which made the
    requests file, across `exec`)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store", type=Path, help="the store to copy (left as it is)")
    ap.add_argument("--objects", default="1000000,2000000,4000000", help="batch sizes, comma-separated")
    ap.add_argument("--users", type=int, default=1_000_000, help="the users build_store.py made (user-0..)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/batch-scaling"), help="scratch folder (replaced)")
    ap.add_argument("--one", nargs=2, type=Path, metavar=("REQUESTS", "COPY"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:  # the child process: one size
        print(json.dumps(one(args.store, *args.one)))
        return
    sizes = sorted(int(n) for n in args.objects.split(","))
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    requests = args.work / "requests.ndjson"
    # one file of the biggest size; each size applies its first requests (100 objects each)
    with open(requests, "wb") as out:
        for request in mixed_requests(sizes[-1], IdSpace(args.users), np.random.default_rng(7)):
            out.write(orjson.dumps(request) + b"\n")
    print(f"{'objects':>10} {'wall s':>8} {'CPU s':>8} {'s / 1M objects':>15} {'peak RSS GiB':>13}")
    for n in sizes:
        part = args.work / f"first-{n}.ndjson"
        with open(requests, "rb") as whole, open(part, "wb") as out:
            for count, line in enumerate(whole):
                if count * 100 >= n:
                    break
                out.write(line)
        done = subprocess.run([sys.executable, __file__, str(args.store), "--one", str(part), str(args.work / "store")],
                              check=True, capture_output=True, text=True)
        got = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{n:>10,} {got['wall']:>8.2f} {got['cpu']:>8.1f} {got['wall'] / n * 1e6:>15.2f} {got['peak_gib']:>13.2f}",
              flush=True)
        part.unlink()
    shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
