"""The Delta store seen through Workspace: reopening, several Workspaces on one path, idempotency
keys, readers against a torn batch, and the on-disk layout (a Delta table per store table)."""

from __future__ import annotations

import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from tests.crash_worker import (
    BATCH_1,
    BATCH_2,
    KEY_1,
    KEY_2,
    WRITTEN,
    counts,
    disk_versions,
    run_worker,
    snapshot,
    tables_ahead,
)

import engagelake.store.delta as delta
from engagelake import IdempotencyKeyReused, Workspace
from engagelake.errors import StoreError
from engagelake.store import layout, writes
from engagelake.store.layout import LEDGER
from engagelake.store.ledger import LEDGER_GROUP_ROWS, LEDGER_SCHEMA, Ledger, ledger_files
from engagelake.store.merger import RunMerger
from engagelake.tables.partial import PARTIAL, SET
from engagelake.tables.schema import SCHEMAS, TABLES

NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
SEED = "crash"  # BATCH_1 / BATCH_2 stores use the worker's seed
TRACK = "/users/track"
EXPORT = "/users/export/ids"


def open_ws(path: Path, seed: str = SEED) -> Workspace:
    return Workspace.open(path, clock=lambda: NOW, seed=seed)


def ev(name: str, external_id: str = "u1") -> dict[str, Any]:
    return {"events": [{"external_id": external_id, "name": name, "time": "2026-11-22T11:00:00Z"}]}


def track(ws: Workspace, body: dict[str, Any]) -> None:
    r = ws.call("POST", TRACK, body)
    assert r.status == 201 and r.body is not None and "errors" not in r.body, r


def event_names(ws: Workspace) -> list[str]:
    return sorted(ws.table("events").collect()["name"].to_list())


def service_ids(ws: Workspace) -> list[str]:
    return ws.table("profiles").collect().sort("created_seq")["service_id"].to_list()


# --- reopening -----------------------------------------------------------------------------------
def test_reopen_sees_the_same_state(tmp_path: Path) -> None:
    ws = open_ws(tmp_path / "s")
    ws.apply(BATCH_1, idempotency_key=KEY_1)
    ws.apply(BATCH_2, idempotency_key=KEY_2)
    before = snapshot(ws)
    assert before["head"][0] == 2 and len(before["export"]) == 4  # the alias-only profile was merged into u2
    del ws

    assert snapshot(open_ws(tmp_path / "s")) == before
    # the seed is the store's, fixed at creation: another seed on reopen changes nothing
    assert snapshot(open_ws(tmp_path / "s", seed="other")) == before


def test_reopen_continues_the_service_id_sequence(tmp_path: Path) -> None:
    """The counters live in the ledger: a reopened store creates the users a never-closed one does."""
    ws = open_ws(tmp_path / "s")
    track(ws, {"attributes": [{"external_id": "u1", "a": 1}, {"external_id": "u2", "a": 2}]})
    del ws
    ws = open_ws(tmp_path / "s", seed="other")
    track(ws, {"attributes": [{"external_id": "u3", "a": 3}]})

    ref = open_ws(tmp_path / "ref")
    track(ref, {"attributes": [{"external_id": "u1", "a": 1}, {"external_id": "u2", "a": 2}]})
    track(ref, {"attributes": [{"external_id": "u3", "a": 3}]})
    assert len(set(service_ids(ws))) == 3
    assert snapshot(open_ws(tmp_path / "s")) == snapshot(ref)


# --- two Workspaces on one path ------------------------------------------------------------------
def test_second_workspace_sees_the_first_ones_commits(tmp_path: Path) -> None:
    ws1 = open_ws(tmp_path / "s")
    ws2 = open_ws(tmp_path / "s")
    assert ws2.table("events").collect().height == 0

    track(ws1, ev("played"))
    assert ws2.table("events").collect().height == 1
    assert ws2.table("profiles").collect()["external_id"].to_list() == ["u1"]
    assert ws2.export_users() == ws1.export_users()

    # and back: ws2 writes on top of ws1's commit, with the next service_id, losing nothing
    track(ws2, ev("won", "u2"))
    assert event_names(ws1) == ["played", "won"]
    assert len(set(service_ids(ws1))) == 2
    assert snapshot(ws1) == snapshot(ws2) == snapshot(open_ws(tmp_path / "s"))


# --- idempotency keys ----------------------------------------------------------------------------
def test_same_key_applies_once_and_returns_the_stored_responses(tmp_path: Path) -> None:
    ws = open_ws(tmp_path / "s")
    batch = [
        {"method": "POST", "path": TRACK, "body": ev("played")},
        {
            "method": "POST",
            "path": EXPORT,
            "body": {"external_ids": ["u1"], "fields_to_export": ["custom_events"]},
        },
    ]
    first = ws.apply(batch, idempotency_key="k")
    assert [r.status for r in first] == [201, 200]
    assert first[1].body["users"][0]["custom_events"][0]["count"] == 1
    versions = disk_versions(tmp_path / "s")

    # Run again, the export would count 2 events: the stored answer says 1, and nothing is written.
    assert ws.apply(batch, idempotency_key="k") == first
    assert ws.table("events").collect().height == 1
    assert disk_versions(tmp_path / "s") == versions
    # the key is in the store, not in the Workspace: a fresh one answers the same
    other = open_ws(tmp_path / "s")
    assert other.apply(batch, idempotency_key="k") == first
    assert other.table("events").collect().height == 1
    assert disk_versions(tmp_path / "s") == versions

    # another key is another batch
    second = ws.apply(batch, idempotency_key="k2")
    assert second[1].body["users"][0]["custom_events"][0]["count"] == 2
    assert open_ws(tmp_path / "s").table("events").collect().height == 2


def test_same_key_with_nothing_to_write_still_returns_the_first_answer(tmp_path: Path) -> None:
    ws = open_ws(tmp_path / "s")
    export = [
        {
            "method": "POST",
            "path": EXPORT,
            "body": {"external_ids": ["u1"], "fields_to_export": ["external_id"]},
        }
    ]
    first = ws.apply(export, idempotency_key="read")
    assert first[0].status == 200 and first[0].body["users"] == []
    track(ws, ev("played"))
    assert ws.apply(export, idempotency_key="read") == first
    assert ws.apply(export)[0].body["users"] == [{"external_id": "u1"}]


def test_a_key_reused_for_another_batch_raises_and_applies_nothing(tmp_path: Path) -> None:
    ws = open_ws(tmp_path / "s")
    batch = [{"method": "POST", "path": TRACK, "body": ev("played")}]
    first = ws.apply(batch, idempotency_key="k")
    versions = disk_versions(tmp_path / "s")
    others = [
        [{"method": "POST", "path": TRACK, "body": ev("skipped")}],  # another body
        [*batch, *batch],  # more requests
        [],  # fewer
        [{**batch[0], "query": {"a": "1"}}],  # another query
        [{"method": "POST", "path": "/users/track?a=1", "body": ev("played")}],  # another path
    ]
    for other in others:
        with pytest.raises(IdempotencyKeyReused, match="idempotency key 'k' belongs to a different batch") as error:
            ws.apply(iter(other), idempotency_key="k")
        assert error.value.key == "k"
        assert isinstance(error.value, StoreError)
    assert disk_versions(tmp_path / "s") == versions
    assert ws.table("events").collect()["name"].to_list() == ["played"]
    # the same requests, as JSON text or from a generator, still answer the stored responses
    again = [{"method": "post", "path": TRACK, "body": orjson.dumps(ev("played")).decode(), "query": None}]
    assert open_ws(tmp_path / "s").apply(again, idempotency_key="k") == first
    assert ws.apply(iter(batch), idempotency_key="k") == first


def test_a_key_stored_before_digests_replays_as_before(tmp_path: Path) -> None:
    ws = open_ws(tmp_path / "s")
    first = ws.apply([{"method": "POST", "path": TRACK, "body": ev("played")}], idempotency_key="old")
    # the ledger as an older engagelake wrote it: no digest column
    ledger = pl.read_delta(str(tmp_path / "s" / LEDGER)).drop("digest")
    write_deltalake(str(tmp_path / "s" / LEDGER), ledger.to_arrow(compat_level=pl.CompatLevel.oldest()),
                    mode="overwrite", schema_mode="overwrite")
    reopened = open_ws(tmp_path / "s")
    other = [{"method": "POST", "path": TRACK, "body": ev("skipped")}]
    assert reopened.apply(other, idempotency_key="old") == first  # no digest: accepted as before
    assert reopened.table("events").collect()["name"].to_list() == ["played"]
    # new keys get digests again (the ledger gains the column)
    reopened.apply(other, idempotency_key="new")
    with pytest.raises(IdempotencyKeyReused):
        reopened.apply([{"method": "POST", "path": TRACK, "body": ev("played")}], idempotency_key="new")


def test_without_a_key_the_same_event_twice_records_two_events(tmp_path: Path) -> None:
    ws = open_ws(tmp_path / "s")
    track(ws, ev("played"))
    track(ws, ev("played"))
    ws.apply([{"method": "POST", "path": TRACK, "body": ev("played")}])
    reopened = open_ws(tmp_path / "s")
    assert reopened.table("events").collect().height == 3
    assert reopened.table("profiles").collect().height == 1
    [user] = reopened.export_users(["custom_events"])
    assert user["custom_events"][0]["count"] == 3


def test_an_error_after_the_ledger_row_landed_is_no_failed_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """delta-rs may raise after its commit (the checkpoint it writes after the log entry). The
    batch is committed: `apply` answers it, so that a caller who retries failed batches (the
    server's writer does) never applies it twice."""
    ws = open_ws(tmp_path / "s")
    track(ws, ev("first"))
    append = Ledger.append_rows  # a batch's ledger rows

    def lands_then_fails(self: Ledger, *args: Any, **kwargs: Any) -> None:
        append(self, *args, **kwargs)
        raise OSError("checkpoint: no space left on device")

    monkeypatch.setattr(Ledger, "append_rows", lands_then_fails)
    track(ws, ev("second"))
    assert [type(e) for e in ws.store.commit_errors] == [OSError]
    monkeypatch.undo()
    track(ws, ev("third"))  # the head moved on: the next batch commits after it
    assert event_names(open_ws(tmp_path / "s")) == ["first", "second", "third"]


def test_an_error_before_the_ledger_row_landed_fails_the_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = open_ws(tmp_path / "s")
    track(ws, ev("first"))

    def fails(self: Ledger, *args: Any, **kwargs: Any) -> None:
        raise OSError("no space left on device")

    monkeypatch.setattr(Ledger, "append_rows", fails)
    with pytest.raises(OSError, match="no space"):
        track(ws, ev("lost"))
    assert ws.store.commit_errors == []
    monkeypatch.undo()
    assert event_names(open_ws(tmp_path / "s")) == ["first"]


def test_a_failed_table_write_fails_the_batch_once_the_others_ended(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit writes its tables side by side (`delta._TableWrites`): one that fails fails the
    batch, but only once the write running beside it has ended, and nothing of the batch is seen."""
    if writes.WRITE_THREADS < 2:
        pytest.skip("one CPU: tables are written one by one")
    ws = open_ws(tmp_path / "s")
    track(ws, ev("first"))
    write_file = writes.appends.write_file
    release = threading.Event()
    ended: dict[str, float] = {}

    def faulty(folder: str, *args: Any) -> Any:
        table = folder.rsplit("/", 1)[-1]
        if table == "profiles":  # the first table written fails at once
            raise OSError("no space left on device")
        if table == "external_ids":  # the second is still being written meanwhile
            release.wait(10)
        added = write_file(folder, *args)
        ended[table] = time.monotonic()
        return added

    monkeypatch.setattr(writes.appends, "write_file", faulty)
    threading.Timer(0.3, release.set).start()
    with pytest.raises(OSError, match="no space"):
        track(ws, {"attributes": [{"external_id": "u2", "first_name": "Ann", "plan": "pro"}], **ev("lost", "u2")})
    raised = time.monotonic()
    assert release.is_set() and ended["external_ids"] <= raised  # no write outlived the batch
    monkeypatch.undo()
    assert event_names(open_ws(tmp_path / "s")) == ["first"]
    unknown = open_ws(tmp_path / "s").call("POST", "/users/export/ids",
                                           {"external_ids": ["u2"], "fields_to_export": ["external_id"]})
    assert unknown.body is not None and (unknown.body["users"], unknown.body["invalid_user_ids"]) == ([], ["u2"])
    track(ws, ev("second"))  # the tables ahead of the ledger are rolled back first
    assert event_names(open_ws(tmp_path / "s")) == ["first", "second"]


def test_a_merge_that_cannot_start_is_no_failed_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = open_ws(tmp_path / "s")
    ws.store.merge_trigger = 0  # every commit asks for a merge

    def cannot_start(self: RunMerger) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(RunMerger, "start", cannot_start)
    track(ws, ev("first"))
    track(ws, ev("second"))
    assert ws.store.merge_errors and all(isinstance(e, RuntimeError) for e in ws.store.merge_errors)
    assert event_names(open_ws(tmp_path / "s")) == ["first", "second"]


def test_a_batch_that_changes_nothing_writes_nothing(tmp_path: Path) -> None:
    ws = open_ws(tmp_path / "s")
    track(ws, ev("played"))
    versions = disk_versions(tmp_path / "s")
    r = ws.call("POST", TRACK, {"events": [{"external_id": "u1", "time": "2026-11-22T11:00:00Z"}]})
    assert r.status == 400 or "errors" in (r.body or {}), r  # no event name: nothing to record
    ws.call("POST", EXPORT, {"external_ids": ["u1"], "fields_to_export": ["external_id"]})
    ws.call("GET", "/nowhere")
    assert disk_versions(tmp_path / "s") == versions


# --- readers against a torn batch ----------------------------------------------------------------
@pytest.mark.slow  # a crash test: a writer process killed before its ledger row (1.5 s)
def test_reader_opening_over_a_crashed_batch_sees_only_committed_data(tmp_path: Path) -> None:
    store = tmp_path / "s"
    writer = open_ws(store)
    writer.apply(BATCH_1, idempotency_key=KEY_1)
    committed = snapshot(writer)
    committed_counts = counts(writer)
    old_reader = open_ws(store)  # opened before the crash

    proc = run_worker(store, "before_ledger")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert tables_ahead(store) == set(WRITTEN)  # every table holds BATCH_2's rows past the ledger

    reader = open_ws(store)
    assert counts(reader) == committed_counts
    assert snapshot(reader) == committed
    assert reader.table("profiles").collect()["external_id"].to_list().count("u2") == 0
    assert "played" not in event_names(reader)
    assert snapshot(old_reader) == committed
    assert snapshot(writer) == committed


def test_reader_refreshing_mid_commit_sees_only_committed_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Workspace that picks up another writer's commits loads the tables at the versions the
    ledger names, not their newest versions, which may hold a batch still being written."""
    store = tmp_path / "s"
    writer = open_ws(store)
    reader = open_ws(store)
    track(writer, ev("a"))  # committed; the reader has not looked yet
    seen: list[tuple[list[str], list[str | None]]] = []

    def look_before_ledger(name: str) -> None:
        if name == "before_ledger" and not seen:
            seen.append((event_names(reader), reader.table("profiles").collect()["external_id"].to_list()))

    monkeypatch.setattr(layout, "failpoint", look_before_ledger)
    track(writer, ev("b", "u2"))
    monkeypatch.undo()
    assert seen == [(["a"], ["u1"])]
    assert event_names(reader) == ["a", "b"]


def test_reader_opening_mid_commit_does_not_undo_the_live_writers_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader opens while a live writer has appended its tables but not yet its ledger row (the
    same on-disk picture as a crash there). The reader must see only committed data, and the
    writer's batch, once its ledger row lands, must stay in the store for good."""
    store = tmp_path / "s"
    writer = open_ws(store)
    track(writer, ev("a"))
    seen: list[list[str]] = []

    def pause_before_ledger(name: str) -> None:
        if name == "before_ledger" and not seen:
            seen.append(event_names(open_ws(store)))

    monkeypatch.setattr(layout, "failpoint", pause_before_ledger)
    track(writer, ev("b"))
    monkeypatch.undo()
    assert seen == [["a"]]  # the reader saw only the committed batch

    track(writer, ev("c"))
    assert event_names(writer) == ["a", "b", "c"]
    assert event_names(open_ws(store)) == ["a", "b", "c"], (
        "the writer's committed batch 'b' was lost"
    )


# --- layout --------------------------------------------------------------------------------------
def test_store_holds_a_delta_table_per_table_name(tmp_path: Path) -> None:
    store = tmp_path / "s"
    open_ws(store).apply(BATCH_1, idempotency_key=KEY_1)
    for name in (*TABLES, LEDGER):
        assert DeltaTable.is_deltatable(str(store / name)), name
    assert not DeltaTable.is_deltatable(str(store))
    for name in TABLES:
        fields = [f.name for f in DeltaTable(str(store / name)).schema().fields]
        mask = [SET] if name in PARTIAL else []  # the fields a partial row sets (tables/partial.py)
        assert fields == [*SCHEMAS[name], "_batch", "_deleted", *mask], name


def test_unique_columns_are_written_without_a_dictionary(tmp_path: Path) -> None:
    """Keys, emails and sequence numbers are each row's own: a dictionary only costs there. The
    other columns keep theirs, through batches, run merges and compaction alike."""
    store = tmp_path / "s"
    ws = open_ws(store)
    ws.apply(BATCH_1)
    ws.store.merge_runs()
    ws.apply(BATCH_1)
    ws.compact()
    ws.apply(BATCH_1)
    for name, columns in layout.PLAIN_COLUMNS.items():
        for uri in DeltaTable(str(store / name)).file_uris():
            group = pq.read_metadata(uri.removeprefix("file://")).row_group(0)
            chunks = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
            assert all(chunks[c].dictionary_page_offset is None for c in columns), name
            assert any(chunk.dictionary_page_offset is not None for c, chunk in chunks.items() if c not in columns)


def test_batches_only_append_files(tmp_path: Path) -> None:
    """Each batch adds files and removes none: the logs are append-only."""
    store = tmp_path / "s"
    ws = open_ws(store)
    ws.apply(BATCH_1, idempotency_key=KEY_1)
    files = {name: set(DeltaTable(str(store / name)).file_uris()) for name in (*TABLES, LEDGER)}
    ws.apply(BATCH_2, idempotency_key=KEY_2)  # updates and deletes keys of BATCH_1
    for name in (*WRITTEN, LEDGER):
        table = DeltaTable(str(store / name))
        assert files[name] < set(table.file_uris()), name
        assert {h["operation"] for h in table.history()} <= {"CREATE TABLE", "WRITE"}, name


def test_reopened_store_equals_memory_after_a_batch_with_reads_between_changes(tmp_path: Path) -> None:
    """Changes of several track runs in one batch (split by an export) reach the disk in order:
    a set then a removal of the same attribute ends removed after reopening too."""
    track = "/users/track"
    batch = [
        {"method": "POST", "path": track, "body": {"attributes": [{"external_id": "u", "a": 1, "b": 1}]}},
        {"method": "POST", "path": "/users/export/ids",
         "body": {"external_ids": ["u"], "fields_to_export": ["custom_attributes"]}},
        {"method": "POST", "path": track, "body": {"attributes": [{"external_id": "u", "a": None, "b": 2}]}},
    ]
    ws = Workspace.open(tmp_path / "s", clock=lambda: NOW, seed="r")
    rs = ws.apply(batch)
    assert rs[1].body["users"][0]["custom_attributes"] == {"a": 1, "b": 1}
    assert ws.export_users(["custom_attributes"]) == [{"custom_attributes": {"b": 2}}]
    reopened = Workspace.open(tmp_path / "s", clock=lambda: NOW)
    assert reopened.export_users(["custom_attributes"]) == [{"custom_attributes": {"b": 2}}]


def _count_row_group_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(file, row group) of every ledger row group the store reads from now on."""
    reads: list[tuple[str, int]] = []
    read_row_group = pq.ParquetFile.read_row_group

    def counted(self: Any, group: int, *args: Any, **kwargs: Any) -> Any:
        reads.append((self.reader.metadata.num_rows, group))
        return read_row_group(self, group, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counted)
    return reads


def test_a_compacted_ledger_of_many_batches_opens_from_its_newest_row_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compaction writes every batch's ledger row into one file, in row groups by batch: the
    head comes from the last of them (a server commits a few batches a second)."""
    from deltalake import write_deltalake

    ws = open_ws(tmp_path)
    ws.call("POST", TRACK, {"attributes": [{"external_id": "a", "n": 1}]})
    ledger = str(tmp_path / "_ledger")
    last = ws.store.ledger.rows(list(LEDGER_SCHEMA)).sort("batch_no").tail(1)
    many = 3 * LEDGER_GROUP_ROWS
    first = last["batch_no"].item() + 1
    write_deltalake(ledger, pl.concat([last] * many).with_columns(
        batch_no=pl.int_range(first, first + many, dtype=pl.Int64)).to_arrow(), mode="append")
    ws = open_ws(tmp_path)
    ws.compact()  # its own ledger row (a layout row) comes after the file of every batch
    reads = _count_row_group_reads(monkeypatch)
    again = delta.DeltaStore(str(tmp_path))
    assert (again.head.batch_no, again.head.content_batch) == (first + many, first + many - 1)
    assert len(reads) == 2 and reads[1][0] > LEDGER_GROUP_ROWS  # the compaction's row, the big file's last group
    assert ws.call("POST", EXPORT, {"external_ids": ["a"], "fields_to_export": ["custom_attributes"]}).body[
        "users"] == [{"custom_attributes": {"n": 1}}]


def test_a_ledger_whose_files_interleave_is_compacted_in_batch_order(tmp_path: Path) -> None:
    """Files whose batch ranges overlap (none of engagelake's writes make them) are sorted."""
    from deltalake import write_deltalake

    ws = open_ws(tmp_path)
    ws.call("POST", TRACK, {"attributes": [{"external_id": "a", "n": 1}]})
    last = ws.store.ledger.rows(list(LEDGER_SCHEMA)).sort("batch_no").tail(1)
    first = last["batch_no"].item() + 1
    for parity in (0, 1):  # two files: the even batches, then the odd ones
        numbers = [n for n in range(first, first + 20) if n % 2 == parity]
        write_deltalake(str(tmp_path / "_ledger"), pl.concat([last] * len(numbers)).with_columns(
            batch_no=pl.Series(numbers, dtype=pl.Int64)).to_arrow(), mode="append")
    assert not ledger_files(DeltaTable(str(tmp_path / "_ledger")))[1]
    open_ws(tmp_path).compact()
    files = DeltaTable(str(tmp_path / "_ledger")).file_uris()
    rows = max((pl.read_parquet(f)["batch_no"].to_list() for f in files), key=len)  # the compacted file
    assert rows == sorted(rows) and rows[-20:] == list(range(first, first + 20))
    assert delta.DeltaStore(str(tmp_path)).head.content_batch == first + 19


def test_opening_reads_the_ledgers_newest_files_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The head comes from the newest ledger files (by their `batch_no` statistics): a store of
    many batches opens as a new one does. A newest row that only moved rows (a run merge) is
    read past, to the last batch that changed content."""
    ws = open_ws(tmp_path)
    ws.store.background_merges = False
    ws.store.merge_trigger = 10**6  # no merge after the batches ...
    for n in range(6):
        ws.call("POST", TRACK, {"attributes": [{"external_id": f"u{n}", "n": n}]})
    ws.store.merge_trigger = 1
    assert ws.store.merge_runs()  # ... then one: the newest ledger row moves rows only
    whole = ws.store.ledger.rows(["batch_no", "kind", "versions"]).sort("batch_no")
    content = whole.filter(~pl.col("kind").is_in(["merge", "compaction"]).fill_null(False))["batch_no"].max()
    reads = _count_row_group_reads(monkeypatch)
    again = delta.DeltaStore(str(tmp_path))
    assert (again.head.batch_no, again.head.content_batch) == (whole["batch_no"].max(), content)
    assert again.head.versions == orjson.loads(whole["versions"][-1]) and whole.height >= 7
    assert whole["kind"][-1] == "merge" and content == whole["batch_no"][-2]
    assert len(reads) == 2  # the merge's file, then the last batch's
    assert not again.refresh()  # the version read at open is the one refresh compares with


def test_a_table_created_by_our_own_log_entry_is_the_one_delta_rs_creates(tmp_path: Path) -> None:
    """`appends.create` writes version 0 itself (a new store: 34 tables in about 10 ms, not 200):
    the same protocol, metadata and schema as `write_deltalake` of no rows, for every table, and
    delta-rs reads and appends to it."""
    from engagelake.store import appends
    from engagelake.store.layout import STORED

    def version_0(folder: Path) -> dict[str, Any]:
        actions = [orjson.loads(line) for line in (folder / "_delta_log" / f"{0:020d}.json").read_bytes().splitlines()]
        return {kind: action[kind] for action in actions for kind in action}

    for name in STORED:
        arrow = pl.DataFrame(schema=writes.stored_schema(name)).to_arrow()
        ours, theirs = tmp_path / f"ours-{name}", tmp_path / f"theirs-{name}"
        assert appends.create(str(ours), arrow.schema) == 0
        write_deltalake(str(theirs), arrow, mode="overwrite")
        mine, delta_rs = version_0(ours), version_0(theirs)
        assert mine["protocol"] == delta_rs["protocol"]
        assert orjson.loads(mine["metaData"]["schemaString"]) == orjson.loads(delta_rs["metaData"]["schemaString"])
        assert {k: v for k, v in mine["metaData"].items() if k not in ("id", "createdTime", "schemaString")} \
            == {k: v for k, v in delta_rs["metaData"].items() if k not in ("id", "createdTime", "schemaString")}
        assert DeltaTable(str(ours)).schema() == DeltaTable(str(theirs)).schema()
        assert appends.created_empty(str(ours)) == frozenset(arrow.schema.names)
    # delta-rs appends to such a table, and a second creation is refused
    write_deltalake(str(tmp_path / "ours-profiles"), pl.DataFrame({"service_id": ["s1"]}).to_arrow(), mode="append",
                    schema_mode="merge")
    assert DeltaTable(str(tmp_path / "ours-profiles")).version() == 1
    with pytest.raises(StoreError, match="version 0 of the table .* exists already"):
        appends.create(str(tmp_path / "ours-profiles"), pl.DataFrame({"x": [1]}).to_arrow().schema)
    ws = Workspace.open(tmp_path / "store")  # and a store made so answers
    assert ws.call("POST", "/users/track", {"attributes": [{"external_id": "a", "n": 1}]}).status == 201
