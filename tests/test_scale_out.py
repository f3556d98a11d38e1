"""Bulk export, compaction and track passes in parts: the same files, tables and responses
whatever the parts, the task runner or the processes (issue 13). The parts run as Prefect
tasks, in threads by default and on a real Dask `LocalCluster` of worker processes with a
`DaskTaskRunner`."""

from __future__ import annotations

import copy
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

import polars as pl
import pytest
from distributed import Client, LocalCluster
from hypothesis import given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal
from prefect_dask import DaskTaskRunner
from tests.test_flows import workload
from tests.test_model_property import SEED, clock, engine_settings, request_sequences

from engagelake import Workspace, workspace
from engagelake import batch as batch_module
from engagelake.demo import generate_workload, write_request_files
from engagelake.errors import StoreError
from engagelake.files import read_responses_file
from engagelake.rules.messages import EXPORT_FIELDS
from engagelake.store import delta, layout
from engagelake.tables.schema import INDEXES, TABLES
from flows import export_batch as export_batch_flows
from flows import track_batch as track_batch_flows
from flows.export_batch import ExportResult, export_all, export_batch
from flows.track_batch import compact_store, publish_current, track_batch

pytest_plugins = ["tests.prefect_harness", "tests.s3_server"]
pytestmark = pytest.mark.usefixtures("prefect_harness")

NOW = datetime(2026, 11, 22, tzinfo=UTC)


def files_of(result: ExportResult) -> tuple[bytes, pl.DataFrame]:
    return result.ndjson_path.read_bytes(), pl.read_parquet(result.parquet_path)


def assert_same_export(got: ExportResult, want: ExportResult) -> None:
    assert got.users == want.users
    got_lines, got_rows = files_of(got)
    want_lines, want_rows = files_of(want)
    assert got_lines == want_lines
    assert_frame_equal(got_rows, want_rows)
    assert pl.read_parquet(got.parquet_path, n_rows=0).schema == pl.read_parquet(want.parquet_path, n_rows=0).schema


def many_users(count: int) -> list[dict[str, Any]]:
    """Track requests of `count` new users (75 a request), so that the profiles' run holds
    several row groups: an export's ranges are cut at row-group starts."""
    users = [{"external_id": f"bulk-{n:05d}", "plan": ["free", "pro"][n % 2], "visits": n} for n in range(count)]
    return [{"method": "POST", "path": "/users/track", "body": {"attributes": users[i : i + 75]}}
            for i in range(0, count, 75)]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, prefect_harness: None) -> Path:
    """A store of 60 users with events and purchases (the flows' generated workload), three
    merges and two deletes, and 3,000 more users: its export ranges at 500 users are several."""
    folder = tmp_path_factory.mktemp("parts")
    ws = Workspace.open(folder / "store", clock=lambda: NOW)
    ws.apply([*generate_workload(60, 900, seed=3, now=NOW), *many_users(3000),
              {"method": "POST", "path": "/users/merge", "body": {"merge_updates": [
                  {"identifier_to_merge": {"external_id": f"user-{n:06d}"},
                   "identifier_to_keep": {"external_id": f"user-{n + 1:06d}"}} for n in (0, 10, 20)]}},
              {"method": "POST", "path": "/users/delete", "body": {"external_ids": ["user-000030", "bulk-00007"]}}])
    return folder / "store"


@pytest.mark.parametrize("parts", [pytest.param(2, marks=pytest.mark.slow), 3, pytest.param(50, marks=pytest.mark.slow)])
def test_an_export_in_parts_writes_the_files_of_one_part(store: Path, tmp_path: Path, parts: int) -> None:
    """500 users a range, the ranges cut into parts (more parts than ranges: one range each),
    exported side by side and joined: byte for byte the lines of one part, the same rows."""
    assert len(Workspace.open(store).export_ranges(500)[1]) >= 3  # a range per row group of 1,024 profiles
    one = export_all(str(tmp_path / "one"), str(store), users_per_chunk=500)
    assert one.users == Workspace.open(store).table("profiles").collect().height
    assert_same_export(export_all(str(tmp_path / "parts"), str(store), users_per_chunk=500, parts=parts), one)
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == ["users.ndjson", "users.parquet"]  # parts gone


@pytest.mark.slow  # a crash test: a part that fails and its retry through Prefect, 3 s
def test_an_export_part_that_fails_is_retried_and_the_files_are_those_of_one_part(
        store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every part's first attempt fails with a transient I/O error after writing its files;
    Prefect runs it again, and the joined files are those of one part."""
    one = export_all(str(tmp_path / "one"), str(store), users_per_chunk=500)
    original = export_batch_flows.write_user_chunks
    failed: set[str] = set()

    def flaky(chunks: Any, out_dir: str, fields: list[str]) -> Any:
        written = original(chunks, out_dir, fields)
        if out_dir not in failed:
            failed.add(out_dir)
            raise ConnectionResetError("the connection dropped")
        return written

    monkeypatch.setattr(export_batch_flows, "write_user_chunks", flaky)
    many = export_all(str(tmp_path / "parts"), str(store), users_per_chunk=500, parts=3)
    assert len(failed) == 3
    assert_same_export(many, one)


def test_parts_read_the_batch_the_plan_read(store: Path, tmp_path: Path) -> None:
    """A batch committed after the plan is in no part: every part reads the planned batch."""
    copied = tmp_path / "store"
    shutil.copytree(store, copied)
    ws = Workspace.open(copied, clock=lambda: NOW)
    batch, ranges = ws.export_ranges(users_per_chunk=500)
    assert len(ranges) >= 3
    before = [u for chunk in ws.iter_users(["external_id"], at_batch=batch, key_ranges=ranges) for u in chunk]
    ws.call("POST", "/users/track", {"attributes": [{"external_id": "late-user", "plan": "gold"}]})
    ws.call("POST", "/users/delete", {"external_ids": [before[0]["external_id"]]})
    halves = (ranges[: len(ranges) // 2], ranges[len(ranges) // 2:])
    again = [u for half in halves for chunk in Workspace.open(copied).iter_users(
        ["external_id"], at_batch=batch, key_ranges=half) for u in chunk]
    assert again == before
    now = [u["external_id"] for chunk in ws.iter_users(["external_id"]) for u in chunk]
    assert "late-user" in now and before[0]["external_id"] not in now
    with pytest.raises(StoreError, match="no batch"):
        list(ws.iter_users(["external_id"], at_batch=10_000))


def test_a_kept_store_serves_a_threads_parts_until_the_store_is_made_again(tmp_path: Path) -> None:
    """`open_kept`: one open store per location and thread, reused (the parts a worker runs);
    a plan's seed that differs (the store was made again there) opens it anew."""
    path = tmp_path / "store"
    first = Workspace.open(path, seed="first")
    first.call("POST", "/users/track", {"attributes": [{"external_id": "old", "plan": "a"}]})
    kept = Workspace.open_kept(path, seed="first")
    assert Workspace.open_kept(path).store is kept.store  # kept
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(lambda: Workspace.open_kept(path).store).result() is not kept.store  # per thread
    shutil.rmtree(path)
    Workspace.open(path, seed="second").call("POST", "/users/track", {"attributes": [{"external_id": "new"}]})
    again = Workspace.open_kept(path, seed="second")
    assert again.store is not kept.store
    assert [u["external_id"] for chunk in again.iter_users(["external_id"]) for u in chunk] == ["new"]
    for n in range(workspace.KEPT_STORES + 2):  # bounded: the oldest go
        Workspace.open(tmp_path / f"s{n}")
        Workspace.open_kept(tmp_path / f"s{n}")
    assert len(workspace._KEPT) <= workspace.KEPT_STORES


@pytest.mark.slow
def test_an_export_on_a_dask_cluster_over_s3_equals_one_process(s3: Any, tmp_path: Path) -> None:
    """The flow unchanged in code, given a `DaskTaskRunner` of two worker processes and a store
    on moto's S3: its parts run in the workers (which reach S3 through the environment they
    inherit), and the files are those of one process."""
    uri = s3()
    ws = Workspace.open(uri, clock=lambda: NOW, seed="scale-out")
    ws.apply(list(generate_workload(40, 400, seed=5, now=NOW)))
    ws.apply(many_users(2500))
    assert len(ws.export_ranges(500)[1]) >= 4
    one = export_all(str(tmp_path / "one"), uri, users_per_chunk=500)
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1) as cluster, Client(cluster) as client:
        runner = DaskTaskRunner(address=cluster.scheduler_address)
        on_dask = export_all.with_options(task_runner=runner)(str(tmp_path / "dask"), uri, users_per_chunk=500,
                                                              parts=4)
        # the parts ran in the two worker processes (not in this one)
        ran = client.run(lambda dask_worker: dask_worker.state.transition_counter)
    assert len(ran) == 2 and all(count > 0 for count in ran.values()), ran
    assert one.users == ws.table("profiles").collect().height > 2500
    assert_same_export(on_dask, one)
    exported = {u.get("external_id") for u in ws.export_users(list(EXPORT_FIELDS))}
    assert set(pl.read_parquet(on_dask.parquet_path)["external_id"].to_list()) == exported


@pytest.fixture(scope="module")
def cluster(s3: Any) -> Iterator[LocalCluster]:
    """Two worker processes, started once the S3 server's environment is set (they inherit it)."""
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1) as local:
        yield local


@pytest.mark.slow
@engine_settings(6)
@given(reqs=request_sequences, parts=st.integers(2, 6), per_chunk=st.sampled_from([300, 500, 800]))
def test_random_stores_export_on_a_dask_cluster_as_in_one_process(
        tmp_path_factory: pytest.TempPathFactory, cluster: LocalCluster, reqs: list[dict[str, Any]], parts: int,
        per_chunk: int) -> None:
    """Random sequences of track, merge, identify, rename, alias and delete requests (the model
    test's) over 1,600 users: the export in parts on two worker processes equals one part in
    the flow's process."""
    folder = tmp_path_factory.mktemp("random")
    ws = Workspace.open(folder / "store", clock=clock, seed=SEED)
    ws.apply(many_users(1600))
    ws.apply(copy.deepcopy(reqs))
    assert len(ws.export_ranges(per_chunk)[1]) >= 2  # parts of their own
    one = export_all(str(folder / "one"), str(folder / "store"), users_per_chunk=per_chunk)
    runner = DaskTaskRunner(address=cluster.scheduler_address)
    many = export_all.with_options(task_runner=runner)(str(folder / "parts"), str(folder / "store"),
                                                       users_per_chunk=per_chunk, parts=parts)
    assert_same_export(many, one)


@pytest.mark.slow
def test_the_flows_run_unchanged_on_a_dask_cluster_over_s3(s3: Any, cluster: LocalCluster, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`track_batch`, `compact_store`, `publish_current` and `export_batch` given a
    `DaskTaskRunner` and a store on moto's S3 answer and leave the store as with the default
    runner on another store. `track_batch(parts=2)` reads its passes' requests in the workers;
    the rest of each batch runs in the flow's process."""
    runner = DaskTaskRunner(address=cluster.scheduler_address)
    monkeypatch.setattr(track_batch_flows, "MIN_SHARE_BYTES", 1)
    with Client(cluster) as client:
        before = client.run(lambda dask_worker: dask_worker.state.transition_counter)
    stores = {"default": s3(), "dask": s3()}
    fields = [f for f in EXPORT_FIELDS if f not in ("service_id", "created_at", "random_bucket")]  # the store's own
    applied = {}
    for name, uri in stores.items():
        folder = tmp_path / name
        workload(folder / "requests")
        run = (lambda flow: flow) if name == "default" else (lambda flow: flow.with_options(task_runner=runner))
        seen: list[str] = []
        lock = threading.Lock()

        def progress(applied: Any, lock: Any = lock, seen: list[str] = seen) -> None:
            with lock:  # as the CLI's progress bars: a callback that cannot travel to a worker
                seen.append(applied.path.name)

        applied[name] = [(a.path.name, a.statuses, a.errors) for a in run(track_batch)(
            str(folder / "requests"), uri, on_file_applied=progress, parts=1 if name == "default" else 2)]
        assert seen == [name for name, _, _ in applied[name]]
        if name == "dask":
            with Client(cluster) as client:
                after = client.run(lambda dask_worker: dask_worker.state.transition_counter)
            assert all(after[w] > before[w] for w in after), (before, after)  # both workers read shares
        assert run(compact_store)(uri)["profiles"] > 0
        assert run(publish_current)(uri)["profiles"] > 0
        (folder / "ids.txt").write_text("user-000001\nuser-000002\nnobody\n")
        result = run(export_batch)(str(folder / "ids.txt"), str(folder / "export"), uri, fields=fields)
        assert result.users == 2 and result.invalid_user_ids == ["nobody"]
    assert applied["dask"] == applied["default"]
    _same_responses(tmp_path / "dask" / "requests", tmp_path / "default" / "requests")
    assert Workspace.open(stores["dask"]).export_users(fields) == Workspace.open(stores["default"]).export_users(fields)
    assert (tmp_path / "dask" / "export" / "users.ndjson").read_bytes() == \
        (tmp_path / "default" / "export" / "users.ndjson").read_bytes()


# --- compaction in parts ----------------------------------------------------------------------


def compact_in_parts(folder: Path | str, parts: int) -> tuple[int, dict[str, int]]:
    """Compact the store at `folder` with each big table cut into about `parts` ranges, the
    parts written one by one in this process; returns the parts and the rows kept."""
    ws = Workspace.open(folder, clock=lambda: NOW)
    with ws.compaction(parts, min_part_rows=1) as job:
        kept = job.finish([ws.compact_part(job.plan, part) for part in job.plan.parts])
    return len(job.plan.parts), kept


def current_rows(folder: Path | str) -> dict[str, pl.DataFrame]:
    ws = Workspace.open(folder)
    return {name: ws.table(name).collect() for name in TABLES}


def assert_same_store(got: Path | str, want: Path | str, *, apart: bool = False) -> None:
    """The same current rows in every table, in the same order, and the same exports. `apart`:
    the stores took the same requests apart, so their lineage names other batch IDs (and the
    rows of one batch may come in another order)."""
    rows, expected = current_rows(got), current_rows(want)
    for store, at in ((rows, got), (expected, want)):
        snapshot = Workspace.open(at).store.snapshot()
        store.update({index: snapshot.scan(index).collect() for index in INDEXES})
    if apart:
        for store in (rows, expected):
            store["merges"] = store["merges"].drop("batch").sort("seq")
    for name in (*TABLES, *INDEXES):
        assert rows[name].equals(expected[name]), name
    fields = list(EXPORT_FIELDS)
    assert Workspace.open(got).export_users(fields) == Workspace.open(want).export_users(fields)


@pytest.mark.parametrize("parts", [2, pytest.param(7, marks=pytest.mark.slow)])
def test_a_compaction_in_parts_equals_one_in_one_piece(store: Path, tmp_path: Path, parts: int) -> None:
    """The store's big tables cut into ranges (events of merged users moved to the survivors,
    deleted users' rows dropped, in each range), written part by part and committed together:
    the same current rows, in the same order, as a compaction in one piece; the files of each
    table are the parts' own, sorted across them."""
    one, many = tmp_path / "one", tmp_path / "many"
    shutil.copytree(store, one)
    shutil.copytree(store, many)
    kept = Workspace.open(one, clock=lambda: NOW).compact()
    count, kept_in_parts = compact_in_parts(many, parts)
    assert kept_in_parts == kept and count >= 2 * 2  # profiles and attributes in parts at least
    assert_same_store(many, one)
    ws = Workspace.open(many)
    for name in ("profiles", "attributes", "events"):
        files = ws.store.files(name, ws.store.head.versions[name])
        assert len(files) >= (2 if name != "events" else 1), name  # (60 users' events: one row group)
        keys = pl.concat([pl.read_parquet(f, columns=["service_id"]) for f in files])["service_id"]
        assert keys.is_sorted(), name
    # and the store goes on: a batch after it, and a compaction in one piece
    assert ws.call("POST", "/users/track", {"attributes": [{"external_id": "after", "plan": "gold"}]}).status == 201
    exported = ws.call("POST", "/users/export/ids", {"external_ids": ["after"], "fields_to_export": ["custom_attributes"]})
    assert exported.body["users"] == [{"custom_attributes": {"plan": "gold"}}]


@pytest.mark.slow  # a crash test: a part that fails and its retry through Prefect, 5 s
def test_a_part_that_fails_is_retried_and_the_compaction_completes_once(store: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`compact_store(parts=2)`: the first attempt of every part fails with a transient I/O
    error after writing a file; Prefect runs each again, and the store ends as a compaction in
    one piece leaves it, with no file of the failed attempts left."""
    one, many = tmp_path / "one", tmp_path / "many"
    shutil.copytree(store, one)
    shutil.copytree(store, many)
    kept_in_one_piece = Workspace.open(one, clock=lambda: NOW).compact()
    original = delta.DeltaStore.compact_part
    failed: list[Any] = []

    def flaky(self: delta.DeltaStore, plan: Any, part: Any) -> Any:
        written = original(self, plan, part)
        if part not in failed:
            failed.append(part)
            for add in written.adds:  # as a part that died after writing: its files stay behind
                assert (Path(self.uri) / part.table / add["path"]).exists()
            raise ConnectionResetError("the connection dropped")
        return written

    monkeypatch.setattr(delta.DeltaStore, "compact_part", flaky)
    kept = compact_store(str(many), parts=2, min_part_rows=1)
    assert len(failed) >= 4 and kept == kept_in_one_piece  # every part failed once, then ran
    assert_same_store(many, one)
    after = Workspace.open(many).store
    for name in TABLES:  # the failed attempts' files went with the compaction's vacuum
        named = {Path(f).name for f in after.files(name, after.head.versions.get(name))}
        assert {f.name for f in (many / name).glob("*.parquet")} <= named, name


@pytest.mark.slow  # a crash test: a compaction that stops before its finish, 2 s
def test_a_compaction_left_unfinished_changes_nothing(store: Path, tmp_path: Path) -> None:
    """Parts written, then the block left by an error before `finish`: no table moved, no
    marker left, and the parts' files (named by no version) go at the next compaction."""
    copied = tmp_path / "store"
    shutil.copytree(store, copied)
    ws = Workspace.open(copied, clock=lambda: NOW)
    before = ws.store.head
    rows = current_rows(copied)
    with pytest.raises(RuntimeError, match="a part failed"), ws.compaction(3, min_part_rows=1) as job:
        written = ws.compact_part(job.plan, job.plan.parts[0])
        raise RuntimeError("a part failed")
    orphan = copied / job.plan.parts[0].table / written.adds[0]["path"]
    assert orphan.exists()
    again = Workspace.open(copied, clock=lambda: NOW)
    assert again.store.head.versions == before.versions and again.store.head.batch_no == before.batch_no
    assert not (copied / "_compacting").exists()
    assert all(current_rows(copied)[name].equals(rows[name]) for name in TABLES)
    with again.compaction(3, min_part_rows=1) as job, pytest.raises(StoreError, match="each of its"):
        job.finish([])  # every part must be in
    with again.compaction(3) as job:
        # no table of 3,060 users holds two parts' worth (`MIN_PART_ROWS`): a part each, whole
        assert job.plan.parts and all((p.low, p.high) == (None, None) for p in job.plan.parts)
    again.compact()
    assert not orphan.exists()
    assert_same_store(copied, copied)


@pytest.mark.slow  # a crash test: a finish that fails midway, and the roll forward (1 s)
def test_a_compaction_whose_finish_failed_midway_rolls_forward(store: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`finish` fails after some tables are committed, and the caller goes on: leaving the
    block raises (the writer lock is not given back as clean), and the next writer rolls the
    compaction forward: the same current rows as before it."""
    copied = tmp_path / "store"
    shutil.copytree(store, copied)
    rows = current_rows(copied)
    ws = Workspace.open(copied, clock=lambda: NOW)

    def fails(name: str) -> None:
        if name == "compact:attributes":
            raise OSError("disk full")

    with pytest.raises(StoreError, match="stopped midway"), ws.compaction(2, min_part_rows=1) as job:
        written = [ws.compact_part(job.plan, part) for part in job.plan.parts]
        with monkeypatch.context() as patched:
            patched.setattr(layout, "failpoint", fails)
            with pytest.raises(OSError, match="disk full"):
                job.finish(written)
    assert (copied / "_compacting").exists()
    again = Workspace.open(copied, clock=lambda: NOW)
    assert again.call("POST", "/users/track", {"attributes": [{"external_id": "next", "plan": "pro"}]}).status == 201
    assert not (copied / "_compacting").exists()
    after = current_rows(copied)
    for name in TABLES:
        if name not in ("profiles", "external_ids", "attributes"):  # the batch just applied wrote those
            assert after[name].equals(rows[name]), name
    assert after["attributes"].filter(pl.col("service_id").is_in(rows["attributes"]["service_id"].implode())) \
        .sort("service_id", "name").equals(rows["attributes"].sort("service_id", "name"))


@pytest.mark.slow
def test_compact_store_in_parts_on_a_dask_cluster_over_s3(s3: Any, tmp_path: Path) -> None:
    """`compact_store(parts=3)` given a `DaskTaskRunner` of two worker processes, over moto's
    S3: the parts run in the workers and the store ends as a compaction in one piece leaves
    another store of the same batches. (A cluster of its own: its workers must start with the
    S3 server's environment, which the module's cluster may have started before.)"""
    stores = {"one": s3(), "parts": s3()}
    for uri in stores.values():
        ws = Workspace.open(uri, clock=lambda: NOW, seed="compaction")
        ws.apply(list(generate_workload(40, 400, seed=5, now=NOW)))
        ws.apply(many_users(2500))
        ws.apply([{"method": "POST", "path": "/users/merge", "body": {"merge_updates": [
            {"identifier_to_merge": {"external_id": "user-000003"}, "identifier_to_keep": {"external_id": "bulk-00001"}}]}},
            {"method": "POST", "path": "/users/delete", "body": {"external_ids": ["user-000004"]}}])
    assert compact_store(stores["one"])["profiles"] > 2500
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1) as cluster, Client(cluster) as client:
        before = client.run(lambda dask_worker: dask_worker.state.transition_counter)
        runner = DaskTaskRunner(address=cluster.scheduler_address)
        kept = compact_store.with_options(task_runner=runner)(stores["parts"], parts=3, min_part_rows=1)
        after = client.run(lambda dask_worker: dask_worker.state.transition_counter)
    assert all(after[w] > before[w] for w in after), (before, after)  # both workers wrote parts
    assert kept["profiles"] > 2500
    assert_same_store(stores["parts"], stores["one"], apart=True)


@pytest.mark.slow
@engine_settings(6)
@given(reqs=request_sequences, parts=st.integers(2, 6))
def test_random_stores_compact_in_parts_as_in_one_piece(
        tmp_path_factory: pytest.TempPathFactory, reqs: list[dict[str, Any]], parts: int) -> None:
    """Random sequences of track, merge, identify, rename, alias and delete requests (the model
    test's) over 1,600 users: a compaction in parts leaves what one in one piece leaves."""
    folder = tmp_path_factory.mktemp("random-compaction")
    ws = Workspace.open(folder / "one", clock=clock, seed=SEED)
    ws.apply(many_users(1600))
    ws.apply(copy.deepcopy(reqs))
    shutil.copytree(folder / "one", folder / "many")
    ws.compact()
    compact_in_parts(folder / "many", parts)
    assert_same_store(folder / "many", folder / "one")


# --- track passes read in shares --------------------------------------------------------------


def _files_with_refusals(folder: Path) -> list[Path]:
    """The flows' generated workload with requests refused whole (too many objects, not an
    object, a wrong type) and objects refused alone among them, in files of 40 requests."""
    reqs = list(generate_workload(60, 900, seed=3, now=NOW))
    refused = [
        {"method": "POST", "path": "/users/track",
         "body": {"attributes": [{"external_id": f"x{i}", "plan": "free"} for i in range(76)]}},
        {"method": "POST", "path": "/users/track", "body": [1, 2]},
        {"method": "POST", "path": "/users/track", "body": {"attributes": 3}},
        {"method": "POST", "path": "/users/track",
         "body": {"events": [1, {"name": "x"}, {"external_id": "user-000001", "name": "ok", "time": "2026-11-01T00:00:00Z"}]}},
    ]
    for n, request in enumerate(refused):
        reqs.insert(7 + 23 * n, request)
    return write_request_files(reqs, folder, 40)


def _track_in_shares(flow: Any, folder: Path, store: Path | str, parts: int) -> list[tuple[str, Any, Any]]:
    """Run `flow` over `folder` with shares of any size and passes of 3 requests."""
    with mock.patch.object(track_batch_flows, "MIN_SHARE_BYTES", 1), mock.patch.object(workspace, "_now", lambda: NOW), \
            mock.patch.object(batch_module, "TRACK_RUN_MAX", 3):
        return [(a.path.name, a.statuses, a.errors) for a in flow(str(folder), str(store), parts=parts)]


def _same_responses(got: Path, want: Path) -> None:
    files = sorted(p.name for p in want.glob("*.responses.ndjson"))
    assert files and files == sorted(p.name for p in got.glob("*.responses.ndjson"))
    for name in files:
        assert read_responses_file(got / name) == read_responses_file(want / name), name


@pytest.mark.slow  # an equivalence: the flow run twice, 4 s (tests/test_rules_units.py reads in shares by default)
def test_a_track_batch_read_in_shares_equals_one_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`track_batch(parts=3)`: each pass's requests parsed and checked in three shares, as tasks
    (threads of the flow's process here), then joined; a share's first read fails and it is
    read again. The responses and the store are those of `parts=1`."""
    for name in ("one", "shares"):
        _files_with_refusals(tmp_path / name / "requests")
        Workspace.open(tmp_path / name / "store", clock=lambda: NOW, seed="shares")
    one = _track_in_shares(track_batch, tmp_path / "one" / "requests", tmp_path / "one" / "store", 1)
    real = track_batch_flows.read_track
    shares: list[tuple[int, str]] = []  # (its first request in the pass, that request's text)
    failed: list[tuple[int, str]] = []

    def flaky(texts: Any, max_updates: int | None, *, first_req: int = 0) -> Any:
        shares.append((first_req, texts[0]))
        if first_req > 0 and not failed:
            failed.append(shares[-1])
            raise ConnectionResetError("the worker went away")
        return real(texts, max_updates, first_req=first_req)

    monkeypatch.setattr(track_batch_flows, "read_track", flaky)
    many = _track_in_shares(track_batch, tmp_path / "shares" / "requests", tmp_path / "shares" / "store", 3)
    assert many == one
    assert len([s for s in shares if s[0] > 0]) >= 2 * len(one)  # every file's passes in shares
    assert shares.count(failed[0]) == 2  # the share that failed was read again
    _same_responses(tmp_path / "shares" / "requests", tmp_path / "one" / "requests")
    assert_same_store(tmp_path / "shares" / "store", tmp_path / "one" / "store")


@pytest.mark.slow
@engine_settings(6)
@given(reqs=request_sequences, parts=st.integers(2, 4))
def test_random_track_batches_read_in_shares_on_a_dask_cluster_as_in_one_process(
        tmp_path_factory: pytest.TempPathFactory, cluster: LocalCluster, reqs: list[dict[str, Any]], parts: int) -> None:
    """Random sequences of track, merge, identify, rename, alias and delete requests (the model
    test's), as one request file: `track_batch(parts=...)` with the passes' requests read in
    shares on two Dask worker processes answers and leaves the store as `parts=1` in the flow's
    process."""
    folder = tmp_path_factory.mktemp("random-shares")
    runner = DaskTaskRunner(address=cluster.scheduler_address)
    for name in ("one", "shares"):
        write_request_files(copy.deepcopy(reqs), folder / name / "requests", len(reqs))
        Workspace.open(folder / name / "store", clock=clock, seed=SEED).apply(many_users(150))
    one = _track_in_shares(track_batch, folder / "one" / "requests", folder / "one" / "store", 1)
    many = _track_in_shares(track_batch.with_options(task_runner=runner), folder / "shares" / "requests",
                            folder / "shares" / "store", parts)
    assert many == one
    _same_responses(folder / "shares" / "requests", folder / "one" / "requests")
    assert_same_store(folder / "shares" / "store", folder / "one" / "store")
