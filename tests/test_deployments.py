"""The deployments of `flows/serve.py`: names, schedules, parameters and entrypoints as built and
as the Prefect API stores them, and one run of each through the API (a flow run of the
deployment, its flow loaded from the deployment's entrypoint, run with the run's parameters as
a served run is) against a real store."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from tests.test_flows import TRACK, artifacts_of, workload, write_ndjson

from engagelake import Workspace
from flows.serve import build_deployments, main, parse_args

pytest_plugins = ["tests.prefect_harness"]

EXPECTED = {  # full name: (entrypoint, cron, parameters by the names of build_deployments' arguments)
    "track_batch/nightly-track": ("flows.track_batch.track_batch", "0 2 * * *", {"folder": "landing", "store": "store"}),
    "compact_store/daily-compaction": ("flows.track_batch.compact_store", "0 4 * * *", {"store": "store"}),
    "cleanup_push_token_profiles/monthly-cleanup": (
        "flows.cleanup_push_tokens.cleanup_push_token_profiles", "0 3 1 * *", {"store": "store"}),
    "export_batch/on-demand": (
        "flows.export_batch.export_batch", None, {"store": "store", "out_dir": "exports/export_batch"}),
    "export_all/on-demand": ("flows.export_batch.export_all", None, {"store": "store", "out_dir": "exports/export_all"}),
}


def expected(root: Path) -> dict[str, tuple[str, str | None, dict[str, str]]]:
    return {name: (entrypoint, cron, {k: str(root / v) for k, v in parameters.items()})
            for name, (entrypoint, cron, parameters) in EXPECTED.items()}


def test_the_deployments_are_named_scheduled_and_parametrized(tmp_path: Path) -> None:
    deployments = build_deployments(str(tmp_path / "store"), str(tmp_path / "landing"), str(tmp_path / "exports"),
                                    timezone="Europe/Berlin")

    built = {f"{d.flow_name}/{d.name}": (d.entrypoint, [s.schedule.cron for s in d.schedules] or [None],  # type: ignore[union-attr]
                                         d.parameters) for d in deployments}
    assert built == {name: (entrypoint, [cron], parameters) for name, (entrypoint, cron, parameters)
                     in expected(tmp_path).items()}
    assert {s.schedule.timezone for d in deployments for s in d.schedules} == {"Europe/Berlin"}  # type: ignore[union-attr]
    assert all(d.tags == ["engagelake"] and d.description for d in deployments)


def test_each_entrypoint_loads_its_flow_which_does_not_retry_itself(tmp_path: Path) -> None:
    from prefect.flows import load_flow_from_entrypoint

    for d in build_deployments(str(tmp_path / "store"), str(tmp_path / "landing")):
        flow = load_flow_from_entrypoint(d.entrypoint, use_placeholder_flow=False)  # type: ignore[arg-type]
        assert flow.name == d.flow_name
        assert flow.retries == 0  # the flows' tasks retry, on transient I/O errors only
        assert set(d.parameters) <= set(flow.parameters.properties)


def test_flags_and_environment_choose_the_locations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ENGAGELAKE_STORE", "s3://bucket/store")
    monkeypatch.setenv("ENGAGELAKE_LANDING", "incoming")
    monkeypatch.setenv("ENGAGELAKE_EXPORTS", "out")
    args = parse_args(["--landing", "elsewhere", "--timezone", "Europe/Paris"])  # flags win
    assert (args.store, args.landing, args.exports, args.timezone) == (
        "s3://bucket/store", "elsewhere", "out", "Europe/Paris")
    monkeypatch.chdir(tmp_path)

    main(["--list", "--track-cron", "30 1 * * *"])  # lists, serves nothing

    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"track_batch/nightly-track  [30 1 * * * UTC]  flows.track_batch.track_batch  "
                        f"folder={tmp_path / 'incoming'} store=s3://bucket/store")
    assert [line.split()[0] for line in lines] == list(EXPECTED)
    assert "[on demand]" in lines[3] and f"out_dir={tmp_path / 'out' / 'export_batch'}" in lines[3]


def test_help_names_the_flags_and_the_server_setting() -> None:
    done = subprocess.run([sys.executable, "flows/serve.py", "--help"], capture_output=True, text=True,
                          check=True, timeout=60)
    for text in ("--store", "ENGAGELAKE_STORE", "--landing", "ENGAGELAKE_LANDING", "PREFECT_API_URL",
                 "track_batch/nightly-track", "prefect deployment run"):
        assert text in done.stdout


def run_deployment_once(full_name: str, parameters: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """Create a flow run of the deployment through the API and run it in this process as a served
    run is: the flow from the deployment's entrypoint, the parameters the server merged.
    Returns the flow run's final state (read back from the API) and the flow's result."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.flow_engine import load_flow_and_flow_run, run_flow

    created = run_deployment(full_name, parameters=parameters or {}, timeout=0)  # scheduled, not waited for
    flow_run, flow = load_flow_and_flow_run(created.id)  # type: ignore[union-attr]
    result = run_flow(flow, flow_run=flow_run)
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run.id).state
    return state, result


@pytest.mark.slow  # serves and runs every deployment through the Prefect server: about 7 s
@pytest.mark.usefixtures("prefect_harness")
def test_each_deployment_registers_and_runs_once_against_a_real_store(tmp_path: Path) -> None:
    from docket import Perpetual
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.server.services.scheduler import schedule_deployments

    landing, store, exports = tmp_path / "landing", tmp_path / "store", tmp_path / "exports"
    files = workload(landing, users=20, objects=200, per_file=4)
    tokens = [{"app_id": "app", "token": t} for t in ("T1", "T2")]  # the temporary profile of T1 goes tokenless
    write_ndjson(landing / "zz-push.ndjson", [
        {"method": "POST", "path": TRACK, "body": {"attributes": [{"push_token_import": True, "push_tokens": tokens}]}},
        {"method": "POST", "path": TRACK, "body": {"attributes": [{"external_id": "user-000001",
                                                                   "push_tokens": tokens[:1]}]}}])
    deployments = build_deployments(str(store), str(landing), str(exports))
    for d in deployments:
        d.apply()
    with get_client(sync_client=True) as client:
        for name, (entrypoint, cron, parameters) in expected(tmp_path).items():
            stored = client.read_deployment_by_name(name)
            assert (stored.entrypoint, stored.parameters) == (entrypoint, parameters)
            assert [s.schedule.cron for s in stored.schedules] == ([cron] if cron else [])  # type: ignore[union-attr]
        # the server's scheduler service turns the crons into flow runs (under SQLAlchemy 2.1 its
        # bulk insert fails and no scheduled run is ever created): one pass of it, in this process,
        # over the test server's database
        asyncio.run(schedule_deployments(perpetual=Perpetual(automatic=False)))
        for name, hour, days in (("track_batch/nightly-track", 2, {1}), ("compact_store/daily-compaction", 4, {1}),
                                 ("cleanup_push_token_profiles/monthly-cleanup", 3, {28, 29, 30, 31})):
            deployment = client.read_deployment_by_name(name)
            runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])))
            starts = sorted(run.expected_start_time for run in runs if run.state and run.state.is_scheduled())
            assert len(starts) >= 3 and {(t.hour, t.minute, t.utcoffset()) for t in starts} == {(hour, 0, timedelta(0))}
            assert {round((b.timestamp() - a.timestamp()) / 86400) for a, b in zip(starts, starts[1:], strict=False)} <= days
            assert name != "cleanup_push_token_profiles/monthly-cleanup" or {t.day for t in starts} == {1}

    state, applied = run_deployment_once("track_batch/nightly-track")
    assert state.is_completed() and [a.path for a in applied] == [*files, landing / "zz-push.ndjson"]
    assert all(set(a.statuses) == {201} for a in applied)
    [table] = artifacts_of(state, "track-batch")
    assert orjson.loads(table.data)[-1]["requests"] == sum(a.requests for a in applied)

    state, deleted = run_deployment_once("cleanup_push_token_profiles/monthly-cleanup")
    assert state.is_completed() and deleted == 1
    assert artifacts_of(state, "cleanup-push-token-profiles")[0].data.startswith("Deleted **1** ")

    profiles = Workspace.open(store).table("profiles").collect().height
    state, kept = run_deployment_once("compact_store/daily-compaction")
    assert state.is_completed() and kept["profiles"] == profiles
    assert len(artifacts_of(state, "compact-store")) == 1

    state, result = run_deployment_once("export_batch/on-demand",
                                        {"identifiers_file_or_list": ["user-000001", "user-000002", "nobody"]})
    assert state.is_completed() and (result.users, result.invalid_user_ids) == (2, ["nobody"])
    users = [orjson.loads(line) for line in (exports / "export_batch" / "users.ndjson").read_bytes().splitlines()]
    assert [u["external_id"] for u in users] == ["user-000001", "user-000002"]
    assert users[0]["push_tokens"][0]["token"] == "T1"

    state, result = run_deployment_once("export_all/on-demand")
    assert state.is_completed() and result.users == profiles
    assert (exports / "export_all" / "users.parquet").is_file()
    assert len(artifacts_of(state, "export-all")) == 1
