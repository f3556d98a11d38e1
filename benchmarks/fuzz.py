"""The long fuzz run of issue 11: random requests through `Workspace.call` and random batches
through `Workspace.apply`, with the kill -9 tests running beside them.

    cd /work/main && uv run python benchmarks/fuzz.py [--calls 10000] [--batches 1000] [--no-crash-tests]

The requests come from the strategies of `tests/test_fuzz_requests.py` (junk types, lone
surrogates, huge integers, deep nesting, NaN and numbers beyond a double, every endpoint and
method), and from three of this file's own (issue 56): bodies and queries holding Python values
(sets, ranges, bytes, objects, datetimes, decimals, tuples, UUIDs) anywhere; a hostile request
(a lone surrogate in a body value, a key or a query, a Python value JSON cannot hold, deep
nesting: `1e999` then 5,000 levels, or a Python body past 254) placed among good track
requests of one batch; and deep nesting alone. Prints, for each run: cases run, crashes (an
exception escaped), answers with a status the API does not use (5xx among them), bodies that
are not strict JSON, bodies that leak a trace (a Python traceback or a source path), and good
requests of a hostile batch that did not answer 201 (`neighbours lost`); then the result of
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
import uuid
from collections import Counter
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the strategies live beside the tests

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from tests.test_fuzz_requests import KEYS, METHODS, PATHS, QUERY_KEYS, STATUSES, requests, scalars  # noqa: E402

from engagelake import Response, Workspace  # noqa: E402

TRACE_MARKS = ("Traceback", 'File "', ".py\", line", "site-packages")
console = Console()


class Opaque:
    """An object JSON has no form for."""


# Python values a pipeline holds: some have a JSON form (sent as an HTTP client would), the
# others answer 400 naming their place
PYTHON_VALUES = st.sampled_from([
    range(3), {1, 2}, frozenset({"a"}), b"bytes", bytearray(b"x"), Opaque(), complex(1, 2), 2**70, -(2**64),
    datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), datetime(2026, 1, 2), date(2000, 1, 2), Decimal("12.50"),
    Decimal("NaN"), Decimal("-Infinity"), Decimal("1e999"), uuid.UUID(int=5), (1, "a"), {1: "non-string key"},
])
python_values = st.recursive(
    scalars | PYTHON_VALUES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)
    | st.tuples(inner, inner), max_leaves=12)
python_requests = st.builds(
    lambda method, path, body, query: {"method": method, "path": path, "body": body, "query": query},
    st.sampled_from(METHODS), st.sampled_from(PATHS),
    python_values | st.fixed_dictionaries({"attributes": st.lists(st.dictionaries(
        st.sampled_from(KEYS), python_values, max_size=4), max_size=3)}),
    st.none() | st.dictionaries(st.sampled_from(QUERY_KEYS), python_values, max_size=2),
)


def _nested(n: int, leaf: Any = 1) -> Any:
    for _ in range(n):
        leaf = [leaf]
    return leaf


def _track(body: Any) -> dict[str, Any]:
    return {"method": "POST", "path": "/users/track", "body": body}


DEEP_TEXT = '{"attributes": [{"external_id": "u1", "n": 1e999, "deep": ' + "[" * 5000 + "]" * 5000 + "}]}"
# one request that must be answered alone (a 400), never make its batch fail
HOSTILE = st.sampled_from([
    _track({"attributes": [{"external_id": "u1", "name": "a\ud800"}]}),
    _track({"attributes": [{"external_id": "u1", "k\udfff": 1}]}),
    _track({"attributes": [{"external_id": "\udc00"}], "events": [{"external_id": "u1", "name": "\ud800"}]}),
    _track(DEEP_TEXT),
    _track(DEEP_TEXT.encode()),
    _track({"attributes": [{"external_id": "u1", "deep": _nested(300)}]}),
    _track({"attributes": [{"external_id": "u1", "r": range(3), "s": {1}}]}),
    {"method": "PUT", "path": "/catalogs/c/items", "body": {"items": [{"id": "\ud800", "n": b"x"}]}},
    {"method": "POST", "path": "/users/merge", "body": {"merge_updates": [{"n": 2**70}]}},
    {"method": "GET", "path": "/scim/v2/Users", "query": {"filter": {"\ud800": ["\udfff", range(2)]}}},
    {"method": "GET", "path": "/catalogs", "query": {"x": _nested(5000)}},
    {"method": "POST", "path": 5, "body": _nested(5000)},
    {"method": "GET", "path": "/campaigns/translations", "query": {"campaign_id": "\ud800", "x": {"\udfff": 1}}},
])


@st.composite
def hostile_batches(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[int]]:
    """Good track requests with hostile ones among them; the positions of the good ones."""
    batch: list[tuple[dict[str, Any], bool]] = [
        (_track({"attributes": [{"external_id": f"g{i}", "n": {"inc": 1}}]}), True) for i in range(draw(st.integers(1, 5)))]
    for _ in range(draw(st.integers(1, 3))):
        batch.insert(draw(st.integers(0, len(batch))), (draw(HOSTILE), False))
    return [request for request, _ in batch], [i for i, (_, good) in enumerate(batch) if good]


deep = st.builds(lambda n, text: ('{"a": 1e999, "b": ' + "[" * n + "]" * n + "}") if text else _nested(n),
                 st.integers(200, 20_000), st.booleans())


def run_hostile(ws: Workspace, case: tuple[list[dict[str, Any]], list[int]], counts: Counter[str]) -> list[Response]:
    batch, good = case
    responses = ws.apply(batch)
    counts["neighbours lost"] += sum(responses[i].status != 201 for i in good)
    return responses


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
            classify(run(ws, case, counts), counts)
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
    ap.add_argument("--python", type=int, default=2_000, help="single requests holding Python values")
    ap.add_argument("--hostile", type=int, default=500, help="batches of good requests with hostile ones among them")
    ap.add_argument("--deep", type=int, default=200, help="deeply nested bodies, as text and as Python")
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
        def one(w: Workspace, r: dict[str, Any], _: Counter[str]) -> list[Response]:
            return [w.call(r["method"], r["path"], r["body"], r["query"])]

        runs = {
            "call": fuzz(ws, requests, args.calls, one),
            "apply": fuzz(ws, st.lists(requests, min_size=1, max_size=6), args.batches,
                          lambda w, b, _: w.apply(b)),
            "call, Python values": fuzz(ws, python_requests, args.python, one),
            "apply, hostile among good": fuzz(ws, hostile_batches(), args.hostile, run_hostile),
            "call, deep nesting": fuzz(ws, deep, args.deep, lambda w, body, _: [w.call("POST", "/users/track", body)]),
        }
        seconds = time.perf_counter() - started
    columns = ("cases", "crashes", "5xx", "unknown status", "not strict JSON", "trace leak", "neighbours lost")
    table = Table("run", *columns)
    for name, counts in runs.items():
        table.add_row(name, *(f"{counts[k]:,}" for k in columns))
    console.print(table)
    console.print(f"fuzzing took {seconds:,.0f} s")
    if crash is not None:
        output, _ = crash.communicate()
        summary = output.strip().splitlines()[-1] if output.strip() else "no output"
        console.print(f"kill -9 tests beside (tests/test_store_crash.py): exit {crash.returncode}, {summary}")


if __name__ == "__main__":
    main()
