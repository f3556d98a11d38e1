"""The in-memory layer and its write-ahead log (`store/layer.py`, `store/wal.py`): a layered
workspace answers a batch once its record is synced, reads its own batches before they are in
the tables, and a flush writes them as one commit that equals committing them one by one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import EXPORT, NOW, SEED, TRACK

import engagelake.batch as batch_module
from engagelake import Workspace
from engagelake.errors import IdempotencyKeyReused
from engagelake.store import wal

FIELDS = ["external_id", "first_name", "email", "custom_attributes", "custom_events", "purchases"]


def _requests() -> list[list[dict[str, Any]]]:
    """Batches that create, update, count, delete and name users, with events and purchases."""
    def track(**body: Any) -> dict[str, Any]:
        return {"method": "POST", "path": TRACK, "body": body}

    return [
        [track(attributes=[{"external_id": f"u{n}", "first_name": f"F{n}", "email": f"u{n}@example.com",
                            "visits": {"inc": 1}} for n in range(6)])],
        [track(attributes=[{"external_id": "u1", "first_name": "Ann", "visits": {"inc": 2}}],
               events=[{"external_id": "u2", "name": "opened", "time": "2026-01-15T11:00:00Z"}]),
         track(purchases=[{"external_id": "u3", "product_id": "p1", "currency": "USD", "price": 9.5,
                           "time": "2026-01-15T11:00:00Z"}])],
        [{"method": "POST", "path": "/users/delete", "body": {"external_ids": ["u4"]}}],
        [track(attributes=[{"external_id": "u4", "first_name": "Again"}, {"external_id": "u1", "email": "new@example.com"}])],
        [{"method": "POST", "path": "/users/external_ids/rename",
          "body": {"external_id_renames": [{"current_external_id": "u5", "new_external_id": "u50"}]}}],
        [{"method": "POST", "path": "/users/merge",
          "body": {"merge_updates": [{"identifier_to_merge": {"external_id": "u2"},
                                      "identifier_to_keep": {"external_id": "u3"}}]}}],
        [track(attributes=[{"external_id": "u3", "visits": {"inc": 5}}])],
    ]


def _export(ws: Workspace) -> list[dict[str, Any]]:
    return ws.export_users()


def _run(ws: Workspace, batches: list[list[dict[str, Any]]], between: Callable[[int], None] = lambda _: None) -> list[Any]:
    answers = []
    for n, batch in enumerate(batches):
        answers += [(r.status, r.body) for r in ws.apply(batch)]
        between(n)
    return answers


def _current(ws: Workspace) -> dict[str, list[dict[str, Any]]]:
    """Every table's current rows, in a fixed order (the batch a lineage row names is drawn at random)."""
    out = {}
    for name in ws.table_names():
        frame = ws.table(name).collect()
        frame = frame.drop([c for c in ("batch",) if c in frame.columns])
        out[name] = frame.sort(frame.columns, nulls_last=True).to_dicts()
    return out


def _open(path: Path, **options: Any) -> Workspace:
    return Workspace.open(path, seed=SEED, clock=lambda: NOW, **options)


def test_layered_batches_answer_read_and_flush_as_commits_do(tmp_path: Path) -> None:
    plain = _open(tmp_path / "plain")
    layered = _open(tmp_path / "layered", layer=True, flush_seconds=3600)
    batches = _requests()
    assert _run(layered, batches) == _run(plain, batches)
    assert layered.layer is not None and len(layered.layer) == len(batches)  # none written yet
    assert _export(layered) == _export(plain)  # read through the layer
    outside = Workspace.open(tmp_path / "layered")  # another reader sees the tables only
    assert outside.export_users() == []
    assert layered.flush() == len(batches)
    assert not wal.segments(tmp_path / "layered")  # the log is trimmed
    assert _current(layered) == _current(plain)
    assert outside.export_users() == _export(plain)
    assert layered.store.head.next_profile_n == plain.store.head.next_profile_n
    assert layered.store.head.next_update_seq == plain.store.head.next_update_seq
    assert Workspace.check(tmp_path / "layered").healthy
    layered.close()


def test_batches_after_a_flush_read_the_tables_and_the_layer(tmp_path: Path) -> None:
    plain = _open(tmp_path / "plain")
    layered = _open(tmp_path / "layered", layer=True, flush_seconds=3600)
    batches = _requests()
    flushed = {1, 3, 4}
    assert _run(layered, batches, lambda n: layered.flush() if n in flushed else None) == _run(plain, batches)
    assert _export(layered) == _export(plain)
    layered.close()
    assert _current(layered) == _current(plain)


def test_a_big_batch_flushes_the_layer_and_runs_over_the_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_module, "TRACK_RUN_MAX", 2)  # a pass of two requests is "big"
    monkeypatch.setattr(batch_module, "STAGE_ROWS", 1)
    plain = _open(tmp_path / "plain")
    layered = _open(tmp_path / "layered", layer=True, flush_seconds=3600)
    small, *rest = _requests()
    big = [r for batch in rest for r in batch]
    assert _run(layered, [small, big]) == _run(plain, [small, big])
    assert layered.layer is not None and len(layered.layer) == 0  # the big batch committed on its own
    assert _current(layered) == _current(plain)
    layered.close()


def test_idempotency_keys_are_found_in_the_layer(tmp_path: Path) -> None:
    ws = Workspace.open(tmp_path / "store", seed=SEED, layer=True, flush_seconds=3600)
    body = {"attributes": [{"external_id": "u1", "visits": {"inc": 1}}]}
    first = ws.apply([{"method": "POST", "path": TRACK, "body": body}], idempotency_key="k")
    again = ws.apply([{"method": "POST", "path": TRACK, "body": body}], idempotency_key="k")
    assert [(r.status, r.body) for r in again] == [(r.status, r.body) for r in first]
    assert ws.batch_committed_at("k") is not None
    with pytest.raises(IdempotencyKeyReused):
        ws.apply([{"method": "POST", "path": TRACK, "body": {"attributes": [{"external_id": "u2"}]}}],
                 idempotency_key="k")
    ws.close()
    reopened = Workspace.open(tmp_path / "store")
    assert reopened.batch_committed_at("k") is not None
    assert reopened.call("POST", EXPORT, {"external_ids": ["u1"], "fields_to_export": ["custom_attributes"]}).body[
        "users"] == [{"custom_attributes": {"visits": 1}}]


def test_every_answer_follows_the_sync_of_its_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = Workspace.open(tmp_path / "store", seed=SEED, layer=True, flush_seconds=3600)
    events: list[tuple[str, int]] = []  # ("sync", log size synced) and ("answer", log size then)
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        real(fd)
        events.append(("sync", os.fstat(fd).st_size))

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    for batch in _requests():
        ws.apply(batch)
        (segment,) = wal.segments(tmp_path / "store")
        events.append(("answer", segment.stat().st_size))
    monkeypatch.undo()
    # before each answer, the whole log as it then was had been synced
    for n, (kind, size) in enumerate(events):
        if kind == "answer":
            synced = [s for k, s in events[:n] if k == "sync"]
            assert synced and max(synced) == size, events


def test_a_dropped_layer_is_replayed_by_the_next_open(tmp_path: Path) -> None:
    """A process that ends without a flush (here: its layer let go, its lock given back, as a
    killed process's are) leaves its batches in the log; the next open writes them."""
    plain = _open(tmp_path / "plain")
    layered = _open(tmp_path / "layered", layer=True, flush_seconds=3600)
    batches = _requests()
    _run(layered, batches[:4])
    layered.flush()
    _run(layered, batches[4:])
    layered.layer.drop()
    _run(plain, batches)
    reopened = Workspace.open(tmp_path / "layered")
    assert reopened.store.replayed == len(batches) - 4
    assert not wal.segments(tmp_path / "layered")
    assert _current(reopened) == _current(plain)
    assert Workspace.check(tmp_path / "layered").healthy


def test_a_torn_record_ends_the_segment(tmp_path: Path) -> None:
    ws = Workspace.open(tmp_path / "store", seed=SEED, layer=True, flush_seconds=3600)
    _run(ws, _requests()[:2])
    (segment,) = wal.segments(tmp_path / "store")
    with segment.open("ab") as log:  # a record's frame, its payload cut short
        log.write((1000).to_bytes(4, "little") + (12345).to_bytes(4, "little") + b"partial")
    log = wal.read(segment)
    assert log.floor == 0 and log.before == 0 and len(log.records) == 2
    ws.layer.drop()
    assert Workspace.open(tmp_path / "store").store.replayed == 2


def test_a_writer_of_another_workspace_waits_for_the_flush(tmp_path: Path) -> None:
    layered = Workspace.open(tmp_path / "store", seed=SEED, layer=True, flush_seconds=0.2)
    layered.call("POST", TRACK, {"attributes": [{"external_id": "a", "visits": {"inc": 1}}]})
    other = Workspace.open(tmp_path / "store", retry_for=30)
    # the layer's owner holds the writer lock: this batch waits for the flush, then runs over it
    assert other.call("POST", TRACK, {"attributes": [{"external_id": "a", "visits": {"inc": 1}}]}).status == 201
    layered.call("POST", TRACK, {"attributes": [{"external_id": "a", "visits": {"inc": 1}}]})
    layered.close()
    user = other.call("POST", EXPORT, {"external_ids": ["a"], "fields_to_export": ["custom_attributes"]}).body
    assert user["users"] == [{"custom_attributes": {"visits": 3}}]


def test_a_failed_flush_fails_no_batch_that_was_logged(tmp_path: Path) -> None:
    """A flush that fails inside `apply` (here: a table's next log entry cannot be made) leaves
    the batch answered, as it is logged: failing it would get it applied again by a caller that
    retries (the server's writer does). The next flush writes it, once."""
    from deltalake import DeltaTable

    store = tmp_path / "store"
    Workspace.open(store, seed=SEED).call("POST", TRACK, {"attributes": [{"external_id": "c", "n": 0}]})
    ws = Workspace.open(store, seed=SEED, layer=True, flush_seconds=3600, flush_rows=1)  # every batch is due
    entry = store / "external_ids" / "_delta_log" / f"{DeltaTable(str(store / 'external_ids')).version() + 1:020d}.json"
    entry.mkdir()  # where the flush's entry goes: its commit fails
    request = {"method": "POST", "path": TRACK,
               "body": {"attributes": [{"external_id": "c", "n": {"inc": 1}}, {"external_id": "new"}]}}
    assert [r.status for r in ws.apply([request, request])] == [201, 201]
    deadline = time.monotonic() + 60
    while not ws.flush_errors:  # the flush runs in a thread of its own, and fails there
        assert time.monotonic() < deadline, "the flush did not fail"
        time.sleep(0.05)
    assert ws.layer is not None and len(ws.layer) == 1  # still held, and logged
    entry.rmdir()
    ws.apply([request])  # the failed flush is committed again first, then this batch's
    ws.close()
    assert ws.layer is not None and len(ws.layer) == 0
    user = Workspace.open(store).call("POST", EXPORT, {"external_ids": ["c"], "fields_to_export": ["custom_attributes"]})
    assert user.body["users"] == [{"custom_attributes": {"n": 3}}]
