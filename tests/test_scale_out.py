"""Bulk export in parts: the same files whatever the parts, the task runner or the processes
(issue 13). The parts run as Prefect tasks, in threads by default and on a real Dask
`LocalCluster` of worker processes with a `DaskTaskRunner`."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from distributed import Client, LocalCluster
from polars.testing import assert_frame_equal
from prefect_dask import DaskTaskRunner
from tests.test_flows import workload

from engagelake import Workspace
from engagelake.demo import generate_workload
from engagelake.errors import StoreError
from engagelake.rules.messages import EXPORT_FIELDS
from flows.export_batch import ExportResult, export_all
from flows.track_batch import track_batch

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
    """A store of 60 users with merges, deletes and events (the flows' generated workload),
    and 3,000 more: its export ranges at 500 users are several."""
    folder = tmp_path_factory.mktemp("parts")
    track_batch(str(workload(folder / "requests")[0].parent), str(folder / "store"))
    Workspace.open(folder / "store").apply(many_users(3000))
    return folder / "store"


@pytest.mark.parametrize("parts", [2, 3, 50])
def test_an_export_in_parts_writes_the_files_of_one_part(store: Path, tmp_path: Path, parts: int) -> None:
    """500 users a range, the ranges cut into parts (more parts than ranges: one range each),
    exported side by side and joined: byte for byte the lines of one part, the same rows."""
    assert len(Workspace.open(store).export_ranges(500)[1]) >= 4
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
    assert len(ranges) >= 4
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
