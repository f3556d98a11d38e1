"""Staged passes (`store/staging.py`): a batch that stages its finished passes to local files
answers and ends exactly as one that holds them in memory."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from tests.helpers import export_users, open_ws
from tests.test_apply_equals_call import (
    EVENTS_AND_PURCHASES,
    IDENTITIES_AND_ATTRIBUTES,
    PUSH_AND_SUBSCRIPTIONS,
    final_state,
    post_export,
    post_track,
)

import engagelake.batch as batch_module
from engagelake.rules.profile.reading import read_track
from engagelake.store import merging, scratch, staging
from engagelake.store.runs import sort_order
from engagelake.tables.changes import Changes
from engagelake.tables.schema import KEYS, SCHEMAS

MERGE = "/users/merge"

# an email that changes between passes, a merge and a delete between staged passes, and
# reads of each through the stages
CHANGES_BETWEEN_PASSES = [
    post_track(attributes=[{"external_id": "m1", "email": "first@example.com", "n": 1},
                           {"external_id": "m2", "email": "two@example.com", "push_tokens": [
                               {"app_id": "app", "token": "tok-2", "device_id": "dev-2"}]}],
               events=[{"external_id": "m1", "name": "e", "time": "2026-11-20T00:00:00Z"},
                       {"external_id": "m2", "name": "e", "time": "2026-11-21T00:00:00Z"}]),
    post_export(email_address="first@example.com"),
    post_track(attributes=[{"external_id": "m1", "email": "second@example.com", "n": {"inc": 2}}]),
    post_export(email_address="first@example.com"),
    post_export(email_address="second@example.com"),
    {"method": "POST", "path": MERGE, "body": {"merge_updates": [
        {"identifier_to_merge": {"external_id": "m2"}, "identifier_to_keep": {"external_id": "m1"}}]}},
    post_export(external_ids=["m1", "m2"]),
    post_track(events=[{"external_id": "m1", "name": "e", "time": "2026-11-22T00:00:00Z"}]),
    post_export(external_ids=["m1"], device_id="dev-2"),
    {"method": "POST", "path": "/users/delete", "body": {"external_ids": ["m1"]}},
    post_export(external_ids=["m1"]),
    post_track(attributes=[{"external_id": "m1", "email": "second@example.com"}]),
    post_export(email_address="second@example.com"),
]

# resource endpoints between staged passes read their (whole, small) tables through the stages
CATALOG = {"catalogs": [{"name": "shops", "description": "Shops", "fields": [
    {"name": "id", "type": "string"}, {"name": "Rating", "type": "number"}]}]}
RESOURCES_BETWEEN_PASSES = [
    post_track(attributes=[{"external_id": "r1", "n": 1}]),
    {"method": "POST", "path": "/catalogs", "body": CATALOG},
    post_track(attributes=[{"external_id": "r1", "n": {"inc": 1}}]),
    {"method": "POST", "path": "/catalogs", "body": CATALOG},  # taken now
    {"method": "PUT", "path": "/catalogs/shops/items", "body": {"items": [{"id": "s1", "Rating": 4}]}},
    post_track(attributes=[{"external_id": "r2", "n": 2}]),
    {"method": "GET", "path": "/catalogs", "body": None},
    post_export(external_ids=["r1", "r2"]),
]

BATCHES = [IDENTITIES_AND_ATTRIBUTES, PUSH_AND_SUBSCRIPTIONS, EVENTS_AND_PURCHASES, CHANGES_BETWEEN_PASSES,
           RESOURCES_BETWEEN_PASSES]


@pytest.fixture
def stage_counter(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Stage after every pass (passes of one request) and count the stages."""
    monkeypatch.setattr(batch_module, "STAGE_ROWS", 1)
    monkeypatch.setattr(batch_module, "TRACK_RUN_MAX", 1)
    stages = [0]
    add = staging.Stages.add

    def counted(self: staging.Stages, *args: Any) -> None:
        stages[0] += 1
        add(self, *args)

    monkeypatch.setattr(staging.Stages, "add", counted)
    return stages


@pytest.mark.slow  # an equivalence: each batch applied twice, staged and held (2-3 s each)
@pytest.mark.parametrize("batch", BATCHES, ids=["identities", "push", "history", "between-passes", "resources"])
def test_staged_passes_answer_and_end_as_held_ones(tmp_path: Path, batch: list[dict[str, Any]],
                                                   stage_counter: list[int]) -> None:
    staged_ws = open_ws(tmp_path, "staged")
    staged = staged_ws.apply(batch)
    assert stage_counter[0] >= 3  # the batch really went through stages
    with pytest.MonkeyPatch.context() as held_mode:
        held_mode.setattr(batch_module, "STAGE_ROWS", 10**9)
        held_ws = open_ws(tmp_path, "held")
        held = held_ws.apply(batch)
    assert staged == held
    assert final_state(staged_ws) == final_state(held_ws)


def test_between_passes_reads_see_the_staged_rows(tmp_path: Path, stage_counter: list[int]) -> None:
    ws = open_ws(tmp_path)
    got = ws.apply(CHANGES_BETWEEN_PASSES)
    assert [r.status for r in got] == [201, 200, 201, 200, 200, 202, 200, 201, 200, 200, 200, 201, 200]
    assert got[1].body["users"][0]["external_id"] == "m1"
    assert got[3].body["users"] == []  # m1 moved to its second email in a later pass
    assert got[4].body["users"][0]["custom_attributes"] == {"n": 3}
    merged = got[6].body
    assert [u["external_id"] for u in merged["users"]] == ["m1"] and merged["invalid_user_ids"] == ["m2"]
    assert got[10].body["users"] == []  # deleted
    # committed: the indexes found the final email, not the stale one
    again = open_ws(tmp_path)
    assert export_users(again, ["external_id"], email_address="second@example.com") == [{"external_id": "m1"}]
    assert export_users(again, ["external_id"], email_address="first@example.com") == []


def test_each_pass_is_read_by_the_reader_the_batch_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`apply(read_track=...)` (how a flow reads passes on its workers): passes of two requests,
    each read by the reader, then its rules; an export between passes sees every pass before
    it; the answers and the store are those of one request at a time."""
    monkeypatch.setattr(batch_module, "TRACK_RUN_MAX", 2)
    events: list[str] = []
    real_apply = batch_module.apply_track

    def read(texts: Any, max_updates: int | None) -> Any:
        events.append(f"read {len(texts)}")
        return read_track(texts, max_updates)

    def apply(*args: Any, **kwargs: Any) -> Any:
        events.append("rules")
        return real_apply(*args, **kwargs)

    monkeypatch.setattr(batch_module, "apply_track", apply)
    batch = [post_track(attributes=[{"external_id": f"p{n}", "n": n, "email": f"p{n % 3}@example.com"}])
             for n in range(7)]
    batch.insert(5, post_export(email_address="p1@example.com"))
    ws = open_ws(tmp_path, "passes")
    got = ws.apply(batch, read_track=read)
    # passes [0, 1] [2, 3] [4], the export, [5, 6]
    assert events == ["read 2", "rules", "read 2", "rules", "read 1", "rules", "read 2", "rules"], events
    assert {u["external_id"] for u in got[5].body["users"]} >= {"p4"}  # applied in the pass before
    one_by_one = open_ws(tmp_path, "one-by-one")
    assert got == [one_by_one.call(r["method"], r["path"], r["body"]) for r in batch]
    assert final_state(ws) == final_state(one_by_one)


@pytest.mark.slow  # an equivalence: a batch run twice over a competing commit, then once alone
def test_the_stages_folder_goes_with_the_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               stage_counter: list[int]) -> None:
    """Also when another writer commits first: the batch runs again, with stages of its own."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    ws, other = open_ws(tmp_path), open_ws(tmp_path)
    commit, first = ws.store.commit, [True]

    def another_writer_first(*args: Any, **kwargs: Any) -> None:
        if first.pop() if first else False:
            other.apply([post_track(attributes=[{"external_id": "other", "x": 1}])])
        commit(*args, **kwargs)

    monkeypatch.setattr(ws.store, "commit", another_writer_first)
    got = ws.apply(IDENTITIES_AND_ATTRIBUTES)
    stages = stage_counter[0]
    assert stages >= 6  # two attempts
    assert not list(tmp_path.glob("engagelake-stages-*"))
    with pytest.MonkeyPatch.context() as held_mode:
        held_mode.setattr(batch_module, "STAGE_ROWS", 10**9)
        alone = open_ws(tmp_path, "alone")
        alone.apply([post_track(attributes=[{"external_id": "other", "x": 1}])])
        assert alone.apply(IDENTITIES_AND_ATTRIBUTES) == got


@pytest.mark.slow  # an equivalence: a generator's batch retried after a competing commit
@pytest.mark.parametrize("spool", [16 << 20, 1], ids=["kept-in-memory", "spooled-to-disk"])
def test_a_generator_is_read_once_as_the_batch_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    stage_counter: list[int], spool: int) -> None:
    """`apply` takes a generator lazily: earlier passes ran (and staged) before later requests
    were drawn; a retry after another writer's commit replays what was read, from memory or
    from its temporary file."""
    monkeypatch.setattr(batch_module, "SEEN_SPOOL_BYTES", spool)
    spooled: list[bool] = []
    replay = batch_module.Seen.replay

    def replayed(self: batch_module.Seen) -> Iterator[Any]:
        spooled.append(bool(self.file._rolled))  # type: ignore[attr-defined]
        yield from replay(self)

    monkeypatch.setattr(batch_module.Seen, "replay", replayed)
    stages_seen: list[int] = []

    def requests() -> Iterator[dict[str, Any]]:
        for request in CHANGES_BETWEEN_PASSES:
            stages_seen.append(stage_counter[0])
            yield request

    ws, other = open_ws(tmp_path), open_ws(tmp_path)
    commit, first = ws.store.commit, [True]

    def another_writer_first(*args: Any, **kwargs: Any) -> None:
        if first.pop() if first else False:
            other.apply([post_track(attributes=[{"external_id": "other", "x": 1}])])
        commit(*args, **kwargs)

    monkeypatch.setattr(ws.store, "commit", another_writer_first)
    got = ws.apply(requests())
    assert len(stages_seen) == len(CHANGES_BETWEEN_PASSES)  # drawn once, though the batch ran twice
    assert spooled[-1] is (spool == 1)
    assert stages_seen[-1] > stages_seen[0]  # passes ran between the draws
    alone = open_ws(tmp_path, "alone")
    alone.apply([post_track(attributes=[{"external_id": "other", "x": 1}])])
    assert alone.apply(CHANGES_BETWEEN_PASSES) == got


def test_a_killed_batch_leaves_a_folder_that_the_next_stage_removes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     stage_counter: list[int]) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a process ID nobody holds now
    dead = tmp_path / f"{staging.PREFIX}{gone.pid}-abc"
    live = tmp_path / f"{staging.PREFIX}{os.getpid()}-def"  # this process: maybe another batch's
    for folder in (dead, live):
        folder.mkdir()
        (folder / "00000-profiles.arrow").write_bytes(b"")
    open_ws(tmp_path).apply(IDENTITIES_AND_ATTRIBUTES)
    assert stage_counter[0] >= 3
    assert not dead.exists() and live.exists()


def _attributes(rows: list[tuple[str, str, str]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=["service_id", "name", "value"], orient="row")


def _events(rows: list[tuple[str, int]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=["service_id", "update_seq"], orient="row").with_columns(
        name=pl.format("e{}", "update_seq"))


def test_the_commit_stream_is_each_keys_newest_row_in_file_order(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The streamed commit writes what the held one writes: the newest row per key across the
    stages (tombstones kept), a log's every row, both sorted as their files keep them; in
    batches of at most `STREAM_ROWS` rows."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(staging, "STREAM_ROWS", 2)
    first, second = Changes(), Changes()
    first.upsert("attributes", _attributes([("u3", "a", "1"), ("u1", "b", "1"), ("u2", "a", "1")]))
    first.upsert("events", _events([("u2", 5), ("u1", 7), ("u2", 3)]))
    second.upsert("attributes", _attributes([("u2", "a", "2"), ("u0", "z", "2")]))
    second.delete("attributes", _attributes([("u3", "a", "")]))
    second.upsert("events", _events([("u1", 7), ("u0", 9)]))
    stages = staging.Stages()
    stages.add(first, {})
    stages.add(second, {})
    assert stages.streamed() == {"attributes", "events"}
    assert not stages.changes()  # nothing left for the in-memory path

    def streamed(name: str) -> pl.DataFrame:
        schema = pl.DataFrame(schema={**SCHEMAS[name], "_batch": pl.Int64(), "_deleted": pl.Boolean()}).to_arrow().schema
        reader = stages.stream(name, 12, schema)
        batches = list(reader)
        assert all(b.num_rows <= 2 for b in batches)
        frame = pl.from_arrow(pa.Table.from_batches(batches, schema))
        assert isinstance(frame, pl.DataFrame)
        return frame

    attributes = streamed("attributes")
    assert attributes.select("service_id", "name", "value", "_deleted").rows() == [
        ("u0", "z", "2", False), ("u1", "b", "1", False), ("u2", "a", "2", False), ("u3", "a", None, True)]
    assert attributes["_batch"].to_list() == [12] * 4
    events = streamed("events")
    assert events.select("service_id", "update_seq", "name").rows() == [
        ("u0", 9, "e9"), ("u1", 7, "e7"), ("u1", 7, "e7"), ("u2", 3, "e3"), ("u2", 5, "e5")]
    assert stages.upserted("attributes", ["service_id", "name"]).sort("service_id").rows() == [
        ("u0", "z"), ("u1", "b"), ("u2", "a")]
    stages.remove()


def test_a_staged_batch_writes_sorted_runs(tmp_path: Path, stage_counter: list[int]) -> None:
    """Probes rely on each run's files being sorted: the streamed commit keeps them so."""
    ws = open_ws(tmp_path)
    ws.apply(IDENTITIES_AND_ATTRIBUTES + EVENTS_AND_PURCHASES)
    assert stage_counter[0] >= 3
    for name in ("profiles", "external_ids", "attributes", "events"):
        order = sort_order(name, KEYS[name])
        assert order is not None
        newest = ws.store.runs(name, ws.store.head.versions[name])[0]
        for file in newest.files:
            rows = pl.read_parquet(file).select(order)
            assert rows.height
            assert rows.equals(rows.sort(order, nulls_last=True, maintain_order=True)), (name, file)


def test_a_killed_merge_leaves_a_spill_folder_that_the_next_merge_removes(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"{scratch.prefix('duckdb')}{gone.pid}-abc"
    live = tmp_path / f"{scratch.prefix('duckdb')}{os.getpid()}-def"
    for folder in (dead, live):
        folder.mkdir()
    with merging.connection(None) as con:
        spills = [p for p in tmp_path.glob(f"{scratch.prefix('duckdb')}{os.getpid()}-*") if p != live]
        assert len(spills) == 1 and con.sql("select current_setting('temp_directory')").fetchall() == [(str(spills[0]),)]
    assert not dead.exists() and live.exists() and not spills[0].exists()


def test_a_big_batch_waits_for_the_run_merge_before_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run merge and a big batch would hold their memory at once: a batch whose requests fill
    a pass waits for the merge the last commit started before it runs that pass; a small batch
    never waits (a merge takes the writer lock only to publish its runs)."""
    ws = open_ws(tmp_path)
    waits: list[int] = []
    wait = ws.store.wait_for_merges
    def counted() -> None:
        waits.append(1)
        wait()
    monkeypatch.setattr(ws.store, "wait_for_merges", counted)
    monkeypatch.setattr(batch_module, "TRACK_RUN_MAX", 2)
    ws.apply([post_track(attributes=[{"external_id": "a", "n": 1}])])
    assert waits == []
    ws.apply([post_track(attributes=[{"external_id": f"b{i}", "n": i}]) for i in range(3)])
    assert len(waits) == 1  # the first full pass's
