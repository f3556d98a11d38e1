"""Bulk export in parts: the same files whatever the parts, the task runner or the processes
(issue 13). The parts run as Prefect tasks, in threads by default and on a real Dask
`LocalCluster` of worker processes with a `DaskTaskRunner`."""

from __future__ import annotations

import copy
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from distributed import Client, LocalCluster
from hypothesis import given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal
from prefect_dask import DaskTaskRunner
from tests.test_flows import workload
from tests.test_model_property import SEED, clock, engine_settings, request_sequences

from engagelake import Workspace
from engagelake.demo import generate_workload
from engagelake.errors import StoreError
from engagelake.files import read_responses_file
from engagelake.rules.messages import EXPORT_FIELDS
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
def cluster() -> Iterator[LocalCluster]:
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
def test_the_flows_run_unchanged_on_a_dask_cluster_over_s3(s3: Any, cluster: LocalCluster, tmp_path: Path) -> None:
    """`track_batch`, `compact_store`, `publish_current` and `export_batch` given a
    `DaskTaskRunner` and a store on moto's S3 answer and leave the store as with the default
    runner on another store (their tasks run in the flow: each batch is one process's)."""
    runner = DaskTaskRunner(address=cluster.scheduler_address)
    stores = {"default": s3(), "dask": s3()}
    fields = [f for f in EXPORT_FIELDS if f not in ("service_id", "created_at", "random_bucket")]  # the store's own
    applied = {}
    for name, uri in stores.items():
        folder = tmp_path / name
        workload(folder / "requests")
        run = (lambda flow: flow) if name == "default" else (lambda flow: flow.with_options(task_runner=runner))
        applied[name] = [(a.path.name, a.statuses, a.errors) for a in run(track_batch)(str(folder / "requests"), uri)]
        assert run(compact_store)(uri)["profiles"] > 0
        assert run(publish_current)(uri)["profiles"] > 0
        (folder / "ids.txt").write_text("user-000001\nuser-000002\nnobody\n")
        result = run(export_batch)(str(folder / "ids.txt"), str(folder / "export"), uri, fields=fields)
        assert result.users == 2 and result.invalid_user_ids == ["nobody"]
    assert applied["dask"] == applied["default"]
    for response in sorted((tmp_path / "dask" / "requests").glob("*.responses.ndjson")):
        assert read_responses_file(response) == read_responses_file(tmp_path / "default" / "requests" / response.name)
    assert Workspace.open(stores["dask"]).export_users(fields) == Workspace.open(stores["default"]).export_users(fields)
    assert (tmp_path / "dask" / "export" / "users.ndjson").read_bytes() == \
        (tmp_path / "default" / "export" / "users.ndjson").read_bytes()
