"""The Prefect flows end to end: real flows, a real Delta store in tmp_path, real files."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest
from polars.testing import assert_frame_equal
from prefect.states import Failed
from tests.helpers import copy_store

from engagelake import Workspace
from engagelake.demo import count_objects, generate_workload, write_request_files
from engagelake.errors import ConfigError, NotAStore
from engagelake.files import RequestFileError, read_request_file, read_responses_file
from engagelake.rules.messages import EXPORT_FIELDS
from flows._retry import is_transient_io_error
from flows.cleanup_push_tokens import cleanup_push_token_profiles
from flows.export_batch import export_all, export_batch
from flows.track_batch import (
    compact_store,
    identify_batch,
    merge_batch,
    publish_current,
    track_batch,
)

pytest_plugins = ["tests.prefect_harness", "tests.s3_server"]
pytestmark = pytest.mark.usefixtures("prefect_harness")

NOW = datetime(2026, 11, 22, tzinfo=UTC)
TRACK = "/users/track"


def workload(folder: Path, *, users: int = 60, objects: int = 900, per_file: int = 3) -> list[Path]:
    """Write a generated workload as NDJSON request files; return their paths."""
    return write_request_files(generate_workload(users, objects, seed=3, now=NOW), folder, per_file)


def requests_of(paths: list[Path]) -> list[dict[str, Any]]:
    return [request for path in paths for request in read_request_file(path).iter_requests()]


def tables(store: Path) -> dict[str, pl.DataFrame]:
    ws = Workspace.open(store)
    return {name: ws.table(name).collect() for name in ws.table_names()}


def store_files(store: Path) -> dict[str, bytes]:
    """Every file of the store and its bytes: proves that a re-run writes nothing."""
    return {
        str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()
    }


def plan_of(store: Path, external_id: str) -> Any:
    body = {"external_ids": [external_id], "fields_to_export": ["custom_attributes"]}
    users = Workspace.open(store).call("POST", "/users/export/ids", body).body["users"]  # type: ignore[index]
    return users[0]["custom_attributes"]["plan"]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory, prefect_harness: None) -> tuple[Path, list[Path], list[Any]]:
    """`track_batch` once over a generated workload of 60 users (user-000000 ... user-000059):
    the folder holding `requests/` (with the responses files) and `store/`, the request files
    and what the flow returned. Read it; copy the folder to write."""
    folder = tmp_path_factory.mktemp("tracked")
    paths = workload(folder / "requests")
    applied = track_batch(str(folder / "requests"), str(folder / "store"))
    return folder, paths, applied


@pytest.fixture
def tracked_store(first_run: tuple[Path, list[Path], list[Any]]) -> Path:
    """The store of `first_run` (only read by the tests)."""
    return first_run[0] / "store"


def test_track_batch_applies_each_file_and_writes_its_responses(first_run: tuple[Path, list[Path], list[Any]]) -> None:
    folder, paths, applied = first_run
    store = folder / "store"

    assert [a.path for a in applied] == paths
    requests = requests_of(paths)
    for a in applied:
        lines = read_responses_file(a.responses_path)
        assert a.responses_path == a.path.with_name(a.path.stem + ".responses.ndjson")
        assert len(lines) == a.requests == len(list(read_request_file(a.path).iter_requests()))
        assert all(line["status"] == 201 and line["body"]["message"] == "success" for line in lines)
        assert a.statuses == {201: a.requests}
    ws = Workspace.open(store)
    bodies = [r["body"] for r in requests]
    ids = {
        o["external_id"]
        for b in bodies
        for name in ("attributes", "events", "purchases")
        for o in b.get(name, [])
    }
    assert ws.table("profiles").collect().height == len(ids)
    assert ws.table("events").collect().height == sum(len(b.get("events", [])) for b in bodies)
    assert ws.table("purchases").collect().height == sum(len(b.get("purchases", [])) for b in bodies)
    assert sum(count_objects(r) for r in requests) == 900


def test_track_batch_rerun_returns_stored_responses_and_changes_nothing(
        first_run: tuple[Path, list[Path], list[Any]], tmp_path: Path) -> None:
    copy_store(first_run[0], tmp_path, dirs_exist_ok=True)  # the first run's files and store
    folder, store = tmp_path / "requests", tmp_path / "store"
    first = [(folder / a.path.name, a.statuses, (folder / a.responses_path.name).read_bytes()) for a in first_run[2]]
    before_tables, before_files = tables(store), store_files(store)

    second = track_batch(str(folder), str(store))

    assert [(a.path, a.statuses, a.responses_path.read_bytes()) for a in second] == first
    assert store_files(store) == before_files
    after = tables(store)
    for name, frame in before_tables.items():
        assert_frame_equal(after[name], frame)


def test_the_flow_and_the_library_share_the_idempotency_key(tmp_path: Path) -> None:
    folder, store = tmp_path / "requests", tmp_path / "store"
    [path] = workload(folder, users=10, objects=100, per_file=10)
    [applied] = track_batch(str(folder), str(store))
    events = Workspace.open(store).table("events").collect().height

    batch = read_request_file(path)
    again = Workspace.open(store).apply(batch.iter_requests(), idempotency_key=batch.idempotency_key)

    assert [{"status": r.status, "body": r.body} for r in again] == read_responses_file(
        applied.responses_path
    )
    assert Workspace.open(store).table("events").collect().height == events


def test_a_changed_file_is_a_new_batch(tmp_path: Path) -> None:
    folder, store = tmp_path / "requests", tmp_path / "store"
    folder.mkdir()
    event = {"external_id": "user-1", "name": "session_start", "time": "2026-11-20T10:00:00Z"}
    request = {"method": "POST", "path": TRACK, "body": {"events": [event]}}
    (folder / "batch.ndjson").write_bytes(orjson.dumps(request) + b"\n")
    track_batch(str(folder), str(store))
    (folder / "batch.ndjson").write_bytes(
        orjson.dumps(request) + b"\n" + orjson.dumps(request) + b"\n"
    )

    track_batch(str(folder), str(store))

    assert Workspace.open(store).table("events").collect().height == 3


def test_parquet_and_ndjson_files_apply_in_sorted_name_order(tmp_path: Path) -> None:
    folder, store = tmp_path / "requests", tmp_path / "store"
    folder.mkdir()
    create = {"attributes": [{"external_id": "user-1", "plan": "free"}]}
    pl.DataFrame(
        {
            "method": ["POST", "POST", "GET"],
            "path": [TRACK, TRACK, "/no/such/endpoint"],
            "body": [orjson.dumps(create).decode(), "{not json", None],
            "query": [None, None, '{"page": "1"}'],
        },
        schema={"method": pl.String, "path": pl.String, "body": pl.String, "query": pl.String},
    ).write_parquet(folder / "a.parquet")
    upgrade = {"attributes": [{"external_id": "user-1", "plan": "pro"}]}
    (folder / "b.ndjson").write_bytes(
        orjson.dumps({"method": "POST", "path": TRACK, "body": upgrade})
    )

    a, b = track_batch(str(folder), str(store))

    assert [line["status"] for line in read_responses_file(a.responses_path)] == [201, 400, 404]
    assert (folder / "a.responses.ndjson").exists() and (folder / "b.responses.ndjson").exists()
    assert b.statuses == {201: 1}
    assert plan_of(store, "user-1") == "pro"


def test_request_files_with_the_same_stem_are_refused(tmp_path: Path) -> None:
    (tmp_path / "x.ndjson").write_text("")
    pl.DataFrame({"method": ["POST"], "path": [TRACK], "body": ["{}"]}).write_parquet(
        tmp_path / "x.parquet"
    )

    with pytest.raises(RequestFileError, match="share a name: x"):
        track_batch(str(tmp_path), str(tmp_path / "store"))


def test_a_broken_request_file_names_the_file_and_line(tmp_path: Path) -> None:
    good = orjson.dumps({"method": "POST", "path": TRACK, "body": {"attributes": [{"external_id": "a"}]}}).decode()
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "broken.ndjson").write_text(f"{good}\n{{oops\n")
    requests = read_request_file(tmp_path / "in" / "broken.ndjson").iter_requests()
    assert next(requests)["path"] == TRACK  # decoded as drawn: line 2 is not read yet

    with pytest.raises(RequestFileError, match=r"broken\.ndjson line 2: not valid JSON"):
        track_batch(str(tmp_path / "in"), str(tmp_path / "store"))
    assert Workspace.open(tmp_path / "store").table("profiles").collect().height == 0  # line 1 neither


def test_a_file_changed_while_it_is_applied_is_refused(tmp_path: Path) -> None:
    path = write_ndjson(tmp_path / "batch.ndjson", [
        {"method": "POST", "path": TRACK, "body": {"attributes": [{"external_id": f"u{i}"}]}} for i in range(3)])
    batch = read_request_file(path)
    path.write_bytes(path.read_bytes().replace(b'"u2"', b'"u9"'))  # same size, other bytes
    ws = Workspace.open(tmp_path / "store")
    with pytest.raises(RequestFileError, match="changed while it was applied"):
        ws.apply(batch.iter_requests(), idempotency_key=batch.idempotency_key)
    assert ws.table("profiles").collect().height == 0  # the batch did not commit


def test_a_parquet_file_without_the_request_columns_is_refused_before_applying(tmp_path: Path) -> None:
    pl.DataFrame({"method": ["POST"], "route": [TRACK]}).write_parquet(tmp_path / "odd.parquet")
    with pytest.raises(RequestFileError, match=r"missing column\(s\) path, body"):
        read_request_file(tmp_path / "odd.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(RequestFileError, match="not a readable Parquet file"):
        read_request_file(tmp_path / "junk.parquet")


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (OSError("connection reset"), True),
        (TimeoutError("object store timed out"), True),
        (FileNotFoundError("gone"), False),
        (PermissionError("denied"), False),
        (ValueError("bad input"), False),
        (RequestFileError("bad file"), False),
    ],
)
def test_tasks_retry_on_transient_io_errors_only(error: BaseException, retried: bool) -> None:
    assert is_transient_io_error(None, None, Failed(data=error)) is retried


def test_export_batch_exports_in_chunks_and_writes_both_files(
    tracked_store: Path, tmp_path: Path
) -> None:
    ids = [f"user-{n:06d}" for n in range(60)]
    (tmp_path / "ids.txt").write_text("\n".join([*ids, "", "  user-000001  ", "nobody"]) + "\n")
    out = tmp_path / "export"

    result = export_batch(str(tmp_path / "ids.txt"), str(out), str(tracked_store))

    assert result.users == 60 and result.invalid_user_ids == ["nobody"]
    users = [orjson.loads(line) for line in (out / "users.ndjson").read_bytes().splitlines()]
    assert [u["external_id"] for u in users] == ids
    ws = Workspace.open(tracked_store)
    expected = []
    for start in (0, 50):
        body = {"external_ids": ids[start : start + 50], "fields_to_export": list(EXPORT_FIELDS)}
        expected += ws.call("POST", "/users/export/ids", body).body["users"]  # type: ignore[index]
    assert users == expected
    frame = pl.read_parquet(out / "users.parquet")
    assert frame.height == 60
    assert frame["external_id"].to_list() == ids
    assert frame.schema["custom_attributes"] == pl.String
    assert [orjson.loads(v) for v in frame["custom_attributes"]] == [
        u["custom_attributes"] for u in users
    ]


def test_export_batch_takes_a_list_and_fields(tracked_store: Path, tmp_path: Path) -> None:
    result = export_batch(
        ["user-000002", "user-000001"], str(tmp_path / "out"), str(tracked_store), ["first_name"]
    )

    assert result.users == 2
    users = [
        orjson.loads(line) for line in (tmp_path / "out" / "users.ndjson").read_bytes().splitlines()
    ]
    assert [set(u) <= {"first_name"} for u in users] == [True, True]


@pytest.mark.parametrize("users_per_chunk", [7, 50_000])
def test_export_all_writes_every_user(tracked_store: Path, tmp_path: Path, users_per_chunk: int) -> None:
    fields = ["external_id", "custom_attributes", "random_bucket"]
    result = export_all(str(tmp_path / "all"), str(tracked_store), fields, users_per_chunk)

    ws = Workspace.open(tracked_store)
    assert result.users == ws.table("profiles").collect().height == 60
    lines = (tmp_path / "all" / "users.ndjson").read_bytes().splitlines()
    by_id = sorted(ws.export_users(fields), key=lambda user: user["external_id"])
    assert sorted((orjson.loads(line) for line in lines), key=lambda user: user["external_id"]) == by_id
    frame = pl.read_parquet(tmp_path / "all" / "users.parquet")
    assert frame.columns == fields and frame.schema["random_bucket"] == pl.Int64
    assert frame.sort("external_id")["external_id"].to_list() == [user["external_id"] for user in by_id]
    import pyarrow.parquet as pq

    groups = pq.read_metadata(tmp_path / "all" / "users.parquet").num_row_groups
    chunks = sum(1 for _ in ws.iter_users(fields, users_per_chunk=users_per_chunk))
    assert groups == chunks  # one row group per chunk: written as streamed (chunks follow the runs' layout)


# --- identity flows ---------------------------------------------------------------------------
def write_ndjson(path: Path, requests: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in requests))
    return path


def merge_request(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    return {"method": "POST", "path": "/users/merge", "body": {"merge_updates": [
        {"identifier_to_merge": {"external_id": a}, "identifier_to_keep": {"external_id": b}} for a, b in pairs]}}


def external_ids(store: Path) -> list[str]:
    return sorted(Workspace.open(store).table("external_ids").collect()["external_id"].to_list())


@pytest.fixture(scope="module")
def four_users_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("four-users") / "store"
    users = [{"external_id": f"u{i}", "n": i} for i in range(4)]
    ws = Workspace.open(store)
    ws.call("POST", TRACK, {"attributes": users})
    ws.store.wait_for_merges()  # nothing left to write while it is copied
    return store


@pytest.fixture
def four_users(four_users_template: Path, tmp_path: Path) -> Path:
    """A store holding u0 ... u3: a copy of one built once for the module."""
    return copy_store(four_users_template, tmp_path / "store")


def test_merge_batch_applies_merge_files_and_is_safe_to_rerun(tmp_path: Path, four_users: Path) -> None:
    write_ndjson(tmp_path / "merges" / "001.ndjson", [merge_request([("u0", "u1"), ("u1", "u2")])])
    [applied] = merge_batch(str(tmp_path / "merges"), str(four_users))
    assert applied.statuses == {202: 1}
    assert external_ids(four_users) == ["u2", "u3"]
    before = store_files(four_users)
    merge_batch(str(tmp_path / "merges"), str(four_users))  # the same file again: nothing changes
    assert store_files(four_users) == before


def test_merge_batch_refuses_a_file_with_other_endpoints(tmp_path: Path, four_users: Path) -> None:
    track = {"method": "POST", "path": TRACK, "body": {"attributes": [{"external_id": "x"}]}}
    write_ndjson(tmp_path / "merges" / "001.ndjson", [merge_request([("u0", "u1")]), track])
    with pytest.raises(ConfigError, match="request 1 goes to /users/track"):
        merge_batch(str(tmp_path / "merges"), str(four_users))
    assert external_ids(four_users) == ["u0", "u1", "u2", "u3"]  # nothing of the file applied


def test_identify_batch_identifies_alias_only_profiles(tmp_path: Path, four_users: Path) -> None:
    Workspace.open(four_users).call("POST", "/users/alias/new", {"user_aliases": [
        {"alias_name": "a1", "alias_label": "crm"}]})
    identify = {"method": "POST", "path": "/users/identify", "body": {"aliases_to_identify": [
        {"external_id": "new-1", "user_alias": {"alias_name": "a1", "alias_label": "crm"}}]}}
    write_ndjson(tmp_path / "identify" / "001.ndjson", [identify])
    [applied] = identify_batch(str(tmp_path / "identify"), str(four_users))
    assert applied.statuses == {200: 1}
    assert "new-1" in external_ids(four_users)


def test_track_batch_applies_files_that_mix_every_user_endpoint(tmp_path: Path, four_users: Path) -> None:
    mixed = [
        merge_request([("u0", "u1")]),
        {"method": "POST", "path": TRACK, "body": {"attributes": [{"external_id": "u0", "n": 9}]}},
        {"method": "POST", "path": "/users/external_ids/rename",
         "body": {"external_id_renames": [{"current_external_id": "u2", "new_external_id": "u2b"}]}},
        {"method": "POST", "path": "/users/delete", "body": {"external_ids": ["u3"]}},
    ]
    write_ndjson(tmp_path / "mixed" / "001.ndjson", mixed)
    [applied] = track_batch(str(tmp_path / "mixed"), str(four_users))
    assert applied.statuses == {202: 1, 201: 1, 200: 2}
    # u0 was merged away, so the track created a new u0; u2 renamed (u2 deprecated); u3 deleted
    assert external_ids(four_users) == ["u0", "u1", "u2", "u2b"]


def test_compact_store_keeps_the_content(four_users: Path) -> None:
    ws = Workspace.open(four_users)
    ws.call("POST", "/users/delete", {"external_ids": ["u3"]})
    before = ws.export_users(["external_id", "custom_attributes"])
    kept = compact_store(str(four_users))
    assert kept["profiles"] == 3
    assert Workspace.open(four_users).export_users(["external_id", "custom_attributes"]) == before


def test_publish_current_writes_the_rows_readers_see(four_users: Path, tmp_path: Path) -> None:
    ws = Workspace.open(four_users)
    ws.call("POST", "/users/delete", {"external_ids": ["u3"]})
    rows = publish_current(str(four_users), str(tmp_path / "out"))
    published = pl.read_delta(str(tmp_path / "out" / "profiles"))
    assert rows["profiles"] == published.height == 3
    assert sorted(published["external_id"]) == ["u0", "u1", "u2"]


def test_cleanup_push_token_profiles_deletes_the_tokenless_temporary_profiles(tmp_path: Path) -> None:
    ws = Workspace.open(tmp_path / "store", clock=lambda: NOW)
    tokens = [{"app_id": "app", "token": t} for t in ("T1", "T2")]
    ws.call("POST", TRACK, {"attributes": [{"push_token_import": True, "push_tokens": tokens}]})
    ws.call("POST", TRACK, {"attributes": [{"external_id": "u1", "push_tokens": tokens[:1]}]})
    assert cleanup_push_token_profiles(str(tmp_path / "store")) == 1
    assert Workspace.open(tmp_path / "store").table("profiles").collect().height == 2
    with pytest.raises(NotAStore):  # the flow never creates a store
        cleanup_push_token_profiles(str(tmp_path / "nothing"))



def test_a_rerun_after_the_stored_responses_expired_is_a_logged_skip(tmp_path: Path, caplog: Any) -> None:
    """Compaction with a zero retention window drops every file's stored responses: the flow's
    re-run applies nothing again, leaves the responses files alone and logs each file skipped."""
    folder, store = tmp_path / "requests", tmp_path / "store"
    workload(folder, users=10, objects=100, per_file=10)
    first = track_batch(str(folder), str(store))
    responses = {a.responses_path: a.responses_path.read_bytes() for a in first}
    compact_store(str(store), response_retention_days=0)
    before = tables(store)

    with caplog.at_level("INFO"):
        second = track_batch(str(folder), str(store))

    assert [a.skipped is not None and "applied at" in a.skipped for a in second] == [True] * len(first)
    assert {a.responses_path: a.responses_path.read_bytes() for a in first} == responses
    after = tables(store)
    for name, frame in before.items():
        assert_frame_equal(after[name], frame)
    assert sum("skipped, applied at" in record.getMessage() for record in caplog.records) == len(first)


# --- artifacts ----------------------------------------------------------------------------------
def artifacts_of(state: Any, key: str) -> list[Any]:
    """The artifacts with `key` that the flow run of `state` created, read back from the API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
    )

    run = ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])
    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]), flow_run_id=run))


def test_track_batch_records_a_table_artifact_of_each_file(tmp_path: Path) -> None:
    event = {"external_id": "a", "name": "visit", "time": "2026-11-20T10:00:00Z"}
    nameless = {"external_id": "a", "time": "2026-11-20T10:00:00Z"}  # a non-fatal error
    purchase = {"external_id": "b", "product_id": "p", "currency": "USD", "price": 1.5,
                "time": "2026-11-20T10:00:00Z"}
    write_ndjson(tmp_path / "in" / "a.ndjson", [
        {"method": "POST", "path": TRACK, "body": {
            "attributes": [{"external_id": "a", "plan": "pro"}, {"external_id": "b"}],
            "events": [event, nameless]}},
        {"method": "GET", "path": "/no/such/endpoint"},
    ])
    write_ndjson(tmp_path / "in" / "b.ndjson", [
        {"method": "POST", "path": TRACK, "body": {"purchases": [purchase]}}])

    state = track_batch(str(tmp_path / "in"), str(tmp_path / "store"), return_state=True)

    [artifact] = artifacts_of(state, "track-batch")
    assert artifact.type == "table"
    rows = orjson.loads(artifact.data)
    assert [r["file"] for r in rows] == ["a.ndjson", "b.ndjson", "total"]
    seconds = [r.pop("seconds") for r in rows]
    assert rows == [
        {"file": "a.ndjson", "requests": 2, "objects": 3, "status 201": 1, "status 404": 1, "non-fatal errors": 1},
        {"file": "b.ndjson", "requests": 1, "objects": 1, "status 201": 1, "status 404": 0, "non-fatal errors": 0},
        {"file": "total", "requests": 3, "objects": 4, "status 201": 2, "status 404": 1, "non-fatal errors": 1},
    ]
    assert seconds[0] > 0 and seconds[1] > 0 and seconds[2] == pytest.approx(seconds[0] + seconds[1], abs=0.002)
    assert artifact.description.startswith(f"`track_batch`: 2 file(s) of `{tmp_path / 'in'}` applied to ")
    assert "3 requests, 4 objects processed, 1 non-fatal errors in" in artifact.description
    assert [a.objects for a in state.result()] == [3, 1]


def test_a_refused_file_still_leaves_the_artifact_of_the_files_before(tmp_path: Path, four_users: Path) -> None:
    write_ndjson(tmp_path / "merges" / "001.ndjson", [merge_request([("u0", "u1")])])
    write_ndjson(tmp_path / "merges" / "002.ndjson", [{"method": "POST", "path": "/users/delete", "body": {}}])

    state = merge_batch(str(tmp_path / "merges"), str(four_users), return_state=True)

    assert state.is_failed()
    [artifact] = artifacts_of(state, "merge-batch")
    assert [(r["file"], r["requests"], r["status 202"]) for r in orjson.loads(artifact.data)] == [
        ("001.ndjson", 1, 1), ("total", 1, 1)]
    assert "stopped by ConfigError: 002.ndjson: request 0 goes to /users/delete" in artifact.description


def test_compaction_cleanup_and_exports_record_their_figures(tmp_path: Path, four_users: Path) -> None:
    compacted = compact_store(str(four_users), return_state=True)
    [table] = artifacts_of(compacted, "compact-store")
    assert {r["table"]: r["rows"] for r in orjson.loads(table.data)} == compacted.result()
    cleaned = cleanup_push_token_profiles(str(four_users), return_state=True)
    [note] = artifacts_of(cleaned, "cleanup-push-token-profiles")
    assert note.type == "markdown" and note.data.startswith("Deleted **0** temporary anonymous profiles")
    exported = export_batch(["u1", "nobody"], str(tmp_path / "out"), str(four_users), return_state=True)
    [note] = artifacts_of(exported, "export-batch")
    assert note.data.startswith(f"Exported **1** users from `{four_users}` for 2 external IDs in ")
    assert note.data.endswith("1 external IDs matched no user: `nobody`")
    everyone = export_all(str(tmp_path / "all"), str(four_users), return_state=True)
    [note] = artifacts_of(everyone, "export-all")
    assert note.data.startswith(f"Exported **4** users from `{four_users}` in ")
    assert f"- `{tmp_path / 'all' / 'users.parquet'}`" in note.data


@pytest.mark.slow  # every flow again against moto: 6 s (tests/test_object_storage.py has stores on S3 by default)
def test_the_flows_run_unchanged_on_a_store_on_s3(first_run: tuple[Path, list[Path], list[Any]], s3: Any,
                                                   tmp_path: Path) -> None:
    """`track_batch` and `export_batch` given an `s3://` store instead of a folder: the same
    responses and the same users as on the folder (issue 13: the flows run unchanged in code)."""
    folder, _, applied = first_run
    uri = s3()
    workload(tmp_path / "requests")  # the same generated requests, in a folder of their own
    on_s3 = track_batch(str(tmp_path / "requests"), uri)
    assert [(a.path.name, a.statuses, a.errors) for a in on_s3] == [(a.path.name, a.statuses, a.errors) for a in applied]
    for mine, theirs in zip(sorted((tmp_path / "requests").glob("*.responses.ndjson")),
                            sorted((folder / "requests").glob("*.responses.ndjson")), strict=True):
        assert read_responses_file(mine) == read_responses_file(theirs)
    fields = [f for f in EXPORT_FIELDS if f not in ("service_id", "created_at", "random_bucket")]
    assert Workspace.open(uri).export_users(fields) == Workspace.open(folder / "store").export_users(fields)
    ids = tmp_path / "ids.txt"
    ids.write_text("user-000001\nuser-000002\nnobody\n")
    result = export_batch(str(ids), str(tmp_path / "export"), uri)
    assert result.users == 2 and result.invalid_user_ids == ["nobody"]
