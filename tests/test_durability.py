"""An acknowledged batch is on disk: every file its commit wrote was synced before the answer
(`store/appends.py`), and the ledger's entry, the commit point, after every table's.

The syncs are recorded by the inode they reach (a log entry is synced as its temporary file,
before it is linked under its name), at the moment `call` returns.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import orjson
import pytest

from engagelake import Workspace
from engagelake.store import appends
from engagelake.store.layout import LEDGER

TRACK = {"attributes": [{"external_id": f"u{n}", "first_name": f"F{n}", "visits": n} for n in range(75)],
         "events": [{"external_id": "u1", "name": "opened", "time": "2026-01-15T11:00:00Z"}]}


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The inodes `os.fdatasync` and `os.fsync` reach from now on, in order."""
    synced: list[int] = []

    def recorded(real: Callable[[int], None]) -> Callable[[int], None]:
        def sync(fd: int) -> None:
            real(fd)
            synced.append(os.fstat(fd).st_ino)
        return sync

    monkeypatch.setattr(os, "fdatasync", recorded(os.fdatasync))
    monkeypatch.setattr(os, "fsync", recorded(os.fsync))
    return synced


def _written(table: Path, before: int, after: int) -> tuple[list[Path], list[Path]]:
    """The log entries of versions (before, after] of a local table, and the data files they add."""
    entries = [table / "_delta_log" / f"{v:020d}.json" for v in range(before + 1, after + 1)]
    files = [table / unquote(action["add"]["path"]) for entry in entries
             for line in entry.read_bytes().splitlines() if line.strip()
             if "add" in (action := orjson.loads(line))]
    return entries, files


def test_every_file_of_a_batch_is_synced_before_its_answer_and_the_ledger_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = Workspace.open(tmp_path / "store", seed="s")
    ws.store.background_merges = False  # no merge thread syncing files of its own meanwhile
    assert ws.call("POST", "/users/track", TRACK).status == 201  # the tables' first files
    before, ledger_before = dict(ws.store.head.versions), ws.store.ledger.version
    synced = _recording(monkeypatch)
    answer = ws.call("POST", "/users/track", {**TRACK, "events": [{**TRACK["events"][0], "name": "clicked"}]})
    at_answer = list(synced)
    monkeypatch.undo()
    assert answer.status == 201
    changed = {name: v for name, v in ws.store.head.versions.items() if v != before.get(name)}
    assert {"profiles", "attributes", "events"} <= set(changed), changed
    root = Path(ws.store.uri)
    position = {inode: n for n, inode in enumerate(at_answer)}  # the last sync of each
    for name, version in changed.items():
        entries, files = _written(root / name, before.get(name, -1), version)
        for path in [*files, *entries, root / name, root / name / "_delta_log"]:
            assert path.stat().st_ino in position, f"{path} was not synced before the answer"
    ledger_entries, _ = _written(root / LEDGER, ledger_before, ws.store.ledger.version)
    assert len(ledger_entries) == 1
    last_table_entry = max(position[entry.stat().st_ino] for name, version in changed.items()
                           for entry in _written(root / name, before.get(name, -1), version)[0])
    ledger_entry = position[ledger_entries[0].stat().st_ino]
    assert ledger_entry > last_table_entry  # the commit point reaches the disk after what it names
    assert position[(root / LEDGER / "_delta_log").stat().st_ino] > ledger_entry  # then its name


def test_a_store_that_does_not_sync_writes_the_same_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ENGAGELAKE_SYNC=0` (scratch copies, benchmarks of the write path): nothing is synced,
    and the store reads back the same."""
    monkeypatch.setenv(appends.SYNC_ENV, "0")
    ws = Workspace.open(tmp_path / "store", seed="s")
    synced = _recording(monkeypatch)
    assert ws.call("POST", "/users/track", TRACK).status == 201
    ws.store.wait_for_merges()
    assert synced == []
    exported = ws.call("POST", "/users/export/ids", {"external_ids": ["u3"], "fields_to_export": ["first_name"]})
    assert exported.body["users"] == [{"first_name": "F3"}]
