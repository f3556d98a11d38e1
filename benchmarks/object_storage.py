"""Requests and seconds per call of a store on object storage, as its history grows.

    cd /work/main && uv run python benchmarks/object_storage.py [--calls N] [--latency-ms MS]

Starts moto's S3 server as a process on the loopback (as the tests do), creates a store on it
and applies `--calls` small keyed batches one after the other (one track request of one user,
as a flow applies a file: `apply(..., idempotency_key=...)`), each followed by the run merges
it makes due. For some calls it prints how many requests the server answered, by kind (log
entries read, lists, data objects read, objects written, the lease), and the seconds taken;
then the same for a fresh process's open, export and track call at the end.

On moto a request costs about a millisecond; on S3 one costs 10-30 ms, so the requests matter
more than moto's seconds. `--latency-ms` prints what the requests alone would cost one after
the other at that latency (an upper bound: some are made side by side). The figure to watch is
whether a call's requests grow with the calls before it: they should not.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' S3 server helpers

from tests import s3_server  # noqa: E402

BUCKET = "bench"


def start_moto(log: Path) -> subprocess.Popen[bytes]:
    server, endpoint = s3_server.start_moto(log)
    os.environ.update(s3_server.environment(endpoint))
    import boto3

    boto3.client("s3").create_bucket(Bucket=BUCKET)
    return server


def kind(method: str, path: str) -> str:
    if "list-type=" in path:
        return "lists"
    if "_writer_lease" in path:
        return "lease"
    if method in ("PUT", "POST", "DELETE"):
        return "writes"
    if "_delta_log/" in path:
        return "log reads"
    return "data reads"


KINDS = ["log reads", "lists", "data reads", "writes", "lease"]


def row(label: str, requests: list[tuple[str, str]], seconds: float, latency_ms: float) -> None:
    kinds = Counter(kind(m, p) for m, p in requests)
    cells = "".join(f"{kinds[k]:>11,}" for k in KINDS)
    projected = len(requests) * latency_ms / 1000
    print(f"{label:<28}{len(requests):>9,}{cells}{seconds:>10.2f}{projected:>12.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=100, help="small keyed batches to apply (default 100)")
    parser.add_argument("--latency-ms", type=float, default=20.0,
                        help="a request's latency on real object storage, for the projection (default 20)")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    server = start_moto(folder / "moto.log")
    log = s3_server.S3(folder / "moto.log")
    from engagelake import Workspace

    uri = f"s3://{BUCKET}/store"
    try:
        print(f"{'step':<28}{'requests':>9}" + "".join(f"{k:>11}" for k in KINDS)
              + f"{'moto s':>10}{f'at {args.latency_ms:g} ms':>12}")
        opened: list[Workspace] = []
        row("create", *log.during(lambda: opened.append(Workspace.open(uri, seed="bench"))), args.latency_ms)
        ws = opened[0]
        shown = {1, 2, 10, args.calls // 2, args.calls}

        def track(k: int) -> None:
            body = {"attributes": [{"external_id": f"user-{k}", "visits": {"inc": 1}, "email": f"u{k}@example.com"}]}
            responses = ws.apply([{"method": "POST", "path": "/users/track", "body": body}],
                                 idempotency_key=f"batch-{k}")
            assert responses[0].status == 201, responses
            ws.store.wait_for_merges()  # the merge a call makes due counts as its own

        per_call = []
        for k in range(1, args.calls + 1):
            requests, seconds = log.during(lambda k=k: track(k))
            per_call.append(len(requests))
            if k in shown:
                row(f"call {k}", requests, seconds, args.latency_ms)
        if ws.store.merge_errors:
            print(f"run merges failed: {ws.store.merge_errors[0]}")
        ws.close()
        fresh: list[Workspace] = []
        row("fresh process: open", *log.during(lambda: fresh.append(Workspace.open(uri, create=False))),
            args.latency_ms)
        query = {"external_ids": ["user-1"], "fields_to_export": ["external_id", "email"]}
        row("  export of one user", *log.during(lambda: fresh[0].call("POST", "/users/export/ids", query)),
            args.latency_ms)
        body = {"attributes": [{"external_id": "user-1", "visits": {"inc": 1}}]}
        row("  track call", *log.during(lambda: fresh[0].call("POST", "/users/track", body)), args.latency_ms)
        print("requests of each call:", " ".join(map(str, per_call)))
        tenth = max(len(per_call) // 10, 1)
        print(f"\nrequests per call: median of the first {tenth} calls {sorted(per_call[:tenth])[tenth // 2]}, "
              f"of the last {tenth} {sorted(per_call[-tenth:])[tenth // 2]} (flat: history costs nothing)")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
