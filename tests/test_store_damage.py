"""Damaged stores (issue 11): opening never creates a store over one, and a missing or broken
ledger entry, log entry or data file raises a StoreError naming the file; `check` finds what
is wrong and `repair` undoes only what loses nothing committed. Files are damaged on disk."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import EXPORT, NOW, SEED, TRACK, open_ws

from engagelake import Workspace
from engagelake.errors import NotAStore, StoreDamaged, StoreError, StoreExists, StoreReadOnly
from engagelake.store import layout
from engagelake.store.check import REPAIRED, check
from engagelake.store.layout import LEDGER
from engagelake.store.ledger import Ledger
from engagelake.store.repair import repair

BATCH = {"attributes": [{"external_id": "u2", "first_name": "Bo"}]}


def two_batches(tmp_path: Path) -> Path:
    """A store with u1 (first batch) and u2 (second batch)."""
    ws = open_ws(tmp_path)
    ws.call("POST", TRACK, {"attributes": [{"external_id": "u1", "first_name": "Al"}]})
    ws.call("POST", TRACK, BATCH)
    ws.close()
    return tmp_path / "store"


def names(store: Path) -> list[str]:
    ws = Workspace.open(store, clock=lambda: NOW, create=False)
    body = ws.call("POST", EXPORT, {"external_ids": ["u1", "u2"], "fields_to_export": ["first_name"]}).body
    return sorted(u["first_name"] for u in body["users"])


def newest_entry(table: Path) -> Path:
    return max((table / "_delta_log").glob("*.json"))


def newest_data_file(table: Path) -> Path:
    return max(table.glob("*.parquet"), key=os.path.getmtime)


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def listing(store: Path) -> set[str]:
    return {str(p.relative_to(store)) for p in store.rglob("*")}


# --- opening never creates a store where one is ---------------------------------------------------
def test_a_store_without_its_ledger_is_refused_not_recreated(tmp_path: Path) -> None:
    store = two_batches(tmp_path)
    shutil.rmtree(store / LEDGER)
    before = listing(store)

    with pytest.raises(StoreDamaged, match=r"has tables \(profiles.*no ledger \(_ledger/_delta_log\)"):
        Workspace.open(store)
    with pytest.raises(StoreDamaged):
        Workspace.create(store)
    assert listing(store) == before  # nothing was created next to the data
    assert not check(store).healthy


def test_a_folder_of_other_files_is_not_made_a_store(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")

    with pytest.raises(NotAStore, match=r"notes\.txt"):
        Workspace.open(tmp_path)
    assert listing(tmp_path) == {"notes.txt"}


def test_a_file_is_not_a_store(tmp_path: Path) -> None:
    path = tmp_path / "store"
    path.write_text("x")

    with pytest.raises(NotAStore, match="is a file"):
        Workspace.open(path)


def test_a_new_path_or_an_empty_folder_gets_a_store(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "empty", tmp_path / "new"):  # a new path: its parent exists (issue 56)
        ws = Workspace.open(path, seed=SEED)
        assert ws.store.head.batch_no == 0
        assert check(path).healthy


def test_create_false_and_create_are_explicit(tmp_path: Path) -> None:
    with pytest.raises(NotAStore, match="no store at"):
        Workspace.open(tmp_path / "missing", create=False)
    assert not (tmp_path / "missing").exists()

    store = two_batches(tmp_path)
    with pytest.raises(StoreExists):
        Workspace.create(store)
    assert names(store) == ["Al", "Bo"]
    assert Workspace.create(tmp_path / "other").store.head.batch_no == 0


def test_a_creation_that_died_before_its_ledger_is_done_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def dies(name: str) -> None:
        if name == "create:before_ledger":
            raise KeyboardInterrupt  # the process stops between the tables and the ledger

    monkeypatch.setattr(layout, "failpoint", dies)
    with pytest.raises(KeyboardInterrupt):
        Workspace.open(tmp_path / "store")
    monkeypatch.undo()
    assert (tmp_path / "store" / "profiles").is_dir() and not (tmp_path / "store" / LEDGER).exists()

    ws = Workspace.open(tmp_path / "store", seed=SEED)
    assert ws.call("POST", TRACK, BATCH).status == 201
    assert not (tmp_path / "store" / layout.CREATING).exists()
    assert check(tmp_path / "store").healthy


# --- the ledger's newest entry ------------------------------------------------------------------
def test_a_truncated_ledger_entry_names_the_file_and_repair_keeps_the_batches_before(tmp_path: Path) -> None:
    store = two_batches(tmp_path)
    entry = newest_entry(store / LEDGER)
    truncate(entry)

    with pytest.raises(StoreDamaged, match=entry.name):
        Workspace.open(store)
    report = check(store)
    assert not report.healthy and not report.unrepairable()
    assert str(entry) in [p.path for p in report.problems]
    assert any("discard batch 2" in line for line in report.plan())

    repair(store)
    assert check(store).healthy
    assert (store / REPAIRED).is_dir()  # moved aside, not deleted
    assert names(store) == ["Al"]
    ws = Workspace.open(store, clock=lambda: NOW)
    assert ws.call("POST", TRACK, BATCH).status == 201
    assert names(store) == ["Al", "Bo"]


def test_a_deleted_ledger_entry_stops_writers_instead_of_dropping_the_batch(tmp_path: Path) -> None:
    store = two_batches(tmp_path)
    newest_entry(store / LEDGER).unlink()

    ws = Workspace.open(store, clock=lambda: NOW)  # readers see the batches the log still names
    with pytest.raises(StoreDamaged, match=r"ledger row of batch 2 .*no ledger log entry"):
        ws.call("POST", TRACK, {"attributes": [{"external_id": "u3"}]})
    assert (store / "profiles" / "_delta_log" / f"{2:020d}.json").exists()  # not rolled back
    report = check(store)
    assert not report.healthy and report.discarded == [2]

    repair(store)
    assert check(store).healthy
    assert Workspace.open(store, clock=lambda: NOW).call("POST", TRACK, BATCH).status == 201


def test_tables_ahead_of_the_ledger_after_a_crash_are_healthy_and_rolled_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = two_batches(tmp_path)

    def fails(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "no space left on device")

    ws = Workspace.open(store, clock=lambda: NOW)
    monkeypatch.setattr(Ledger, "append_rows", fails)
    with pytest.raises(OSError, match="no space"):  # a healthy store: the error is the file system's
        ws.call("POST", TRACK, {"attributes": [{"external_id": "u3", "first_name": "Cy"}]})
    monkeypatch.undo()

    report = check(store)
    assert report.healthy and "profiles" in report.rollback
    assert any("ahead of the ledger" in note for note in report.notes)
    repair(store)
    assert check(store).rollback == {}
    assert names(store) == ["Al", "Bo"]


# --- table logs and data files ------------------------------------------------------------------
def damage_pages(path: Path) -> None:
    """Every byte between the magic number and the footer flipped: the footer still reads."""
    data = bytearray(path.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    for i in range(4, len(data) - 8 - footer):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["delete", "garbage", "truncate", "pages"])
def test_a_damaged_data_file_names_the_file_and_is_not_repaired(tmp_path: Path, damage: str) -> None:
    store = two_batches(tmp_path)
    path = newest_data_file(store / "profiles")
    if damage == "delete":
        path.unlink()
    elif damage == "garbage":
        path.write_bytes(b"not parquet" * 20)
    elif damage == "pages":
        damage_pages(path)
    else:
        truncate(path)

    with pytest.raises(StoreDamaged, match=path.name) as raised:
        names(store)
    assert "backup" in str(raised.value) and "engagelake check" in str(raised.value)
    if damage == "pages":  # its footer reads: only decoding its pages finds it
        assert check(store).healthy
        assert "engagelake check --deep" in str(raised.value)
        with pytest.raises(StoreDamaged, match=path.name):  # DuckDB's reader, as `engagelake sql` reads
            Workspace.open(store, create=False).sql("SELECT count(*) FROM profiles")
    report = check(store, deep=True)
    assert [p.path for p in report.problems] == [str(path)]
    before = listing(store)
    if damage == "pages":  # repair's plain check finds nothing it could do
        repair(store)
    else:
        with pytest.raises(StoreDamaged, match="cannot fix"):
            repair(store)
    assert listing(store) == before


def test_a_half_written_table_log_entry_names_the_file(tmp_path: Path) -> None:
    store = two_batches(tmp_path)
    entry = newest_entry(store / "profiles")  # the version the ledger names
    truncate(entry)

    with pytest.raises(StoreDamaged, match=entry.name):
        names(store)
    report = check(store)
    assert [p.path for p in report.problems] == [str(entry)] and report.unrepairable()


def test_a_half_written_log_entry_past_the_ledger_is_moved_aside(tmp_path: Path) -> None:
    store = two_batches(tmp_path)
    log = store / "profiles" / "_delta_log"
    torn = log / f"{int(newest_entry(store / 'profiles').stem) + 1:020d}.json"
    torn.write_text('{"add": {"path": "part-0')  # a commit that never finished

    report = check(store)
    assert not report.unrepairable() and str(torn) in report.aside
    repair(store)
    assert check(store).healthy
    ws = Workspace.open(store, clock=lambda: NOW)
    assert ws.call("POST", TRACK, {"attributes": [{"external_id": "u3"}]}).status == 201


# --- read-only stores ---------------------------------------------------------------------------
def test_a_read_only_store_reads_and_refuses_writes_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = two_batches(tmp_path)

    def refused(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "w" in mode:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(layout, "open", refused, raising=False)  # the writer lock's open
    assert names(store) == ["Al", "Bo"]
    ws = Workspace.open(store, clock=lambda: NOW)
    with pytest.raises(StoreReadOnly, match=f"{store}.*read-only"):
        ws.call("POST", TRACK, {"attributes": [{"external_id": "u3"}]})


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file modes")
def test_a_read_only_folder_reads_and_refuses_writes(tmp_path: Path) -> None:
    store = two_batches(tmp_path)
    for path in [store, *store.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)
    try:
        assert names(store) == ["Al", "Bo"]
        with pytest.raises(StoreReadOnly):
            Workspace.open(store, clock=lambda: NOW).call("POST", TRACK, {"attributes": [{"external_id": "u3"}]})
    finally:
        for path in [store, *store.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)


def test_a_store_is_not_created_where_its_parent_folder_is_missing(tmp_path: Path) -> None:
    """A mistyped path must not grow a new store, nor the folders above it (issue 56): the
    store's own folder is made, never its missing parents, as SQLite and DuckDB refuse a
    database in a missing folder."""
    with pytest.raises(StoreError, match="parent folder .*missing/parent does not exist; create it first"):
        Workspace.open(tmp_path / "missing" / "parent" / "store")
    assert not (tmp_path / "missing").exists()
    Workspace.open(tmp_path / "store")  # an existing parent: the store is made
    assert (tmp_path / "store" / LEDGER).is_dir()
