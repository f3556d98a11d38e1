"""A store on object storage (`s3://bucket/prefix`) answers exactly as a local one.

The S3 server is moto's, started for real as a process of its own (`tests/s3_server.py`).
"""

from __future__ import annotations

import copy
import multiprocessing
import signal
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from tests.crash_worker import (
    BATCH_1,
    BATCH_2,
    KEY_1,
    KEY_2,
    WRITTEN,
    open_store,
    run_worker,
    snapshot,
)
from tests.helpers import export_one, unpinned
from tests.test_api_server import bearer, send, served
from tests.test_model_property import (
    IDENTITY_SEQUENCES,
    SEED,
    TRICKY_SEQUENCES,
    assert_same,
    clock,
    describe,
    engine_settings,
    request_sequences,
    response_pair,
    run_model,
)

from engagelake import Workspace
from engagelake.errors import (
    ConfigError,
    IdempotencyKeyReused,
    StoreDamaged,
    StoreError,
    StoreReadOnly,
    TurnEndedError,
)
from engagelake.store import appends, layout, lease, merging, objects
from engagelake.store.lease import Lease
from engagelake.store.ledger import Ledger
from engagelake.store.publish import published

pytest_plugins = ["tests.s3_server"]

if TYPE_CHECKING:
    from tests.s3_server import S3


def open_s3(uri: str) -> Workspace:
    return Workspace.open(uri, clock=clock, seed=SEED)


def check_against_model(ws: Workspace, reqs: list[dict], *, one_by_one: bool) -> None:
    model, want = run_model(reqs)
    if one_by_one:
        got = [ws.call(r["method"], r["path"], body=copy.deepcopy(r["body"])) for r in reqs]
    else:
        got = ws.apply(copy.deepcopy(reqs))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same(response_pair(g), w, f"response to request {i}")
    assert_same(ws.export_users(), model.export_users(), "final export_users()")


# every sequence in the slow run, the first in the default one (a store on S3 takes about 1.7 s
# to create against moto's server, and a sequence 3-5 s to run)
@pytest.mark.parametrize("sequence", [pytest.param(i, marks=() if i == 0 else pytest.mark.slow)
                                      for i in range(len(IDENTITY_SEQUENCES + TRICKY_SEQUENCES))])
def test_fixed_sequences_on_s3_answer_as_the_model(s3: Callable[[], str], sequence: int) -> None:
    """Merges, identify, renames, aliases, deletes and track requests that meet on the same
    users, as one batch or one call at a time, into a store on S3: every response and the
    final export as the model's."""
    reqs = (IDENTITY_SEQUENCES + TRICKY_SEQUENCES)[sequence]
    check_against_model(open_s3(s3()), reqs, one_by_one=(sequence // 4 + sequence) % 2 == 1)


@pytest.mark.slow
@engine_settings(8)
@given(reqs=request_sequences)
def test_random_sequences_on_s3_answer_as_the_model(s3: Callable[[], str], reqs: list[dict]) -> None:
    describe(reqs)
    check_against_model(open_s3(s3()), reqs, one_by_one=False)


BATCH = [
    {"method": "POST", "path": "/users/track",
     "body": {"attributes": [{"external_id": f"u{i}", "email": f"u{i}@example.com", "visits": {"inc": i}}
                             for i in range(5)],
              "events": [{"external_id": "u1", "name": "open", "time": "2026-01-01T00:00:00Z"}]}},
    {"method": "POST", "path": "/users/merge",
     "body": {"merge_updates": [{"identifier_to_merge": {"external_id": "u2"},
                                 "identifier_to_keep": {"external_id": "u1"}}]}},
]
EXPORT = {"external_ids": ["u1", "u2", "u3"], "fields_to_export": ["external_id", "email", "custom_attributes"]}


def test_a_new_process_sees_the_store_and_replays_a_keyed_batch(s3: Callable[[], str], tmp_path: Path) -> None:
    uri = s3()
    first = open_s3(uri).apply(copy.deepcopy(BATCH), idempotency_key="nightly-1")
    local = Workspace.open(tmp_path / "store", clock=clock, seed=SEED)
    assert first == local.apply(copy.deepcopy(BATCH), idempotency_key="nightly-1")
    assert [r.status for r in first] == [201, 202]

    again = open_s3(uri)  # as a new process would: nothing kept from the first
    assert again.apply(copy.deepcopy(BATCH), idempotency_key="nightly-1") == first
    assert again.batch_committed_at("nightly-1") is not None
    with pytest.raises(IdempotencyKeyReused):
        again.apply([BATCH[0]], idempotency_key="nightly-1")
    exported = again.call("POST", "/users/export/ids", EXPORT)
    assert exported.status == 200 and len(exported.body["users"]) == 2
    assert exported == local.call("POST", "/users/export/ids", EXPORT)
    assert_same(again.export_users(), local.export_users(), "every user")


def test_readers_of_a_store_on_s3_see_current_rows(s3: Callable[[], str], tmp_path: Path) -> None:
    stores = [open_s3(s3()), Workspace.open(tmp_path / "store", clock=clock, seed=SEED)]
    for ws in stores:
        ws.call("POST", "/users/track", {"attributes": [{"external_id": "a", "plan": "free"}, {"external_id": "b"}]})
        ws.call("POST", "/users/track", {"attributes": [{"external_id": "a", "plan": "pro"}]})
    for name in ("attributes", "external_ids", "profiles"):
        on_s3, local = (ws.table(name).collect().sort("service_id", maintain_order=True).to_dicts() for ws in stores)
        assert on_s3 == local, name
    assert stores[0].table("attributes").collect()["value"].to_list() == ['"pro"']


def _objects_holding(uri: str, text: str) -> list[str]:
    """The keys of the objects under the store `uri` whose bytes hold `text` (as forget-check
    searches a folder's files)."""
    import boto3

    bucket, prefix = uri.removeprefix("s3://").split("/", 1)
    client = boto3.client("s3")
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
            for o in page.get("Contents", [])]
    return [k for k in keys if text.encode() in client.get_object(Bucket=bucket, Key=k)["Body"].read()]


@pytest.mark.slow  # several stores, commits and publications against moto: seconds each
def test_compaction_on_s3_erases_a_deleted_user_from_every_object(s3: Callable[[], str], tmp_path: Path) -> None:
    """After a delete, the user's rows stay in older objects (behind tombstones); compaction
    rewrites every table to its current rows and deletes the objects and log entries that held
    them, and the store then answers as a compacted local store."""
    uri = s3()
    stores = [open_s3(uri), Workspace.open(tmp_path / "store", clock=clock, seed=SEED)]
    for ws in stores:
        ws.apply(copy.deepcopy(BATCH))
        ws.call("POST", "/users/track", {"attributes": [{"external_id": "gone-user", "email": "gone@example.org",
                                                         "nickname": "zebra-unicorn-17"}],
                                          "events": [{"external_id": "gone-user", "name": "secret-event",
                                                      "time": "2026-11-20T00:00:00Z"}]})
        ws.publish()  # the published copy (`<store>/current`) is published again by compaction
        assert ws.call("POST", "/users/delete", {"external_ids": ["gone-user"]}).body["deleted"] == 1
    secrets = ("gone-user", "gone@example.org", "zebra-unicorn-17", "secret-event")
    for secret in secrets:  # still on disk: a delete writes tombstones (so the search finds them)
        assert _objects_holding(uri, secret), secret
    assert _objects_holding(f"{uri}/current", "gone@example.org")
    kept = [ws.compact() for ws in stores]
    assert kept[0] == kept[1]
    for secret in secrets:
        assert _objects_holding(uri, secret) == [], secret
    after = open_s3(uri)
    assert_same(after.export_users(), stores[1].export_users(), "every user after compaction")
    assert after.call("POST", "/users/track", {"attributes": [{"external_id": "u9"}]}).status == 201


@pytest.mark.slow  # several stores, commits and publications against moto: seconds each
def test_a_publication_on_s3_holds_the_current_rows(s3: Callable[[], str]) -> None:
    """`publish` writes plain Delta tables and the marker under `<store>/current` on S3 (it
    joined paths as a folder's: "Unable to recognise URL s3:/..."), readable by `pl.read_delta`."""
    import polars as pl

    uri = s3()
    ws = open_s3(uri)
    ws.call("POST", "/users/track", {"attributes": [{"external_id": "a", "plan": "free"}, {"external_id": "b"}]})
    ws.call("POST", "/users/track", {"attributes": [{"external_id": "a", "plan": "pro"}]})
    ws.credentials.create_key("reader", ["users.export.ids"])
    rows = ws.publish()
    assert rows["profiles"] == 2 and "api_keys" not in rows
    marker = published(f"{uri}/current")
    assert marker is not None and marker["batch"] == ws.store.head.batch_no
    assert pl.read_delta(f"{uri}/current/attributes")["value"].to_list() == ['"pro"']
    ws.publish(tables=["api_keys"])
    assert pl.read_delta(f"{uri}/current/api_keys")["name"].to_list() == ["reader"]
    ws.publish()  # not named again: the copy goes rather than go stale
    assert not objects.exists(f"{uri}/current/api_keys/_delta_log/00000000000000000000.json")


@pytest.mark.slow
def test_storage_options_given_in_code_reach_every_reader_and_writer(s3: Callable[[], str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With no AWS_* variable in the environment, the options given to `Workspace.open` reach
    delta-rs, Polars, pyarrow and DuckDB: calls, run merges, reads, `sql`, publication,
    compaction and a new workspace's open."""
    import os

    uri = s3()
    options = {name: os.environ[name] for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                                                   "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ALLOW_HTTP")}
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance to ask for credentials
    try:
        ws = Workspace.open(uri, clock=clock, seed=SEED, storage_options=options)
        ws.store.background_merges = False
        for k in range(7):
            body = {"attributes": [{"external_id": f"u{k}", "n": k, "email": f"u{k}@example.com"}]}
            assert ws.call("POST", "/users/track", body).status == 201
        assert ws.store.merges and ws.store.merge_errors == []
        assert export_one(ws, "u2", ["custom_attributes"]) == {"custom_attributes": {"n": 2}}
        assert ws.table("profiles").collect().height == 7
        assert ws.sql("SELECT count(*) AS n FROM attributes").to_dicts() == [{"n": 7}]
        assert ws.publish()["profiles"] == 7
        assert ws.compact()["profiles"] == 7
        again = Workspace.open(uri, create=False, clock=clock, storage_options=options)
        assert export_one(again, "u6", ["email"]) == {"email": "u6@example.com"}
        with pytest.raises(ConfigError, match="AWS_ENDPOINT_URL"):  # a misspelt option is named
            Workspace.open(uri, storage_options={"endpoint": "http://localhost"})
    finally:
        objects.configure(uri, None)


# --- writers take turns through the lease (`store/lease.py`) ---------------------------------
def test_writers_take_turns_through_the_lease(s3: Callable[[], str]) -> None:
    uri = s3()
    a, b = Lease(uri), Lease(uri)
    a.acquire(None)
    with pytest.raises(StoreError, match="another writer held"):
        b.acquire(0.3)
    a.release(clean=True)
    b.acquire(1.0)
    assert b.clean_before  # the writer before finished: nothing to roll back
    b.release(clean=False)
    a.acquire(1.0)
    assert not a.clean_before  # ... or it may have left table versions no ledger row names
    a.release(clean=True)


@pytest.mark.slow  # a lease that lapses: 2.7 s, most of it waiting
def test_a_lease_not_renewed_ends_and_its_holder_may_not_publish(s3: Callable[[], str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease, "LEASE_S", 0.5)
    monkeypatch.setattr(lease, "RENEW_EVERY_S", 1.5)  # too late: a process paused past its lease
    uri = s3()
    paused, other = Lease(uri), Lease(uri)
    paused.acquire(None)
    other.acquire(5.0)  # once the lease has ended
    assert not other.clean_before
    time.sleep(2.0)  # the paused holder wakes, and finds its turn gone
    with pytest.raises(StoreError, match="lost its turn"):
        paused.check()
    paused.release(clean=True)  # gives back nothing: the lease is the other's
    other.release(clean=True)
    after = Lease(uri)
    after.acquire(1.0)
    assert after.clean_before  # the paused holder's release did not count
    after.release(clean=True)


@pytest.mark.slow  # a crash test: a failed commit and its rollback against moto, 5 s
def test_a_commit_that_fails_midway_on_s3_is_rolled_back_by_the_next_writer(
        s3: Callable[[], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables written, then the ledger row fails: the batch is not applied, the lease goes back
    marked unclean, and the next batch rolls the tables back before it writes."""
    uri = s3()
    ws, local = open_s3(uri), Workspace.open(tmp_path / "store", clock=clock, seed=SEED)
    first = {"attributes": [{"external_id": "a", "plan": "free"}]}
    lost = {"attributes": [{"external_id": "a", "plan": "lost"}, {"external_id": "ghost"}]}
    then = {"attributes": [{"external_id": "b", "plan": "pro"}]}
    assert ws.call("POST", "/users/track", first).status == 201
    local.call("POST", "/users/track", first)
    real = Ledger.append_rows

    def fail_batches(self: Ledger, batch_no: int, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("kind") == "batch":
            raise OSError("the ledger could not be written")
        return real(self, batch_no, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(Ledger, "append_rows", fail_batches)
        with pytest.raises(OSError, match="ledger could not be written"):
            ws.call("POST", "/users/track", lost)
    assert ws.call("POST", "/users/track", then).status == 201
    local.call("POST", "/users/track", then)
    for reader in (ws, open_s3(uri)):
        assert_same(reader.export_users(), local.export_users(), "every user")


@pytest.mark.slow  # several stores, commits and publications against moto: seconds each
def test_table_versions_no_ledger_row_names_are_rolled_back_before_a_write_even_after_a_clean_lease(
        s3: Callable[[], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer's tables are written and its ledger row is refused; then another holder gives
    the lease back clean without looking (as after a writer whose turn ended wrote on), so the
    next writer skips the roll-back check. Its writes must still not build on those versions:
    the refused batch's users would appear."""
    uri = s3()
    ws, local = open_s3(uri), Workspace.open(tmp_path / "store", clock=clock, seed=SEED)
    first = {"attributes": [{"external_id": "a", "plan": "free"}]}
    refused = {"attributes": [{"external_id": "a", "plan": "lost"}, {"external_id": "ghost"}]}
    then = {"attributes": [{"external_id": "b", "plan": "pro"}, {"external_id": "a", "visits": 1}]}
    for store in (ws, local):
        assert store.call("POST", "/users/track", first).status == 201
    with monkeypatch.context() as patch:
        patch.setattr(Ledger, "append_rows", lambda *args, **kwargs: (_ for _ in ()).throw(
            StoreError("this writer's turn had ended")))
        with pytest.raises(StoreError, match="turn had ended"):
            ws.call("POST", "/users/track", refused)
    janitor = Lease(uri)  # takes the unclean lease, gives it back clean, rolls nothing back
    janitor.acquire(5.0)
    janitor.release(clean=True)
    after = open_s3(uri)
    assert after.call("POST", "/users/track", then).status == 201
    local.call("POST", "/users/track", then)
    for reader in (after, open_s3(uri)):
        assert_same(reader.export_users(), local.export_users(), "every user")
        assert "ghost" not in reader.table("external_ids").collect()["external_id"].to_list()


@pytest.mark.slow  # several stores, commits and publications against moto: seconds each
def test_a_writer_whose_lease_ended_unseen_cannot_write_its_ledger_row_after_another_commit(
        s3: Callable[[], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writer A's renewals stop unseen (a pause) after it wrote its tables; its lease ends,
    writer B takes it, rolls A's tables back and commits; A then passes `Lease.check` (the race
    the lease alone leaves open) and goes to write its ledger row: refused, as the ledger moved
    since A read it. The store holds B's batch and not A's."""
    monkeypatch.setattr(lease, "LEASE_S", 0.5)
    uri = s3()
    a, b = open_s3(uri), open_s3(uri)
    local = Workspace.open(tmp_path / "store", clock=clock, seed=SEED)
    first = {"attributes": [{"external_id": "u1", "plan": "free"}]}
    for store in (a, local):
        assert store.call("POST", "/users/track", first).status == 201
    real = Ledger.append_rows
    others = {"attributes": [{"external_id": "u2", "plan": "pro"}, {"external_id": "u1", "visits": 2}]}

    def paused_then_resumed(self: Ledger, *args: Any, **kwargs: Any) -> Any:
        if self is a.store.ledger and kwargs.get("kind") == "batch":
            held = self.place.lease
            assert held is not None
            held._stop.set()  # its renewals stop, and nothing notices
            assert held._renewer is not None
            held._renewer.join()
            time.sleep(0.7)  # its lease has ended
            assert b.call("POST", "/users/track", others).status == 201  # B takes over and commits
            assert held._lost is None  # the check before the row passes
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Ledger, "append_rows", paused_then_resumed)
    with pytest.raises(StoreError, match="another writer committed"):
        a.call("POST", "/users/track", {"attributes": [{"external_id": "u1", "plan": "lost"},
                                                       {"external_id": "ghost"}]})
    monkeypatch.setattr(Ledger, "append_rows", real)
    assert _unnamed_files(uri, "_ledger") == set()  # the refused row's file went with it
    local.call("POST", "/users/track", others)
    for reader in (open_s3(uri), b):
        assert_same(reader.export_users(), local.export_users(), "every user")
    assert open_s3(uri).call("POST", "/users/track", {"attributes": [{"external_id": "u3"}]}).status == 201


@pytest.mark.slow  # two writers and a lease that lapses mid-compaction against moto: 7-8 s
def test_a_compaction_whose_lease_ended_while_its_parts_ran_commits_nothing(
        s3: Callable[[], str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Planner A's renewals stop unseen while its parts are written; its lease ends, writer B
    takes it (rolling the compaction A left forward) and commits a batch; A's `finish` is then
    refused before it writes a table, and the store holds B's batch."""
    monkeypatch.setattr(lease, "LEASE_S", 0.5)
    uri = s3()
    a, b = open_s3(uri), open_s3(uri)
    users = [{"external_id": f"u{n}", "plan": "free"} for n in range(30)]
    assert a.call("POST", "/users/track", {"attributes": users}).status == 201
    with pytest.raises(StoreError, match="another writer committed"), a.compaction(2, min_part_rows=1) as job:
        written = [a.compact_part(job.plan, part) for part in job.plan.parts]
        held = a.store._lease
        assert held is not None and held._renewer is not None
        held._stop.set()  # its renewals stop, and nothing notices
        held._renewer.join()
        time.sleep(0.7)  # its lease has ended
        assert b.call("POST", "/users/track", {"attributes": [{"external_id": "u1", "plan": "pro"}]}).status == 201
        job.finish(written)
    for name in ("profiles", "attributes"):  # refused before it wrote a table version
        assert objects.delta_table(f"{uri}/{name}").version() == b.store.head.versions[name], name
    reader = open_s3(uri)
    assert export_one(reader, "u1", ["custom_attributes"]) == {"custom_attributes": {"plan": "pro"}}
    assert reader.store.head.batch_no == b.store.head.batch_no  # nothing after B's batch
    assert open_s3(uri).call("POST", "/users/track", {"attributes": [{"external_id": "u2", "plan": "x"}]}).status == 201


@pytest.mark.slow
def test_writer_processes_on_s3_all_commit_and_lose_no_update(s3: Callable[[], str]) -> None:
    uri = s3()
    ws = open_s3(uri)
    assert ws.call("POST", "/users/track", {"attributes": [{"external_id": "shared", "count": 0}]}).status == 201
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(3, mp_context=context, initializer=unpinned) as pool:
        statuses = [s for f in [pool.submit(_writer, uri, w) for w in range(3)] for s in f.result(timeout=600)]
    assert statuses == [201] * 3 * WRITER_BATCHES
    user = export_one(open_s3(uri), "shared", ["custom_attributes"])
    assert user is not None and user["custom_attributes"]["count"] == 3 * WRITER_BATCHES
    assert len(open_s3(uri).export_users(["external_id"])) == 1 + 3 * WRITER_BATCHES


WRITER_BATCHES = 4


def _writer(uri: str, writer: int) -> list[int]:
    ws = Workspace.open(uri, seed=SEED)
    return [ws.call("POST", "/users/track", {"attributes": [{"external_id": "shared", "count": {"inc": 1}},
                                                            {"external_id": f"w{writer}-{n}"}]}).status
            for n in range(WRITER_BATCHES)]


# --- a writer killed mid-commit (kill -9 at each stage of the commit protocol) ----------------
@pytest.mark.slow
# (every point of the protocol is killed at on a local store: tests/test_store_crash.py)
@pytest.mark.parametrize("point", [f"after_table:{WRITTEN[len(WRITTEN) // 2]}", "before_ledger", "after_ledger"])
def test_a_writer_killed_mid_commit_on_s3_loses_nothing(s3: Callable[[], str], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    """The dead writer's lease ends (here after 3 s), the next writer rolls back what it left,
    and the store reads as before the batch (or as after it, once its ledger row was written);
    the batch run again under its key ends as a run that never crashed."""
    monkeypatch.setenv("ENGAGELAKE_LEASE_S", "3")  # the child's
    monkeypatch.setattr(lease, "LEASE_S", 3.0)
    monkeypatch.setattr(lease, "RENEW_EVERY_S", 0.75)
    reference = open_store(tmp_path / "reference")
    reference.apply(BATCH_1, idempotency_key=KEY_1)
    before = snapshot(reference)
    uri = s3()
    assert [r.status for r in open_store(uri).apply(BATCH_1, idempotency_key=KEY_1)] == [201]
    proc = run_worker(uri, point)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]

    after_crash = open_store(uri)
    if point == "after_ledger":
        assert after_crash.batch_committed_at(KEY_2) is not None
    else:
        assert_same(snapshot(after_crash)["export"], before["export"], "the store after the crash")
    want = reference.apply(BATCH_2, idempotency_key=KEY_2)
    assert after_crash.apply(BATCH_2, idempotency_key=KEY_2) == want  # run again (or replayed)
    got, full = snapshot(open_store(uri)), snapshot(reference)
    assert_same(got["export"], full["export"], "the store after the batch ran again")
    assert got["head"] == full["head"]
    assert {name: rows for name, (_, _, rows) in got["tables"].items()} == \
        {name: rows for name, (_, _, rows) in full["tables"].items()}


def _open_and_track(uri: str, n: int, start: Any) -> int:
    start.wait()  # every process opens the new store at once
    return Workspace.open(uri, seed=SEED).call("POST", "/users/track", {"attributes": [{"external_id": f"p{n}"}]}).status


@pytest.mark.slow
def test_processes_opening_one_new_store_on_s3_make_one_store(s3: Callable[[], str]) -> None:
    """Processes that open one new store at about the same time: the first creates it, under
    the lease, and the others find it made."""
    uri = s3()
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(3, mp_context=context, initializer=unpinned) as pool:
        start = manager.Barrier(3)
        statuses = list(pool.map(_open_and_track, [uri] * 3, range(3), [start] * 3, timeout=600))
    assert statuses == [201] * 3
    assert sorted(u["external_id"] for u in open_s3(uri).export_users(["external_id"])) == ["p0", "p1", "p2"]


def test_sql_over_a_store_on_s3_reads_current_rows(s3: Callable[[], str], tmp_path: Path) -> None:
    """DuckDB reads the objects through pyarrow (its own S3 reader is an extension it would
    download): the same answers as over a folder, partial rows and merged users' events
    included."""
    stores = [open_s3(s3()), Workspace.open(tmp_path / "store", clock=clock, seed=SEED)]
    query = ("select p.external_id, count(e.name) as events, any_value(a.value) as plan from profiles p "
             "left join events e using (service_id) left join attributes a on a.service_id = p.service_id "
             "and a.name = 'plan' group by all order by 1")
    answers = []
    for ws in stores:
        ws.apply(copy.deepcopy(BATCH))
        ws.call("POST", "/users/track", {"attributes": [{"external_id": "u3", "first_name": "Ana", "plan": "pro"}]})
        answers.append(ws.sql(query).to_dicts())
    assert answers[0] == answers[1]
    assert answers[0][0] == {"external_id": "u0", "events": 0, "plan": None}
    assert {"external_id": "u1", "events": 1, "plan": None} in answers[0]
    assert {"external_id": "u3", "events": 0, "plan": '"pro"'} in answers[0]


@pytest.mark.slow
@pytest.mark.parametrize("table", ["events", "_ledger"])
def test_a_compaction_killed_on_s3_rolls_forward_to_the_same_content(
        s3: Callable[[], str], monkeypatch: pytest.MonkeyPatch, table: str) -> None:
    """Killed after rewriting some tables: once its lease ends, the next reader rolls it forward
    (its marker object says so), and the store holds what it held before."""
    monkeypatch.setenv("ENGAGELAKE_LEASE_S", "3")  # the child's
    monkeypatch.setattr(lease, "LEASE_S", 3.0)
    monkeypatch.setattr(lease, "RENEW_EVERY_S", 0.75)
    uri = s3()
    ws = open_store(uri)
    ws.apply(BATCH_1, idempotency_key=KEY_1)
    ws.apply(BATCH_2, idempotency_key=KEY_2)
    before = snapshot(open_store(uri))
    proc = run_worker(uri, f"compact:{table}")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    after = snapshot(open_store(uri))
    assert {k: v for k, v in after.items() if k != "head"} == {k: v for k, v in before.items() if k != "head"}
    assert not open_store(uri).store.place.compacting()
    open_store(uri).compact()  # and compacting again finishes the job
    assert snapshot(open_store(uri))["export"] == before["export"]


@pytest.mark.slow  # a crash test: a creation that dies, and the next one, against moto: 5 s
def test_a_creation_on_s3_that_died_before_its_ledger_is_done_again(s3: Callable[[], str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Its marker object says a creation was under way: the tables without a ledger are not
    taken for damage, and the next open creates the store again."""
    def dies(name: str) -> None:
        if name == "create:before_ledger":
            raise KeyboardInterrupt  # the process stops between the tables and the ledger

    uri = s3()
    monkeypatch.setattr(layout, "failpoint", dies)
    with pytest.raises(KeyboardInterrupt):
        open_s3(uri)
    monkeypatch.undo()
    ws = open_s3(uri)
    assert ws.call("POST", "/users/track", {"attributes": [{"external_id": "a"}]}).status == 201
    assert not objects.exists(f"{uri}/{layout.CREATING}")
    assert [u["external_id"] for u in open_s3(uri).export_users(["external_id"])] == ["a"]


def _requests_of(s3: S3, step: Callable[[], object]) -> int:
    """How many requests the S3 server answered during `step`."""
    return len(s3.during(step)[0])


@pytest.mark.slow
def test_a_call_on_s3_costs_the_same_requests_after_40_batches_as_after_4(s3: S3) -> None:
    """The requests of a small call follow the call, not the store's history: no whole-ledger
    read, no table log read again from its start; run merges work on S3 (they raised, and
    every next writer rolled back what they left). A fresh process opens the store with a
    bounded number of requests (a checkpoint every 10 versions)."""
    uri = s3()
    ws = open_s3(uri)
    ws.store.background_merges = False  # a call's count holds the merge it makes due

    def track(k: int) -> None:
        body = {"attributes": [{"external_id": f"u{k}", "n": k, "email": f"u{k}@example.com"}]}
        assert ws.call("POST", "/users/track", body).status == 201

    counts = [_requests_of(s3, lambda k=k: track(k)) for k in range(39)]
    # no commit lists a table's whole log (delta-rs' expired log cleanup did, after every
    # commit: a page of 1,000 keys a request, so its cost grew with the table's history)
    last, _ = s3.during(lambda: track(39))
    counts.append(len(last))
    whole_logs = [path for _, path in last if "list-type=" in path and "_delta_log" in path and "start-after" not in path]
    assert whole_logs == [], whole_logs
    # appends of our own: a table's file and its log entry, 2 requests (delta-rs' write made 8)
    entries = [path for method, path in last if method == "PUT" and "/profiles/" in path]
    assert len(entries) == 2 and not [p for m, p in last if m != "PUT" and "/profiles/_delta_log" in p], last
    assert ws.store.merge_errors == []
    assert {name for name, _, _ in ws.store.merges} >= {"profiles", "attributes", "external_ids"}
    # (before: 117 requests for the 4th call, 1,471 for the 40th)
    assert min(counts[-8:]) <= min(counts[3:8]) + 5, counts
    for k in (0, 17, 39):
        assert export_one(ws, f"u{k}", ["external_id", "custom_attributes"]) == {
            "external_id": f"u{k}", "custom_attributes": {"n": k}}

    opened: list[Workspace] = []
    assert _requests_of(s3, lambda: opened.append(open_s3(uri))) <= 60  # (before: 508)
    assert export_one(opened[0], "u39", ["email"]) == {"email": "u39@example.com"}


@pytest.mark.slow  # two workspaces against moto: seconds
def test_an_append_after_another_writers_version_goes_through_delta_rs(s3: Callable[[], str]) -> None:
    """A writer appends on the version it wrote last with a conditional put; when another
    writer committed since, the put is refused, its file removed, and the append written on
    the table brought up to date: nothing lost, no file left behind."""
    uri = s3()
    first, second = open_s3(uri), open_s3(uri)
    for ws, user in ((first, "a"), (second, "b"), (first, "c"), (second, "d"), (first, "e")):
        assert ws.call("POST", "/users/track", {"attributes": [{"external_id": user, "n": 1}]}).status == 201
    assert sorted(u["external_id"] for u in open_s3(uri).export_users(["external_id"])) == ["a", "b", "c", "d", "e"]
    assert Workspace.check(uri).healthy
    for name in ("profiles", "attributes", "external_ids"):  # every data file is one some version names
        assert _unnamed_files(uri, name) == set(), name


def _unnamed_files(uri: str, name: str) -> set[str]:
    """The data files of table `name` that no log entry adds."""
    files = objects.files_under(f"{uri}/{name}")
    entries = [rel for rel in files if rel.startswith("_delta_log/") and rel.endswith(".json")]
    named = {action["add"]["path"] for rel in entries
             for line in (objects.read_whole(f"{uri}/{name}/{rel}") or b"").splitlines() if line.strip()
             if "add" in (action := orjson.loads(line))}
    return {rel for rel in files if "/" not in rel} - named


@pytest.mark.slow  # a store and a compaction against moto: seconds
def test_an_append_after_a_compaction_lands_after_its_checkpoint(s3: Callable[[], str]) -> None:
    """A compaction deletes the log entries before its checkpoint: an append on the version
    this process wrote before it would be taken there, behind the checkpoint, where no reader
    looks (and the version the ledger named would have no metadata). It goes after."""
    uri = s3()
    ws = open_s3(uri)
    assert ws.call("POST", "/users/track", {"attributes": [{"external_id": "a", "n": 1}]}).status == 201
    ws.compact()
    assert ws.call("POST", "/users/track", {"attributes": [{"external_id": "b", "n": 1}]}).status == 201
    assert sorted(u["external_id"] for u in open_s3(uri).export_users(["external_id"])) == ["a", "b"]
    assert Workspace.check(uri).healthy


@pytest.mark.slow  # two writers, a lease that lapses: seconds
def test_a_batch_whose_lease_ended_leaves_nothing_the_next_one_builds_on(
        s3: Callable[[], str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Writer A pauses past its lease before it writes its tables; B takes the lease, commits a
    batch that writes none of them, and gives the lease back clean. A's tables are written, its
    ledger row refused. A's next batch (after a clean lease, so no roll-back) must not append
    on the versions its failed batch wrote: their user would appear."""
    monkeypatch.setattr(lease, "LEASE_S", 1.0)
    uri = s3()
    a, b = open_s3(uri), open_s3(uri)
    assert a.call("POST", "/users/track", {"attributes": [{"external_id": "a", "n": 1}]}).status == 201
    real, armed = layout.failpoint, [True]

    def paused(name: str) -> None:
        if name == "before_tables" and armed[0]:
            armed[0] = False
            held = a.store._lease
            assert held is not None and held._renewer is not None
            held._stop.set()  # its renewals stop, and nothing notices
            held._renewer.join()
            time.sleep(1.3)  # its lease has ended
            assert b.call("POST", "/catalogs", {"catalogs": [{"name": "c", "fields": [
                {"name": "id", "type": "string"}]}]}).status == 201  # B writes no table of A's
        real(name)

    monkeypatch.setattr(layout, "failpoint", paused)
    with pytest.raises(StoreError):
        a.call("POST", "/users/track", {"attributes": [{"external_id": "stray", "n": 1}]})
    assert a.call("POST", "/users/track", {"attributes": [{"external_id": "a", "n": 2}]}).status == 201
    assert a.store._lease is not None and a.store._lease.clean_before  # no roll-back ran before it
    assert sorted(u["external_id"] for u in open_s3(uri).export_users(["external_id"])) == ["a"]


def _raising(error: BaseException) -> Callable[..., Any]:
    def raises(*args: Any, **kwargs: Any) -> Any:
        raise error
    return raises


@pytest.mark.slow  # a store, a failed commit and three repairs against moto: seconds each
def test_check_and_repair_work_on_s3_as_on_a_folder(s3: Callable[[], str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`check` lists a store on S3 and reads every log entry and footer; what a dead commit
    left (tables ahead of the ledger, a torn entry past it) `repair` undoes, and a missing data
    object is named and refused, changing nothing."""
    uri = s3()
    ws = open_s3(uri)
    assert ws.call("POST", "/users/track", {"attributes": [{"external_id": "a", "plan": "free"}]}).status == 201
    report = Workspace.check(uri)
    assert report.healthy and not report.repairable, report.problems
    assert report.uri == uri and report.head is not None and sum(report.checked.values()) > 0

    real = Ledger.append_rows

    def fail_batches(self: Ledger, batch_no: int, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("kind") == "batch":
            raise OSError("the ledger could not be written")
        return real(self, batch_no, *args, **kwargs)

    with monkeypatch.context() as patch:  # tables written, then the ledger row refused
        patch.setattr(Ledger, "append_rows", fail_batches)
        with pytest.raises(OSError):
            ws.call("POST", "/users/track", {"attributes": [{"external_id": "a", "plan": "lost"}]})
    ahead = Workspace.check(uri)
    assert ahead.healthy and set(ahead.rollback) >= {"attributes"}, ahead.rollback
    assert any("ahead of the ledger" in note for note in ahead.notes)
    with monkeypatch.context() as patch:  # the lease ended while the check read the store
        patch.setattr(Lease, "check", _raising(TurnEndedError("its lease could not be renewed")))
        with pytest.raises(TurnEndedError):
            Workspace.repair(uri)
    assert Workspace.check(uri).rollback == ahead.rollback  # nothing rolled back without the turn
    with monkeypatch.context() as patch:  # credentials that may read, not write: no lease to take
        patch.setattr(Lease, "acquire", _raising(OSError("AccessDenied")))
        unlocked = Workspace.check(uri)
        assert unlocked.rollback == ahead.rollback and any("without the writers' lease" in n for n in unlocked.notes)
        with pytest.raises(StoreReadOnly, match="AccessDenied"):
            Workspace.repair(uri)
    Workspace.repair(uri)
    after = Workspace.check(uri)
    assert after.healthy and not after.repairable
    assert export_one(open_s3(uri), "a", ["custom_attributes"]) == {"custom_attributes": {"plan": "free"}}

    named = objects.delta_table(f"{uri}/attributes").version()  # a torn entry past the ledger's version
    torn = f"{uri}/attributes/_delta_log/{named + 1:020d}.json"
    objects.write_whole(torn, b'{"commitInfo": {"timestamp": 1')
    found = Workspace.check(uri)  # it goes aside with the entries past the ledger's before it
    assert torn in found.aside and not found.unrepairable(), found.problems
    Workspace.repair(uri)
    assert not objects.exists(torn) and Workspace.check(uri).healthy
    assert [key for key in objects.files_under(f"{uri}/_repaired") if key.endswith(f"{named + 1:020d}.json")]
    assert export_one(open_s3(uri), "a", ["custom_attributes"]) == {"custom_attributes": {"plan": "free"}}

    gone = f"{uri}/profiles/{sorted(Workspace.check(uri).current['profiles'])[0]}"
    objects.remove(gone)
    damaged = Workspace.check(uri)
    assert [p.path for p in damaged.unrepairable()] == [gone] and "missing" in damaged.problems[0].what
    with pytest.raises(StoreDamaged, match="cannot fix safely"):
        Workspace.repair(uri)


@pytest.mark.slow  # several stores, commits and a compaction against moto: seconds each
def test_forget_check_on_s3_finds_a_deleted_user_until_compaction(s3: Callable[[], str]) -> None:
    """`forget_check` searches every object under the store's prefix: after a delete it finds
    the user's values (in at least every object whose raw bytes hold them), after a
    compaction nothing, and no object keeps an older version."""
    uri = s3()
    ws = open_s3(uri)
    ws.apply(copy.deepcopy(BATCH))
    ws.call("POST", "/users/track", {"attributes": [{"external_id": "gone-user", "email": "gone@example.org",
                                                     "nickname": "zebra-unicorn-17"}],
                                      "events": [{"external_id": "gone-user", "name": "secret-event",
                                                  "time": "2026-11-20T00:00:00Z"}]})
    assert ws.call("POST", "/users/delete", {"external_ids": ["gone-user"]}).body["deleted"] == 1
    secrets = ("gone@example.org", "zebra-unicorn-17", "secret-event")
    report = ws.forget_check(external_id="gone-user", values=secrets)
    assert report.found and report.root == uri and report.files == len(objects.files_under(uri))
    prefix = uri.removeprefix("s3://").split("/", 1)[1] + "/"
    for secret in ("gone-user", *secrets):
        raw = {key.removeprefix(prefix) for key in _objects_holding(uri, secret)}
        assert raw and raw <= {o.path for o in report.occurrences if o.value == secret}, secret
    ws.compact()
    after = ws.forget_check(external_id="gone-user", values=secrets)
    assert not after.found and after.retained == [], after.occurrences[:3]
    kept = ws.forget_check(external_id="u1")  # another user's values are still found
    assert kept.found and kept.profiles == 1


@pytest.mark.slow  # a store and a server against moto: seconds
def test_the_rest_server_over_a_store_on_s3_answers_as_a_call(s3: Callable[[], str], tmp_path: Path) -> None:
    """`engagelake serve` over an `s3://` store: keys kept in the store, group-committed
    tracks, exports and a merge answer over HTTP as `Workspace.call` does on a folder."""
    ws, local = open_s3(s3()), Workspace.open(tmp_path / "store", clock=clock, seed=SEED)
    key = ws.credentials.create_key("ingest", ["all"])
    calls = [("POST", "/users/track", {"attributes": [{"external_id": f"u{i}", "visits": {"inc": i}} for i in range(3)],
                                       "events": [{"external_id": "u1", "name": "open", "time": "2026-01-01T00:00:00Z"}]}),
             ("POST", "/users/merge", {"merge_updates": [{"identifier_to_merge": {"external_id": "u2"},
                                                          "identifier_to_keep": {"external_id": "u1"}}]}),
             ("POST", "/users/export/ids", EXPORT)]
    with served(ws) as client:
        assert send(client, "POST", "/users/track", {"attributes": []}).status_code == 401  # no key
        for method, path, body in calls:
            answered = send(client, method, path, body, bearer(key))
            expected = local.call(method, path, copy.deepcopy(body))
            assert (answered.status_code, answered.json()) == (expected.status, expected.body), path
    assert_same(open_s3(ws.store.uri).export_users(), local.export_users(), "every user")


@pytest.mark.slow  # a store of 35 calls and its checkpoints against moto: seconds
def test_checkpoints_written_on_s3_hold_what_the_log_holds(s3: S3) -> None:
    """engagelake writes a table's checkpoints on S3 from the one before and the entries since
    (delta-rs' loaded the table twice: about 65 requests a table). A reader of them sees what
    a reader of the log entries sees: the same version, files, statistics, schema and
    settings; files removed by the run merges are gone; a fresh process exports every user."""
    uri = s3()
    ws = open_s3(uri)
    ws.store.background_merges = False
    for k in range(35):
        body = {"attributes": [{"external_id": f"u{k}", "n": k, "email": f"u{k}@example.com"}]}
        assert ws.call("POST", "/users/track", body).status == 201
    assert ws.store.merge_errors == [] and {n for n, _, _ in ws.store.merges} >= {"profiles", "attributes"}
    from deltalake import DeltaTable

    for name in ("profiles", "attributes", "external_ids", "_index_profiles_email"):
        log = f"{uri}/{name}/_delta_log"
        names = sorted(objects.files_under(log))
        version = max(int(n.split(".")[0]) for n in names if n.endswith(".json"))
        ours = [n for n in names if n.endswith(".checkpoint.parquet")]
        assert len(ours) == version // 10, names
        for n in ours:  # written by engagelake (pyarrow), not by delta-rs (parquet-rs)
            footer = pq.ParquetFile(pa.BufferReader(objects.read_whole(f"{log}/{n}"))).metadata
            assert footer.created_by.startswith("parquet-cpp-arrow"), footer.created_by
        # the reference: the same entries, without checkpoints
        reference = f"{uri}-log-only/{name}/_delta_log"
        for n in names:
            if n.endswith(".json"):
                with objects.open_output(f"{reference}/{n}") as out:
                    out.write(objects.read_whole(f"{log}/{n}"))
        got, want = DeltaTable(f"{uri}/{name}"), DeltaTable(reference.removesuffix("/_delta_log"))
        assert got.version() == want.version() == version
        def adds(table: DeltaTable) -> list[dict]:
            return sorted(pa.table(table.get_add_actions(flatten=True)).to_pylist(), key=lambda a: a["path"])

        assert adds(got) == adds(want), name
        assert got.schema().to_json() == want.schema().to_json()
        assert got.metadata().configuration == want.metadata().configuration
        assert got.protocol() == want.protocol()
    fresh = open_s3(uri)
    # a fresh process reads the tables' files as the checkpoints and entries name them, as
    # delta-rs does (`checkpoints.files_at`), with the same statistics where the runs come from
    for name in ("profiles", "attributes", "external_ids", "_index_profiles_email"):
        version = fresh.store.head.versions[name]
        reader = DeltaTable(f"{uri}/{name}", version=version)
        assert set(fresh.store.files(name, version)) == set(reader.file_uris()), name
        assert fresh.store.versions.logs[name].version == version  # read by engagelake, not delta-rs
        assert fresh.store.runs(name, version) == merging.runs_of(
            pl.DataFrame(pa.table(reader.get_add_actions(flatten=True))), f"{uri}/{name}"), name
        assert fresh.store.stored_rows(name, version) == sum(
            pa.table(reader.get_add_actions(flatten=True)).column("num_records").to_pylist())
    assert sorted((u["external_id"], u["custom_attributes"]["n"]) for u in fresh.export_users(
        ["external_id", "custom_attributes"])) == sorted((f"u{k}", k) for k in range(35))
    assert Workspace.check(uri).healthy


@pytest.mark.slow  # a store of 6 calls and a merge against moto: seconds
def test_a_merge_after_a_dead_writers_version_was_rolled_back_merges_at_once(s3: Callable[[], str]) -> None:
    """A dead writer left a version of `profiles` no ledger row names, and its lease unreleased;
    the next merge pass rolls it back, and merges on the restored table at once (it kept the
    version it wrote last, which the restore had taken: its put failed, the merge with it)."""
    uri = s3()
    ws = open_s3(uri)
    store = ws.store
    store.background_merges, store.merge_trigger = False, 1000
    for k in range(6):
        assert ws.call("POST", "/users/track", {"attributes": [{"external_id": f"u{k}", "n": k}]}).status == 201
    stray = objects.delta_table(f"{uri}/profiles").version() + 1
    appends.commit(f"{uri}/profiles", stray, [], 0)  # the dead writer's version
    newest = max(objects.entries_after(f"{uri}/_writer_lease", None))
    dead = {"commitInfo": {"op": "renew", "holder": "dead", "until": "0", "clean": "0"}}
    assert objects.put_new(f"{uri}/_writer_lease/_delta_log/{newest + 1:020d}.json", orjson.dumps(dead) + b"\n")
    store.merge_trigger = 2
    assert store.merge_runs(["profiles"]) == ["profiles"]
    assert store.merge_errors == []
    assert sorted(u["external_id"] for u in open_s3(uri).export_users(["external_id"])) == [f"u{k}" for k in range(6)]
    assert Workspace.check(uri).healthy


@pytest.mark.slow  # 40 calls against moto: seconds
def test_a_reader_far_behind_reads_from_the_newest_checkpoint(s3: S3) -> None:
    """A long-lived reader (a notebook, a worker) that read a table once reads it again 40
    versions later from the newest checkpoint, not entry by entry from the version it knew,
    and finds what a fresh reader finds."""
    uri = s3()
    ws = open_s3(uri)
    ws.store.background_merges = False

    def calls(first: int, last: int) -> None:
        for k in range(first, last):
            assert ws.call("POST", "/users/track", {"attributes": [{"external_id": f"u{k}", "n": k}]}).status == 201

    calls(0, 3)
    reader = open_s3(uri).store
    reader.files("profiles", reader.head.versions["profiles"])
    calls(3, 43)
    reader.refresh()
    newest = reader.head.versions["profiles"]
    requests, _ = s3.during(lambda: reader.files("profiles", newest))
    assert len(requests) <= 12, requests  # (walking the entries: 41)
    assert set(reader.files("profiles", newest)) == set(open_s3(uri).store.files("profiles", newest))
