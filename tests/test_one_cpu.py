"""Small batches run on one CPU (`cpus.py`): the calling thread and Polars' pool are pinned to
one CPU while a batch's passes are small, and everything gets its CPUs back after."""

from __future__ import annotations

import os
import re
import threading

import duckdb
import polars as pl
import pyarrow as pa
import pytest

from engagelake import Workspace, cpus
from engagelake import batch as batch_module
from engagelake.rules import duck
from engagelake.rules.profile import reading


def _run_cpus() -> set[int]:
    """The CPUs the test run may use: an xdist worker is pinned to one (`tests/conftest.py`)."""
    if not hasattr(os, "sched_getaffinity"):
        return set()
    given = os.environ.get("ENGAGELAKE_TEST_CPUS")
    return {int(c) for c in given.split(",")} if given else os.sched_getaffinity(0)


CPUS = _run_cpus()
pytestmark = pytest.mark.skipif(len(CPUS) < 2 or not os.path.isdir("/proc/self/task"),
                                reason="pinning needs Linux and two CPUs or more")


@pytest.fixture(autouse=True)
def every_cpu():
    """This process's thread and Polars' pool on every CPU of the run for the test, as in a
    process of its own; pinned back as they were after."""
    before = os.sched_getaffinity(0), pool_threads()
    for tid in (0, *before[1]):
        os.sched_setaffinity(tid, CPUS)
    yield
    os.sched_setaffinity(0, before[0])
    for tid, mask in before[1].items():
        os.sched_setaffinity(tid, mask)


def pool_threads() -> dict[int, set[int]]:
    """Polars' pool threads and their CPUs."""
    pl.DataFrame({"a": [1, 2]}).filter(pl.col("a") > 1)  # the pool exists from here on
    out = {}
    for tid in map(int, os.listdir("/proc/self/task")):
        with open(f"/proc/self/task/{tid}/comm") as f:
            if re.fullmatch(r"polars-\d+", f.read().strip()):
                out[tid] = os.sched_getaffinity(tid)
    assert out, "Polars' pool threads were not found by name"
    return out


def test_pins_the_caller_and_the_pool_then_restores():
    before = pool_threads()
    assert all(mask == CPUS for mask in before.values())
    with cpus.one_cpu() as pin:
        assert pin.cpu is not None and cpus.pinned()
        assert os.sched_getaffinity(0) == {pin.cpu}
        assert all(mask == {pin.cpu} for mask in pool_threads().values())
    assert not cpus.pinned()
    assert os.sched_getaffinity(0) == CPUS
    assert pool_threads() == before


def test_release_ends_the_pin_early_and_twice_is_harmless():
    with cpus.one_cpu() as pin:
        pin.release()
        assert not cpus.pinned() and os.sched_getaffinity(0) == CPUS
        pin.release()
    assert os.sched_getaffinity(0) == CPUS


def test_a_thread_started_while_pinned_gets_its_cpus_back():
    started = threading.Event()
    stop = threading.Event()
    tid: list[int] = []

    def run() -> None:
        tid.append(threading.get_native_id())
        started.set()
        stop.wait(10)

    with cpus.one_cpu() as pin:
        thread = threading.Thread(target=run)
        thread.start()
        started.wait(10)
        assert os.sched_getaffinity(tid[0]) == {pin.cpu}  # inherited
    try:
        assert os.sched_getaffinity(tid[0]) == CPUS
    finally:
        stop.set()
        thread.join()


def test_only_the_first_holder_pins():
    with cpus.one_cpu() as outer:
        assert outer.cpu is not None
        with cpus.one_cpu() as inner:
            assert inner.cpu is None  # nested: runs as it is
        assert os.sched_getaffinity(0) == {outer.cpu}  # the inner one undid nothing
        seen: list[int | None] = []
        other = threading.Thread(target=lambda: seen.append(_pin_in_thread()))
        other.start()
        other.join()
        assert seen == [None]  # concurrent: another thread's holder does not pin either
    assert os.sched_getaffinity(0) == CPUS
    with cpus.one_cpu() as again:  # the first holder is gone: the next one pins
        assert again.cpu is not None


def _pin_in_thread() -> int | None:
    with cpus.one_cpu() as pin:
        return pin.cpu


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(cpus.ENV, "0")
    with cpus.one_cpu() as pin:
        assert pin.cpu is None and not cpus.pinned()
        assert os.sched_getaffinity(0) == CPUS


def test_duckdb_runs_in_the_pinned_thread():
    with cpus.one_cpu(), duck.connection() as con:
        assert con.sql("SELECT current_setting('threads')").fetchall() == [(1,)]
    default = duckdb.connect().sql("SELECT current_setting('threads')").fetchall()
    with duck.connection() as con:
        assert con.sql("SELECT current_setting('threads')").fetchall() == default != [(1,)]


def _spy_on_passes(monkeypatch) -> list[bool]:
    """Whether each track pass ran pinned (the real parse runs)."""
    seen: list[bool] = []
    real = reading.parse_track

    def parse(bodies):
        pinned = cpus.pinned()
        assert (len(os.sched_getaffinity(0)) == 1) == pinned  # the thread's own CPUs say so too
        seen.append(pinned)
        return real(bodies)

    monkeypatch.setattr(reading, "parse_track", parse)
    return seen


def _track(n: int) -> dict:
    return {"method": "POST", "path": "/users/track",
            "body": {"attributes": [{"external_id": f"u{n}", "visits": {"inc": 1}}]}}


def test_a_small_batch_runs_pinned_and_a_big_pass_unpins(tmp_path, monkeypatch):
    ws = Workspace.create(tmp_path / "store")
    seen = _spy_on_passes(monkeypatch)
    assert [r.status for r in ws.apply([_track(1), _track(2)])] == [201, 201]
    assert seen == [True]
    assert os.sched_getaffinity(0) == CPUS  # and back after the batch

    # a pass of more text than the threshold unpins before it runs, for the rest of the batch
    monkeypatch.setattr(batch_module, "ONE_CPU_PASS_BYTES", 100)
    seen.clear()
    export = {"method": "POST", "path": "/users/export/ids",
              "body": {"external_ids": ["u1"], "fields_to_export": ["external_id"]}}
    big = [_track(n) for n in range(3, 8)]
    responses = ws.apply([_track(9), export, *big, export, _track(10)])
    assert [r.status for r in responses] == [201, 200, *[201] * 5, 200, 201]
    assert seen == [True, False, False]
    assert os.sched_getaffinity(0) == CPUS
    assert ws.call("POST", "/users/export/ids", {"external_ids": ["u7"], "fields_to_export": ["custom_attributes"]}
                   ).body["users"] == [{"custom_attributes": {"visits": 1}}]


def test_a_batch_that_fails_gives_the_cpus_back(tmp_path):
    ws = Workspace.create(tmp_path / "store")

    def requests():
        yield _track(1)
        assert cpus.pinned()
        raise RuntimeError("the request source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        ws.apply(requests())
    assert not cpus.pinned() and os.sched_getaffinity(0) == CPUS
    with cpus.one_cpu() as pin:  # nothing was left held
        assert pin.cpu is not None


def test_where_pinning_fails_it_runs_as_it_is(monkeypatch):
    def unreadable() -> int:
        raise ValueError("an unexpected /proc/thread-self/stat")

    monkeypatch.setattr(cpus, "_current_cpu", unreadable)
    with cpus.one_cpu() as pin:
        assert pin.cpu is None and not cpus.pinned() and os.sched_getaffinity(0) == CPUS
    monkeypatch.undo()
    with cpus.one_cpu() as pin:  # nothing was left held
        assert pin.cpu is not None


def _runs_of_users(ws: Workspace, prefixes: str, users: int = 5000) -> None:
    """One run a prefix, each of `users` new users: files of 5 row groups, so that an export
    reads row groups of each (`store/runs.py`), not whole files."""
    for prefix in prefixes:
        responses = ws.apply([{"method": "POST", "path": "/users/track", "body": {"attributes": [
            {"external_id": f"{prefix}{i}", "plan": "pro"} for i in range(start, min(start + 75, users))]}}
            for start in range(0, users, 75)])
        assert {r.status for r in responses} == {201}


def _read_threads(monkeypatch) -> tuple[list[str], list[str]]:
    """The threads that read tables (`read_where`) and row groups (a file's point read):
    spied on, they still run."""
    from engagelake.store import footers, snapshot

    tables: list[str] = []
    groups: list[str] = []
    real_table, real_groups = snapshot.read_where, footers.Footer.read

    def read_where(*args, **kwargs):
        tables.append(threading.current_thread().name)
        return real_table(*args, **kwargs)

    def read_groups(self, *args, **kwargs):
        groups.append(threading.current_thread().name)
        return real_groups(self, *args, **kwargs)
    monkeypatch.setattr(snapshot, "read_where", read_where)
    monkeypatch.setattr(footers.Footer, "read", read_groups)
    return tables, groups


def test_a_pinned_batch_reads_in_its_own_thread_unless_the_reads_are_many(tmp_path, monkeypatch):
    """A small batch (pinned) reads its tables one after another, and a few row groups of
    several files, in its own thread; many row groups go to the read pool; unpinned, the
    tables and files are read side by side."""
    from engagelake.store import runs

    ws = Workspace.create(tmp_path / "store")
    _runs_of_users(ws, "ab")
    export = {"external_ids": ["a7", "b7"], "fields_to_export": ["external_id", "custom_attributes"]}
    answer = {"message": "success", "users": [{"external_id": e, "custom_attributes": {"plan": "pro"}}
                                              for e in ("a7", "b7")]}
    tables, groups = _read_threads(monkeypatch)
    here = threading.current_thread().name
    assert ws.call("POST", "/users/export/ids", export).body == answer
    assert len(tables) == 3 and set(tables) == {here}  # external IDs, then profiles and attributes
    assert groups and set(groups) == {here}  # two files' row groups of external IDs

    tables.clear()
    groups.clear()
    monkeypatch.setattr(runs, "POOLED_READ_GROUPS", 2)  # as many as a big probe's
    assert ws.call("POST", "/users/export/ids", export).body == answer
    assert set(tables) == {here} and any(name.startswith("engagelake-reads") for name in groups)

    tables.clear()
    groups.clear()
    monkeypatch.setattr(runs, "POOLED_READ_GROUPS", 32)
    monkeypatch.setenv(cpus.ENV, "0")  # unpinned: side by side
    assert ws.call("POST", "/users/export/ids", export).body == answer
    assert any(name.startswith("engagelake-prefetch") for name in tables)
    assert any(name.startswith("engagelake-reads") for name in groups)


def test_a_kept_connection_is_left_as_it_was_found():
    """A use's temporary tables and registered frames go when it ends: the next use of the
    same kept connection starts clean (a parse creates its tables `b` and `o` every time)."""
    with duck.connection(1) as con:
        kept = con
        con.execute("CREATE TEMP TABLE b AS SELECT 1 AS a")
        con.register("frame", pa.table({"a": [3]}))
        assert con.execute("SELECT count(*) FROM frame").fetchall() == [(1,)]
    with duck.connection(1) as con:
        assert con is kept
        assert con.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary").fetchall() == [(0,)]
        assert con.execute("SELECT count(*) FROM duckdb_views() WHERE temporary AND NOT internal").fetchall() == [(0,)]
        con.execute("CREATE TEMP TABLE b AS SELECT 4 AS a")  # would fail were `b` still there
        with pytest.raises(duckdb.CatalogException):
            con.execute("SELECT * FROM frame")


def test_a_kept_connection_drops_the_views_a_use_made():
    """A snapshot's views (`Snapshot.duckdb`) are views of the main schema: a kept connection
    drops them too, so that no use reads another's tables (`connections.clear`)."""
    from engagelake.connections import kept

    with kept("views", duckdb.connect) as con:
        first = con
        con.execute("CREATE VIEW profiles AS SELECT 1 AS a")
    with kept("views", duckdb.connect) as con:
        assert con is first
        with pytest.raises(duckdb.CatalogException):
            con.execute("SELECT * FROM profiles")
