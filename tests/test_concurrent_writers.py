"""Several writer processes on one store, and a reader beside them: no batch fails under
ordinary contention, no update is lost, and the reader never sees a torn or backward state.

A batch that another writer overtakes (it committed between our read and our commit) runs
again holding the store's writer lock, so it cannot be overtaken twice (`Workspace._retrying`,
`DeltaStore.exclusive`)."""

from __future__ import annotations

import fcntl
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import SEED, TRACK, export_one, open_ws, unpinned

from engagelake import Workspace
from engagelake.errors import StoreError

WRITERS = 3
BATCHES = 8  # per writer


def _writer(store: str, writer: int) -> list[int]:
    """`BATCHES` batches: each adds 1 to a counter every writer shares (a lost update would
    show in its total) and creates a user of its own. Returns the statuses. Writer 0 keeps an
    in-memory layer, as `engagelake serve` does: it holds the lock until a flush lets the others
    in (`store/layer.py`)."""
    ws = Workspace.open(store, seed=SEED, layer=writer == 0, flush_seconds=0.2)
    statuses = []
    for n in range(BATCHES):
        body = {"attributes": [{"external_id": "shared", "count": {"inc": 1}},
                               {"external_id": f"w{writer}-{n}", "first_name": f"N{n}"}]}
        statuses.append(ws.call("POST", TRACK, body).status)
    ws.close()
    return statuses


def _reader(store: str, done: Any) -> list[int]:
    """The shared counter, read again and again by a workspace of its own until the writers
    are done (a torn read would raise or go backwards)."""
    ws = Workspace.open(store, seed=SEED)
    seen = []
    while not done.is_set():
        user = export_one(ws, "shared", ["custom_attributes"])
        seen.append(0 if user is None else user["custom_attributes"]["count"])
    return seen


@pytest.mark.slow
def test_writers_in_parallel_all_commit_and_lose_no_update(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    assert ws.call("POST", TRACK, {"attributes": [{"external_id": "shared", "count": 0}]}).status == 201
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(WRITERS + 1, mp_context=context, initializer=unpinned) as pool:
        done = manager.Event()
        reader = pool.submit(_reader, ws.store.uri, done)
        writers = [pool.submit(_writer, ws.store.uri, w) for w in range(WRITERS)]
        try:
            statuses = [s for w in writers for s in w.result(timeout=600)]
        finally:  # a failed writer must not leave the reader looping
            done.set()
        seen = reader.result(timeout=60)
    assert statuses == [201] * WRITERS * BATCHES
    again = Workspace.open(ws.store.uri)
    assert export_one(again, "shared", ["custom_attributes"]) == {"custom_attributes": {"count": WRITERS * BATCHES}}
    for w in range(WRITERS):
        for n in range(BATCHES):
            assert export_one(again, f"w{w}-{n}", ["first_name"]) == {"first_name": f"N{n}"}
    assert seen and seen == sorted(seen), "the reader saw the counter go backwards"
    assert seen[-1] <= WRITERS * BATCHES


def test_an_overtaken_batch_runs_again_under_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second attempt holds the writer lock through its reads and commit."""
    ws, other = open_ws(tmp_path), open_ws(tmp_path)
    commit, attempts = ws.store.commit, []

    def overtaken_once(*args: Any, **kwargs: Any) -> None:
        attempts.append(ws.store._exclusive_owner is not None)
        if len(attempts) == 1:
            other.call("POST", TRACK, {"attributes": [{"external_id": "other", "n": 1}]})
        commit(*args, **kwargs)

    monkeypatch.setattr(ws.store, "commit", overtaken_once)
    assert ws.call("POST", TRACK, {"attributes": [{"external_id": "mine", "n": 1}]}).status == 201
    assert attempts == [False, True]
    assert ws.store._exclusive_owner is None
    for user in ("mine", "other"):
        assert export_one(open_ws(tmp_path), user, ["custom_attributes"]) == {"custom_attributes": {"n": 1}}


def test_waiting_for_the_writer_lock_ends_with_a_clear_error(tmp_path: Path) -> None:
    """A batch waits `retry_for` seconds for a writer that holds the lock, then gets an error
    that says what to do, not a hang."""
    ws = open_ws(tmp_path)
    ws.call("POST", TRACK, {"attributes": [{"external_id": "a", "n": 1}]})
    with open(Path(ws.store.uri) / "_writer.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # another writer, mid-commit for a long time
        with pytest.raises(StoreError, match="retry later, or open the workspace with a longer retry_for"):
            with ws.store.exclusive(0.3):
                pass
    with ws.store.exclusive(0.3):  # free again
        assert ws.call("POST", TRACK, {"attributes": [{"external_id": "b", "n": 1}]}).status == 201


def test_a_run_merge_with_nothing_to_merge_hides_no_other_writers_batch(tmp_path: Path) -> None:
    """A run merge reads the ledger's head under the lock; finding nothing to merge, it must
    not leave that head's ledger version noted while the workspace still holds the older head
    (refresh then saw nothing new, and a batch computed on the older head committed over the
    other writer's: the lost update of the parallel-writers test)."""
    ws, other = open_ws(tmp_path), open_ws(tmp_path)
    assert ws.call("POST", TRACK, {"attributes": [{"external_id": "shared", "count": 0}]}).status == 201
    other.store.refresh()
    assert other.call("POST", TRACK, {"attributes": [{"external_id": "shared", "count": {"inc": 1}}]}).status == 201
    assert ws.store.merge_runs() == []  # nothing to merge: two small runs
    assert ws.store.refresh(), "the other writer's batch went unseen"
    assert ws.call("POST", TRACK, {"attributes": [{"external_id": "shared", "count": {"inc": 1}}]}).status == 201
    assert export_one(open_ws(tmp_path), "shared", ["custom_attributes"]) == {"custom_attributes": {"count": 2}}
