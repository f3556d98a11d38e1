"""The long fuzz run of issue 11: random requests through `Workspace.call` and random batches
through `Workspace.apply`, with the kill -9 tests running beside them.

    cd /work/main && uv run python benchmarks/fuzz.py [--calls 10000] [--batches 1000] [--no-crash-tests]

The requests come from the strategies of `tests/test_fuzz_requests.py` (junk types, lone
surrogates, huge integers, deep nesting, NaN and numbers beyond a double, every endpoint and
method). Prints, for calls and batches: cases run, crashes (an exception escaped), answers with
a status the API does not use (5xx among them), bodies that are not strict JSON, and bodies
that leak a trace (a Python traceback or a source path); then the result of
`tests/test_store_crash.py` (SIGKILL at every commit failpoint), run in a process of its own
during the fuzzing. Every count must be 0. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the strategies live beside the tests

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from tests.test_fuzz_requests import STATUSES, requests  # noqa: E402

from engagelake import Response, Workspace  # noqa: E402

TRACE_MARKS = ("Traceback", 'File "', ".py\", line", "site-packages")
console = Console()


def classify(responses: list[Response], counts: Counter[str]) -> None:
    for r in responses:
        if r.status not in STATUSES:
            counts["unknown status" if r.status < 500 else "5xx"] += 1
        try:
            text = json.dumps(r.body, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError, UnicodeEncodeError):
            counts["not strict JSON"] += 1
            continue
        if any(mark.encode() in text for mark in TRACE_MARKS):
            counts["trace leak"] += 1


def fuzz(ws: Workspace, strategy: st.SearchStrategy[Any], cases: int, run: Any) -> Counter[str]:
    counts: Counter[str] = Counter()

    @settings(max_examples=cases, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def one(case: Any) -> None:
        counts["cases"] += 1
        try:
            classify(run(ws, case), counts)
        except Exception as error:  # noqa: BLE001 - counting crashes is the point
            counts["crashes"] += 1
            if counts["crashes"] <= 3:
                console.print(f"[red]crash[/red] {type(error).__name__}: {error}"[:300], markup=False)

    one()
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=10_000, help="random single requests through call")
    ap.add_argument("--batches", type=int, default=1_000, help="random batches (1-6 requests) through apply")
    ap.add_argument("--no-crash-tests", action="store_true", help="do not run the kill -9 tests beside")
    args = ap.parse_args()

    crash = None
    if not args.no_crash_tests:
        # the crash tests are marked slow (out of pytest's default run); one process, no coverage
        crash = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:randomly", "-m", "slow", "-n", "0",
                                  "--no-cov", "tests/test_store_crash.py"], cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
    with tempfile.TemporaryDirectory() as folder:
        ws = Workspace.create(Path(folder) / "store")
        ws.call("POST", "/users/track", {"attributes": [{"external_id": "u1", "n": 1}]})
        fields = [{"name": "id", "type": "string"}, {"name": "n", "type": "number"}]
        ws.call("POST", "/catalogs", {"catalogs": [{"name": "c", "description": "d", "fields": fields}]})
        started = time.perf_counter()
        calls = fuzz(ws, requests, args.calls,
                     lambda w, r: [w.call(r["method"], r["path"], r["body"], r["query"])])
        batches = fuzz(ws, st.lists(requests, min_size=1, max_size=6), args.batches,
                       lambda w, b: w.apply(b))
        seconds = time.perf_counter() - started
    table = Table("run", "cases", "crashes", "5xx", "unknown status", "not strict JSON", "trace leak")
    for name, counts in (("call", calls), ("apply", batches)):
        table.add_row(name, *(f"{counts[k]:,}" for k in ("cases", "crashes", "5xx", "unknown status",
                                                          "not strict JSON", "trace leak")))
    console.print(table)
    console.print(f"fuzzing took {seconds:,.0f} s")
    if crash is not None:
        output, _ = crash.communicate()
        summary = output.strip().splitlines()[-1] if output.strip() else "no output"
        console.print(f"kill -9 tests beside (tests/test_store_crash.py): exit {crash.returncode}, {summary}")


if __name__ == "__main__":
    main()
