"""Durability of the batch commit protocol under a real crash (SIGKILL) at every failpoint.

A child process (tests/crash_worker.py) applies BATCH_2 to a store that already holds BATCH_1 and
kills itself at one failpoint. The store must then open to exactly the state after BATCH_1 (or
after both batches when the ledger row was written), and running BATCH_2 again under the same
idempotency key must give exactly the store an uninterrupted run gives.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from deltalake import DeltaTable
from tests.crash_worker import (
    BATCH_1,
    BATCH_2,
    CRASH_POINTS,
    KEY_1,
    KEY_2,
    TRACK,
    WRITTEN,
    counts,
    disk_versions,
    ledger_batches,
    ledger_versions,
    open_store,
    run_worker,
    snapshot,
    tables_ahead,
)

from engagelake.store.layout import MERGE_ENV, SIDE_BY_SIDE
from engagelake.store.writes import WRITE_THREADS
from engagelake.tables.schema import STORED, TABLES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """A store after BATCH_1 (the crash tests copy it) and one after both batches, no crash."""
    root = tmp_path_factory.mktemp("reference")
    base = root / "base"
    ws = open_store(base)
    first = ws.apply(BATCH_1, idempotency_key=KEY_1)
    assert [r.status for r in first] == [201]
    base_snap = snapshot(ws)
    base_versions = disk_versions(base)

    full = root / "full"
    shutil.copytree(base, full)
    ws = open_store(full)
    responses = ws.apply(BATCH_2, idempotency_key=KEY_2)
    assert [r.status for r in responses] == [201, 201, 202, 200], responses
    assert len(responses[-1].body["users"]) == 4  # the export saw the whole batch
    full_versions = disk_versions(full)
    # BATCH_2 writes every table (so every after_table failpoint fires) and one ledger row.
    assert all(full_versions[t] == base_versions[t] + 1 for t in WRITTEN), (
        base_versions,
        full_versions,
    )
    return SimpleNamespace(
        base=base,
        full=full,
        base_snap=base_snap,
        responses=responses,
        full_snap=snapshot(open_store(full)),
        full_counts=counts(open_store(full)),
        base_counts=counts(open_store(base)),
    )


def crash(store: Path, point: str) -> None:
    proc = run_worker(store, point)
    assert proc.returncode == -signal.SIGKILL, (
        f"the child did not die by SIGKILL at {point}: rc={proc.returncode}\n{proc.stderr[-3000:]}"
    )


def assert_no_uncommitted_rows(store: Path) -> None:
    """On disk, the newest version of every table holds exactly what the ledger's version holds."""
    named = ledger_versions(store)
    for name in TABLES:
        latest = DeltaTable(f"{store}/{name}").to_pyarrow_table().num_rows
        pinned = DeltaTable(f"{store}/{name}", version=named[name]).to_pyarrow_table().num_rows
        assert latest == pinned, f"{name}: {latest} rows on disk, {pinned} committed"


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_then_rerun_equals_uninterrupted_run(
    tmp_path: Path, ref: SimpleNamespace, point: str
) -> None:
    crash_then_rerun(tmp_path, ref, point)


@pytest.mark.parametrize("point", ["merge:profiles", "merge:events", "before_merge_ledger"])
def test_crash_while_merging_runs_loses_nothing(
    tmp_path: Path, ref: SimpleNamespace, point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BATCH_2 commits, then the merge pass that follows it (every table merges its two runs)
    dies: the store reads as after BATCH_2, the next writer rolls the torn merge back, and its
    own merge pass merges the runs."""
    monkeypatch.setenv(MERGE_ENV, "0")
    store = tmp_path / "store"
    shutil.copytree(ref.base, store)
    crash(store, point)
    assert ledger_batches(store) == 3  # creation, BATCH_1, BATCH_2: committed before its merges
    assert "profiles" in tables_ahead(store)  # a merged run the ledger does not name

    ws = open_store(store)
    assert snapshot(ws) == ref.full_snap
    assert ws.apply(BATCH_2, idempotency_key=KEY_2) == ref.responses  # a replay: nothing runs again
    assert "profiles" in ws.store.merge_runs()  # rolls the torn merge back first
    assert tables_ahead(store) == set()
    merged = snapshot(open_store(store))
    assert merged["head"][1:] == ref.full_snap["head"][1:]  # one more ledger row, of kind "merge"
    assert (merged["export"], merged["tables"]) == (ref.full_snap["export"], ref.full_snap["tables"])
    ws.store.refresh()
    for name in ("profiles", "attributes", "events"):  # one run each
        assert len(ws.store.runs(name, ws.store.head.versions[name])) == 1, name


def crash_then_rerun(tmp_path: Path, ref: SimpleNamespace, point: str) -> Path:
    store = tmp_path / "store"
    shutil.copytree(ref.base, store)

    crash(store, point)

    # The child died where it was told to: the tables written so far are ahead of the ledger.
    committed = point == "after_ledger"
    assert ledger_batches(store) == (3 if committed else 2)  # creation row, BATCH_1[, BATCH_2]
    if point.startswith("after_table:"):
        written = WRITTEN[: WRITTEN.index(point.removeprefix("after_table:")) + 1]
        assert tables_ahead(store) == set(written)
    elif point == "before_ledger":
        assert tables_ahead(store) == set(WRITTEN)
    else:
        assert tables_ahead(store) == set()

    # Opening reads the committed versions: exactly the last committed batch, nothing of a torn
    # one. A reader changes nothing on disk (the dead writer's appends stay until a writer runs).
    before_open = disk_versions(store)
    ws = open_store(store)
    expected = ref.full_snap if committed else ref.base_snap
    assert counts(ws) == (ref.full_counts if committed else ref.base_counts)
    assert ws.export_users() == expected["export"]
    assert snapshot(ws) == expected
    assert disk_versions(store) == before_open

    # The same batch under the same key again, without a crash: the uninterrupted result. The
    # writer first rolls back the dead writer's appends, so nothing of them is published.
    assert ws.apply(BATCH_2, idempotency_key=KEY_2) == ref.responses
    if not committed:
        assert_no_uncommitted_rows(store)
    assert snapshot(ws) == ref.full_snap
    assert snapshot(open_store(store)) == ref.full_snap  # durable, not just in memory

    # A third time changes nothing: the stored responses, no new Delta commit anywhere.
    before = disk_versions(store)
    again = open_store(store)
    assert again.apply(BATCH_2, idempotency_key=KEY_2) == ref.responses
    assert disk_versions(store) == before
    assert snapshot(again) == ref.full_snap
    assert snapshot(open_store(store)) == ref.full_snap
    return store


@pytest.mark.parametrize("table", ["profiles", "events"])
def test_crash_while_tables_are_written_side_by_side(tmp_path: Path, ref: SimpleNamespace, table: str) -> None:
    """The commit's tables are written in two threads (`writes.TableWrites`): a crash as one
    write ends, with another one running, leaves any set of tables ahead of the ledger. The
    store opens to the batch before, and the batch run again gives the uninterrupted store."""
    if WRITE_THREADS < 2:
        pytest.skip("one CPU: tables are written one by one")
    store = tmp_path / "store"
    shutil.copytree(ref.base, store)
    crash(store, f"{SIDE_BY_SIDE}after_table:{table}")
    assert ledger_batches(store) == 2
    assert {table} <= tables_ahead(store) <= set(WRITTEN)
    ws = open_store(store)
    assert ws.export_users() == ref.base_snap["export"]
    assert snapshot(ws) == ref.base_snap
    assert ws.apply(BATCH_2, idempotency_key=KEY_2) == ref.responses
    assert_no_uncommitted_rows(store)
    assert snapshot(open_store(store)) == ref.full_snap


@pytest.mark.parametrize("point", ["after_table:events", "before_ledger"])
def test_writer_opened_before_a_crash_does_not_publish_the_torn_batch(
    tmp_path: Path, ref: SimpleNamespace, point: str
) -> None:
    """A Workspace opened before another process crashed mid-commit writes its next batch on top
    of the tables' committed versions, not on top of the dead writer's orphaned appends."""
    store = tmp_path / "store"
    shutil.copytree(ref.base, store)
    next_batch = [
        {
            "method": "POST",
            "path": TRACK,
            "body": {
                "events": [{"external_id": "u1", "name": "later", "time": "2026-11-22T11:55:00Z"}]
            },
        }
    ]
    expected_dir = tmp_path / "expected"
    shutil.copytree(ref.base, expected_dir)
    expected_ws = open_store(expected_dir)
    expected_responses = expected_ws.apply(next_batch)
    expected = snapshot(expected_ws)

    long_lived = open_store(store)
    crash(store, point)
    assert long_lived.apply(next_batch) == expected_responses
    assert snapshot(long_lived) == expected
    fresh = open_store(store)
    assert fresh.table("events").collect()["name"].to_list().count("played") == 0, "BATCH_2's events leaked"
    assert snapshot(fresh) == expected


@pytest.mark.parametrize("table", [TABLES[0], "events", "merges", "the last one rewritten", "_ledger"])
def test_crash_during_compaction_rolls_forward_to_the_same_content(
    tmp_path: Path, ref: SimpleNamespace, table: str
) -> None:
    """Compaction changes no content: killed after rewriting (and vacuuming) some tables, the
    store opens to exactly what it held before, and compacting again finishes the job."""
    store = tmp_path / "store"
    shutil.copytree(ref.full, store)
    before = snapshot(open_store(store))
    if table == "the last one rewritten":  # tables nothing was written to are left as they are
        untouched = open_store(store).store.compactor.never_written()
        table = [name for name in STORED if name not in untouched][-1]
    proc = run_worker(store, f"compact:{table}")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]

    ws = open_store(store)  # a writer rolls the dead compaction forward on its next commit
    ws.compact()
    assert _content(snapshot(open_store(store))) == _content(before)
    assert not (store / "_compacting").exists()


def _content(snap: dict) -> dict:
    """A snapshot without the batch counter (compaction is a batch of its own)."""
    return {k: v for k, v in snap.items() if k != "head"}
