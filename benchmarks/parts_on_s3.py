"""Requests and seconds of a bulk export in parts on a Dask cluster over a store on S3.

    cd /work/main && uv run python benchmarks/parts_on_s3.py [--users 20000] [--parts 8] [--runs 2]

Starts moto's S3 server on the loopback (as the tests do), builds a store of `--users` users
there, then runs the flow `export_all` in `--parts` parts on a `DaskTaskRunner` over a
`LocalCluster` of 2 worker processes, `--runs` times, and prints the requests the server
answered and the seconds of each run. The first run's workers open the store; later runs find
it open (`Workspace.open_kept`). On moto a request costs about a millisecond, on S3 10-30 ms:
the requests are the figure to watch.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # flows/ and the tests' S3 helpers

from tests import s3_server  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--parts", type=int, default=8)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    log = Path(tempfile.mkdtemp(prefix="bench-s3-")) / "requests.log"
    server, endpoint = s3_server.start_moto(log)
    os.environ.update(s3_server.environment(endpoint))
    try:
        import boto3
        from distributed import LocalCluster
        from prefect.testing.utilities import prefect_test_harness
        from prefect_dask import DaskTaskRunner

        from engagelake import Workspace
        from flows.export_batch import export_all

        boto3.client("s3").create_bucket(Bucket=s3_server.BUCKET)
        s3 = s3_server.S3(log)
        uri = s3()
        ws = Workspace.open(uri)
        users = [{"external_id": f"u-{n:06d}", "plan": "pro", "visits": n} for n in range(args.users)]
        ws.apply([{"method": "POST", "path": "/users/track", "body": {"attributes": users[i:i + 75]}}
                  for i in range(0, len(users), 75)])
        per_chunk = max(args.users // (args.parts * 2), 1)
        print(f"{args.users:,} users on moto's S3, {len(ws.export_ranges(per_chunk)[1])} key ranges, "
              f"{args.parts} parts, 2 Dask worker processes")
        with prefect_test_harness(), LocalCluster(n_workers=2, processes=True, threads_per_worker=1) as cluster:
            flow = export_all.with_options(task_runner=DaskTaskRunner(address=cluster.scheduler_address))
            for run in range(args.runs):
                out = tempfile.mkdtemp(prefix="bench-s3-export-")
                requests, seconds = s3.during(lambda out=out: flow(out, uri, users_per_chunk=per_chunk,
                                                                   parts=args.parts))
                print(f"run {run + 1}: {len(requests):,} requests ({len(requests) / args.parts:,.0f} a part), "
                      f"{seconds:.2f} s")
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
