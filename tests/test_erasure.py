"""Erasure reaches stored responses: a keyed batch's responses are kept for the retention window,
dropped at compaction after it, and at once when the batch concerned a deleted user; a replay
then raises IdempotentResponsesExpired and applies nothing again (`docs/privacy.md`)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from tests.helpers import EXPORT, NOW, SEED, TRACK, service_id

from engagelake import IdempotencyKeyReused, IdempotentResponsesExpired, Workspace
from engagelake.tables.changes import Changes

MERGE = "/users/merge"
DELETE = "/users/delete"


def open_store(path: Path, **options: Any) -> Workspace:
    return Workspace.open(path, clock=lambda: NOW, seed=SEED, **options)


def req(path: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"method": "POST", "path": path, "body": body}


def victim_and_keeper(ws: Workspace) -> None:
    ws.call("POST", TRACK, {
        "attributes": [
            {"external_id": "victim-77", "email": "victim@example.com", "first_name": "Vickyname",
             "fav_color": "chartreuse"},
            {"external_id": "keeper-1", "email": "keeper@example.com", "first_name": "Keepername"},
        ],
        "events": [{"external_id": "victim-77", "name": "opened", "time": "2026-11-01T00:00:00Z"}],
    })


def export_of(external_id: str, fields: list[str]) -> dict[str, Any]:
    return req(EXPORT, {"external_ids": [external_id], "fields_to_export": fields})


def ledger(path: Path) -> pl.DataFrame:
    frame = pl.from_arrow(DeltaTable(str(path / "_ledger")).to_pyarrow_table())
    assert isinstance(frame, pl.DataFrame)
    return frame.sort("batch_no")


def events(ws: Workspace) -> int:
    return ws.table("events").collect().height


def test_a_replay_within_the_retention_window_answers_the_same_after_compaction(tmp_path: Path) -> None:
    ws = open_store(tmp_path / "s")
    victim_and_keeper(ws)
    batch = [req(TRACK, {"events": [{"external_id": "keeper-1", "name": "paid", "time": "2026-11-02T00:00:00Z"}]}),
             export_of("keeper-1", ["first_name", "email"])]
    first = ws.apply(batch, idempotency_key="k")
    ws.compact()
    again = open_store(tmp_path / "s")
    assert again.apply(batch, idempotency_key="k") == first
    assert events(again) == 2  # the replay applied nothing


def test_a_replay_after_the_retention_window_raises_and_applies_nothing(tmp_path: Path) -> None:
    ws = open_store(tmp_path / "s", response_retention=timedelta(0))
    victim_and_keeper(ws)
    batch = [req(TRACK, {"events": [{"external_id": "keeper-1", "name": "paid", "time": "2026-11-02T00:00:00Z"}]})]
    ws.apply(batch, idempotency_key="k")
    committed = ledger(tmp_path / "s").filter(pl.col("batch_key") == "k")["committed_at"].item()
    ws.compact()
    with pytest.raises(IdempotentResponsesExpired, match="older than the workspace's response retention") as error:
        ws.apply(batch, idempotency_key="k")
    assert (error.value.key, error.value.reason, error.value.committed_at) == ("k", "expired", committed)
    assert events(ws) == 2
    # the key still guards its batch: other requests under it are refused as before
    with pytest.raises(IdempotencyKeyReused):
        ws.apply([export_of("keeper-1", ["email"])], idempotency_key="k")
    row = ledger(tmp_path / "s").filter(pl.col("batch_key") == "k").row(0, named=True)
    assert (row["responses"], row["subjects"], row["responses_dropped"]) == (None, None, "expired")
    assert row["digest"] is not None


def test_a_deleted_users_batches_lose_their_responses_at_once_and_others_keep_theirs(tmp_path: Path) -> None:
    """The issue's reproduction, plus batches that name the user nowhere in their bodies."""
    ws = open_store(tmp_path / "s")
    victim_and_keeper(ws)
    export_victim = [export_of("victim-77", ["first_name", "email", "custom_attributes"])]
    answered = ws.apply(export_victim, idempotency_key="k1")
    assert answered[0].body["users"][0]["email"] == "victim@example.com"
    # an alias set on the victim, found through its email (the body names no external ID)
    by_email = [req(TRACK, {"attributes": [{"email": "victim@example.com", "nickname": "vic"}]})]
    ws.apply(by_email, idempotency_key="k-email")
    keeper = [export_of("keeper-1", ["first_name"])]
    kept = ws.apply(keeper, idempotency_key="k2")
    ws.call("POST", DELETE, {"external_ids": ["victim-77"]})
    ws.compact()

    for key, batch in (("k1", export_victim), ("k-email", by_email)):
        with pytest.raises(IdempotentResponsesExpired, match="concerned a user deleted since") as error:
            ws.apply(batch, idempotency_key=key)
        assert error.value.reason == "erased"
    assert ws.apply(keeper, idempotency_key="k2") == kept
    rows = ledger(tmp_path / "s")
    text = rows.filter(pl.col("responses").is_not_null())["responses"].str.join("").item()
    assert "Vickyname" not in text and "victim@example.com" not in text and "Keepername" in text


def test_a_user_merged_into_a_deleted_one_counts_as_deleted(tmp_path: Path) -> None:
    ws = open_store(tmp_path / "s")
    ws.call("POST", TRACK, {"attributes": [{"external_id": "a", "first_name": "Alfa"},
                                           {"external_id": "b", "first_name": "Bravo"}]})
    about_a = [export_of("a", ["first_name"])]
    ws.apply(about_a, idempotency_key="ka")
    ws.call("POST", MERGE, {"merge_updates": [{"identifier_to_merge": {"external_id": "a"},
                                               "identifier_to_keep": {"external_id": "b"}}]})
    ws.call("POST", DELETE, {"external_ids": ["b"]})
    ws.compact()
    with pytest.raises(IdempotentResponsesExpired) as error:
        ws.apply(about_a, idempotency_key="ka")
    assert error.value.reason == "erased"


def test_a_keyed_batch_stores_the_users_it_read_or_wrote(tmp_path: Path) -> None:
    ws = open_store(tmp_path / "s")
    victim_and_keeper(ws)  # profiles 0 (victim) and 1 (keeper)
    ws.apply([req(TRACK, {"attributes": [{"external_id": "new-2", "first_name": "Neo"}]}),
              export_of("victim-77", ["first_name"])], idempotency_key="k")
    row = ledger(tmp_path / "s").filter(pl.col("batch_key") == "k").row(0, named=True)
    assert sorted(row["subjects"]) == sorted([service_id(0), service_id(2)])


def test_unkeyed_batches_store_no_responses(tmp_path: Path) -> None:
    ws = open_store(tmp_path / "s")
    victim_and_keeper(ws)
    ws.apply([export_of("victim-77", ["email"])])
    rows = ledger(tmp_path / "s")
    assert rows["responses"].null_count() == rows.height
    assert rows["subjects"].null_count() == rows.height


def test_stored_responses_leave_no_statistics_in_the_delta_log_or_the_footers(tmp_path: Path) -> None:
    ws = open_store(tmp_path / "s")
    victim_and_keeper(ws)
    ws.apply([export_of("victim-77", ["email", "first_name"])], idempotency_key="k")
    log = tmp_path / "s" / "_ledger" / "_delta_log"
    stats = [json.loads(json.loads(line)["add"]["stats"]) for entry in sorted(log.glob("*.json"))
             for line in entry.read_text().splitlines() if '"add"' in line]
    assert stats and all(set(s["minValues"]) <= {"batch_no", "batch_key", "committed_at", "kind"} for s in stats)
    keyed = [p for p in (tmp_path / "s" / "_ledger").glob("*.parquet")
             if pq.read_table(p, columns=["batch_key"])["batch_key"].to_pylist() == ["k"]]
    assert len(keyed) == 1
    meta = pq.ParquetFile(keyed[0]).metadata
    for i in range(meta.num_columns):
        column = meta.row_group(0).column(i)
        if column.path_in_schema.split(".")[0] in ("responses", "subjects"):
            assert column.statistics is None or not column.statistics.has_min_max, column.path_in_schema


def test_compaction_leaves_no_old_ledger_file_holding_dropped_responses(tmp_path: Path) -> None:
    ws = open_store(tmp_path / "s")
    victim_and_keeper(ws)
    ws.apply([export_of("victim-77", ["email"])], idempotency_key="k1")
    ws.call("POST", DELETE, {"external_ids": ["victim-77"]})
    ws.compact()
    folder = tmp_path / "s" / "_ledger"
    files = list(folder.glob("*.parquet"))
    assert len(files) == 2  # the rewritten ledger and the compaction's row; the old files are vacuumed
    assert all("victim@example.com" not in str(pl.read_parquet(file).to_dicts()) for file in files)
    for entry in (folder / "_delta_log").iterdir():
        if entry.is_file():
            assert b"victim" not in entry.read_bytes(), entry.name


def test_compaction_drops_a_deleted_users_submits_and_publishes_the_copy_again(tmp_path: Path) -> None:
    """The preference-center submit log and the store's published copy (`publish`) hold no
    deleted user after a compaction; the other user's rows stay."""
    ws = open_store(tmp_path / "s")
    victim_and_keeper(ws)
    ws.publish()
    sids = {"victim": service_id(0), "keeper": service_id(1)}

    def log_submits(ctx: Any) -> None:
        changes = Changes()
        changes.upsert("preference_center_submits", pl.DataFrame([
            {"center_id": "c", "service_id": sid, "fields": "{}", "token_expires_at": NOW, "at": NOW}
            for sid in sids.values()]))
        ctx.write(changes)

    ws.write(log_submits)
    ws.call("POST", DELETE, {"external_ids": ["victim-77"]})
    ws.compact()

    assert ws.table("preference_center_submits").collect()["service_id"].to_list() == [sids["keeper"]]
    current = tmp_path / "s" / "current"
    emails = pl.read_delta(str(current / "profiles"))["email"].to_list()
    assert emails == ["keeper@example.com"]
    for path in current.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".parquet"):
            text = path.read_bytes() if path.suffix == ".json" else str(pl.read_parquet(path).to_dicts()).encode()
            assert b"victim@example.com" not in text, path


def test_compaction_removes_a_log_entry_a_killed_writer_never_linked(tmp_path: Path) -> None:
    """A writer killed between writing a log entry and linking it in leaves a temporary file in
    `_delta_log` holding statistics of values (an email here): compaction removes it."""
    ws = Workspace.open(tmp_path / "store", clock=lambda: NOW, seed=SEED)
    ws.call("POST", TRACK, {"attributes": [{"external_id": "victim", "email": "victim@example.com"}]})
    log = tmp_path / "store" / "profiles" / "_delta_log"
    entry = sorted(log.glob("*.json"))[-1]
    left = log / "_commit_0f0f0f0f-0000-0000-0000-000000000000.json.tmp"
    left.write_bytes(entry.read_bytes())  # what the killed writer had written
    assert b"victim@example.com" in left.read_bytes()
    ws.call("POST", "/users/delete", {"external_ids": ["victim"]})
    ws.compact()
    assert not left.exists() and list(log.glob("*.tmp")) == []


def test_a_ledger_written_before_digests_and_subjects_compacts_as_it_reads(tmp_path: Path) -> None:
    """An older store's ledger files lack the later columns: they read as nulls, its unkeyed
    batches lose their stored responses, and a replay of a keyed batch is still refused."""
    from deltalake import write_deltalake

    from engagelake.store.ledger import DUCK_TYPES as _DUCK_TYPES
    from engagelake.store.ledger import LEDGER_SCHEMA

    assert _DUCK_TYPES.keys() == LEDGER_SCHEMA.keys()
    ws = open_store(tmp_path / "s", response_retention=timedelta(0))
    victim_and_keeper(ws)
    batch = [export_of("keeper-1", ["first_name"])]
    ws.apply(batch, idempotency_key="k")
    path = str(tmp_path / "s" / "_ledger")
    old = ledger(tmp_path / "s").drop("digest", "subjects", "responses_dropped", "kind").with_columns(
        responses=pl.when(pl.col("batch_key").is_null() & (pl.col("batch_no") > 0))
        .then(pl.lit("[[201, {}]]")).otherwise(pl.col("responses")))  # older stores kept unkeyed responses
    write_deltalake(path, old.to_arrow(), mode="overwrite", schema_mode="overwrite")
    again = open_store(tmp_path / "s", response_retention=timedelta(0))
    again.compact()
    rows = ledger(tmp_path / "s")
    assert set(rows.columns) == set(LEDGER_SCHEMA)
    assert rows["batch_no"].to_list() == sorted(rows["batch_no"].to_list())
    assert rows.filter(pl.col("responses").is_not_null()).height == 0
    keyed = rows.filter(pl.col("batch_key") == "k").row(0, named=True)
    assert (keyed["responses_dropped"], keyed["digest"]) == ("expired", None)
    with pytest.raises(IdempotentResponsesExpired):
        again.apply(batch, idempotency_key="k")
