"""The `engagelake` command line through Typer's CliRunner, on real stores in tmp paths."""

from __future__ import annotations

import inspect
import io
import itertools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest
import typer
from polars.testing import assert_frame_equal
from tests import helpers
from typer.testing import CliRunner

from engagelake import Workspace
from engagelake.cli import app, ingest

pytest_plugins = ["tests.prefect_harness"]

runner = CliRunner()
COMMANDS = ("demo", "apply", "export", "sql", "lineage", "compact", "cleanup-push-profiles", "publish", "check", "repair",
            "forget-check")
HEAVY_MODULES = (
    "polars",
    "duckdb",
    "deltalake",
    "pyarrow",
    "prefect",
    "numpy",
    "engagelake.workspace",
)


@pytest.mark.parametrize("command", [(), *((name,) for name in COMMANDS)])
def test_every_command_has_help(command: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*command, "--help"])

    assert result.exit_code == 0, result.output
    assert "Usage: engagelake" in result.output
    if command:
        assert "--store" in result.output
    else:
        assert all(name in result.output for name in COMMANDS)


def _command_paths(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group of the CLI, as the words that name it."""
    found = [path]
    if hasattr(command, "commands"):  # a group (Typer's click, which may be its own copy)
        for name, sub in command.commands.items():
            found += _command_paths(sub, (*path, name))
    return found


ALL_COMMANDS = _command_paths(typer.main.get_command(app))
assert len(ALL_COMMANDS) == 1 + len(COMMANDS) + 1 + 6 + 20  # the root, those above, serve, six groups (3, 3, 2, 5, 3, 4)


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=lambda path: " ".join(path) or "engagelake")
def test_every_help_shows_examples_that_fit_80_columns(command: tuple[str, ...]) -> None:
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, [*command, "--help"])

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    start = next(i for i, line in enumerate(lines) if line.strip() in ("Example:", "Examples:"))
    examples = list(itertools.takewhile(str.strip, lines[start + 1:]))
    # each example on a line of its own, indented: one wrapped at 80 columns would leave a line without
    assert examples and all(line.startswith("   ") and "engagelake " in line for line in examples), examples


def test_the_listing_shows_one_line_summaries() -> None:
    """Typer keeps the line breaks of a docstring's first paragraph in the command listing: every
    first paragraph is one line, so the listing wraps by itself."""
    for path in ALL_COMMANDS[1:]:
        command = typer.main.get_command(app)
        for name in path:
            command = command.commands[name]  # type: ignore[attr-defined]
        assert "\n" not in inspect.cleandoc(command.help or "").split("\n\n")[0], path


def test_help_does_not_import_the_engine() -> None:
    code = f"import sys, engagelake.cli; print([m for m in {HEAVY_MODULES!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert out.stdout.strip() == "[]"


def test_demo_gives_prefects_temporary_server_time_to_start(tmp_path: Path) -> None:
    """The first start of the flows' temporary Prefect server (a new Prefect home: a database to
    migrate) took longer than Prefect's default 20 s on a busy 2-core machine and the demo
    failed: `engagelake demo`, run from a folder without the project's pyproject.toml, gives it
    `EPHEMERAL_STARTUP_TIMEOUT_SECONDS` in the settings Prefect reads when the flows import it.
    (The demo is stopped where its flows would start.)"""
    code = (
        "import os, sys\n"
        "import engagelake.cli.ingest as ingest\n"
        "def flows(*args):\n"
        "    from prefect.settings import get_current_settings\n"
        "    print(get_current_settings().server.ephemeral.startup_timeout_seconds, flush=True)\n"
        "    os._exit(0)\n"
        "ingest._run_demo = flows\n"
        "from engagelake.cli import app\n"
        "app(['demo', '--store', 'store'])\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         check=True)

    assert out.stdout.splitlines()[-1] == str(ingest.EPHEMERAL_STARTUP_TIMEOUT_SECONDS)  # after "creating a new store"
    assert ingest.EPHEMERAL_STARTUP_TIMEOUT_SECONDS >= 120


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory, prefect_harness: None) -> tuple[Path, str]:
    """`engagelake demo` once for this module: the store it filled and what it printed."""
    root = tmp_path_factory.mktemp("demo")
    args = ["demo", "--users", "200", "--objects", "2000", "--store", str(root / "store")]
    result = runner.invoke(
        app, [*args, "--requests-dir", str(root / "requests"), "--per-file", "7"]
    )
    assert result.exit_code == 0, result.output
    return root, result.stdout


def test_demo_generates_applies_and_summarizes(demo_run: tuple[Path, str]) -> None:
    root, output = demo_run

    ws = Workspace.open(root / "store")
    # user-000051 went into user-000050 and user-000151 into user-000150 (merge_batch flow)
    assert ws.table("profiles").collect().height == 198
    assert set(ws.table("merges").collect()["outcome"]) == {"applied"} and ws.table("merges").collect().height == 2
    assert "Lineage: engagelake lineage user-000050" in output
    assert f"creating a new store at {root / 'store'}" in output.replace("\n", "")
    events, purchases = ws.table("events").collect().height, ws.table("purchases").collect().height
    assert 0 < events and 0 < purchases
    summary = output[output.index("engagelake demo") :]
    for label, value in (("users", 198), ("events", events), ("purchases", purchases)):
        assert label in summary and f"{value:,}" in summary
    assert "objects/s" in summary
    requests = sorted((root / "requests").glob("requests-*.ndjson"))
    assert len([p for p in requests if not p.name.endswith(".responses.ndjson")]) == 3
    sample = orjson.loads(output[output.index("{", output.index("Sample export")) : output.index("Lineage:")])
    assert [u["external_id"] for u in sample["users"]] == [
        "user-000000",
        "user-000001",
        "user-000002",
    ]
    assert all("custom_attributes" in u for u in sample["users"])


def test_sql_prints_a_table(demo_run: tuple[Path, str]) -> None:
    root, _ = demo_run

    result = runner.invoke(
        app,
        ["sql", "select count(*) as profile_count from profiles", "--store", str(root / "store")],
    )

    assert result.exit_code == 0, result.output
    assert "profile_count" in result.stdout and "198" in result.stdout


def test_sql_limits_rows(demo_run: tuple[Path, str]) -> None:
    root, _ = demo_run

    result = runner.invoke(
        app,
        ["sql", "select external_id from profiles", "--limit", "5", "--store", str(root / "store")],
    )

    assert result.exit_code == 0, result.output
    assert "193 more rows" in result.stdout


def test_a_bad_query_is_a_red_one_line_error(demo_run: tuple[Path, str]) -> None:
    root, _ = demo_run

    result = runner.invoke(
        app, ["sql", "select * from no_such_table", "--store", str(root / "store")]
    )

    assert result.exit_code == 1
    assert result.stderr.startswith("error: SQL error:") and "no_such_table" in result.stderr
    assert "`engagelake sql --help` lists the tables" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_demo_rerun_says_it_replayed_instead_of_a_throughput(tmp_path: Path, prefect_harness: None) -> None:
    args = ["demo", "--users", "60", "--objects", "400", "--per-file", "2", "--store", str(tmp_path / "store"),
            "--requests-dir", str(tmp_path / "requests")]
    wide = CliRunner(env={"COLUMNS": "200"})

    first, again = wide.invoke(app, args), wide.invoke(app, args)

    assert first.exit_code == 0 and again.exit_code == 0, first.output + again.output
    files = len(list((tmp_path / "requests").glob("requests-*[0-9].ndjson")))
    assert files > 1 and "already applied" not in first.stdout
    assert "Generating requests" not in first.output  # progress bars only on a terminal's stderr
    row = [c.strip() for c in next(line for line in first.stdout.splitlines() if line.startswith("│")).split("│")[1:-1]]
    assert row[3:5] == [str(files), "400"] and float(row[5]) > 0 and row[6] != "–"
    assert f"All {files} request files were already applied to this store: an idempotent replay, nothing written " \
           "again, so no throughput to show." in again.stdout
    row = [c.strip() for c in next(line for line in again.stdout.splitlines() if line.startswith("│")).split("│")[1:-1]]
    assert row[3:] == ["0", "0", "–", "–"]


SQL_QUERY = "select external_id, first_name, country, visits from profiles left join (select service_id, " \
    "try_cast(value as bigint) as visits from attributes where name = 'visits') using (service_id) order by external_id"
READERS = {"csv": pl.read_csv, "json": pl.read_json, "parquet": pl.read_parquet}


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_sql_writes_every_row_to_a_file(demo_run: tuple[Path, str], tmp_path: Path, fmt: str) -> None:
    root, _ = demo_run
    out = tmp_path / "deeper" / f"result.{fmt}"

    result = runner.invoke(app, ["sql", SQL_QUERY, "--format", fmt, "--out", str(out), "--store", str(root / "store")])

    assert result.exit_code == 0, result.output
    assert f"wrote 198 rows to {out}" in result.stdout.replace("\n", "")  # every row, not --limit's 50
    assert_frame_equal(READERS[fmt](out), Workspace.open(root / "store").sql(SQL_QUERY))


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_sql_prints_csv_and_json_for_pipes(demo_run: tuple[Path, str], fmt: str) -> None:
    root, _ = demo_run

    result = runner.invoke(app, ["sql", SQL_QUERY, "-f", fmt, "--store", str(root / "store")])

    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert_frame_equal(READERS[fmt](io.BytesIO(result.stdout_bytes)), Workspace.open(root / "store").sql(SQL_QUERY))


def test_sql_takes_the_format_from_the_out_suffix(demo_run: tuple[Path, str], tmp_path: Path) -> None:
    root, _ = demo_run
    query = "select * from events order by time, service_id, name"

    result = runner.invoke(app, ["sql", query, "--out", str(tmp_path / "events.parquet"), "--store", str(root / "store")])

    assert result.exit_code == 0, result.output
    assert_frame_equal(pl.read_parquet(tmp_path / "events.parquet"), Workspace.open(root / "store").sql(query))


def test_sql_csv_refuses_nested_columns_and_names_them(demo_run: tuple[Path, str]) -> None:
    root, _ = demo_run

    result = runner.invoke(app, ["sql", "select [1, 2] as pair", "-f", "csv", "--store", str(root / "store")])

    assert result.exit_code == 1
    assert result.stderr.startswith("error: csv cannot hold the nested column(s) pair; use --format json or parquet")


def test_export_prints_the_api_response(demo_run: tuple[Path, str]) -> None:
    root, _ = demo_run
    args = [
        "export",
        "-e",
        "user-000001",
        "--external-id",
        "nobody",
        "--fields",
        "external_id,first_name",
    ]

    result = runner.invoke(app, [*args, "--store", str(root / "store")])

    assert result.exit_code == 0, result.output
    body = orjson.loads(result.stdout)
    assert body["message"] == "success"
    assert [u["external_id"] for u in body["users"]] == ["user-000001"]
    assert set(body["users"][0]) <= {"external_id", "first_name"}
    assert body["invalid_user_ids"] == ["nobody"]


def test_export_by_email(demo_run: tuple[Path, str]) -> None:
    root, _ = demo_run
    email = Workspace.open(root / "store").table("profiles").collect()["email"].drop_nulls()[0]

    result = runner.invoke(
        app, ["export", "--email", email, "--fields", "email", "--store", str(root / "store")]
    )

    assert result.exit_code == 0, result.output
    assert [u["email"] for u in orjson.loads(result.stdout)["users"]] == [email]


def test_export_all_writes_both_files(demo_run: tuple[Path, str], tmp_path: Path) -> None:
    root, _ = demo_run

    result = runner.invoke(
        app, ["export", "--all", "--out", str(tmp_path), "--store", str(root / "store")]
    )

    assert result.exit_code == 0, result.output
    assert "wrote 198 users" in result.stdout
    assert len((tmp_path / "users.ndjson").read_bytes().splitlines()) == 198
    assert pl.read_parquet(tmp_path / "users.parquet").height == 198


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export"], "nothing to export"),
        (["export", "--all"], "--all needs --out DIR"),
        (["export", "--all", "--out", "x", "-e", "u1"], "--all exports every user"),
        (["export", "-e", "u1", "--fields", "first_name,shoe_size"], "unknown field(s) shoe_size"),
        (["sql", "select 1", "--store", "no/such/store"], "no store at 'no/such/store'"),
        (["apply", "no/such/file.ndjson"], "no such request file: no/such/file.ndjson"),
        (["sql", "select 1", "-f", "parquet"], "--format parquet writes a binary file: add --out PATH"),
        (["sql", "select 1", "-f", "table", "--out", "x.csv"], "the table format prints to the screen: add --format"),
        (["sql", "select 1", "--out", "x.txt"], "cannot tell the format of --out x.txt from its suffix"),
    ],
)
def test_bad_input_says_what_to_fix(args: list[str], message: str, tmp_path: Path) -> None:
    result = runner.invoke(
        app, [*args, "--store", str(tmp_path / "store")] if "--store" not in args else args
    )

    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert "Traceback" not in result.output


def test_apply_applies_files_once_and_summarizes(tmp_path: Path) -> None:
    event = {"external_id": "user-1", "name": "session_start", "time": "2026-11-20T10:00:00Z"}
    requests = [
        {"method": "POST", "path": "/users/track", "body": {"events": [event]}},
        {"method": "POST", "path": "/users/track", "body": {"events": [{"name": "no identifier"}]}},
        {"method": "POST", "path": "/users/track", "body": {}},
    ]
    path = tmp_path / "batch.ndjson"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in requests))
    args = ["apply", str(path), "--store", str(tmp_path / "store")]

    first = runner.invoke(app, args)
    second = runner.invoke(app, [*args, "--allow-errors"])

    # a rejected request: the batch commits, the rejection is named, the exit code says so
    assert first.exit_code == 1 and second.exit_code == 0, first.output + second.output
    assert "1 request(s) rejected (the others are committed); first 1:" in first.stdout
    assert "batch.ndjson line 3: 400 " in first.stdout
    for result in (first, second):
        row = next(line for line in result.stdout.splitlines() if "batch.ndjson" in line)
        assert [cell.strip() for cell in row.split("│")[1:5]] == [
            "batch.ndjson",
            "3",
            "201×2, 400×1",
            "1",
        ]
    assert Workspace.open(tmp_path / "store").table("events").collect().height == 1
    statuses = [
        orjson.loads(line)["status"]
        for line in (tmp_path / "batch.responses.ndjson").read_bytes().splitlines()
    ]
    assert statuses == [201, 201, 400]


def test_apply_of_accepted_requests_exits_0(tmp_path: Path) -> None:
    path = tmp_path / "ok.ndjson"
    path.write_bytes(orjson.dumps({"method": "POST", "path": "/users/track",
                                   "body": {"attributes": [{"external_id": "u", "n": 1}]}}) + b"\n")
    result = runner.invoke(app, ["apply", str(path), "--store", str(tmp_path / "store")])
    assert result.exit_code == 0, result.output
    assert "rejected" not in result.stdout


@pytest.mark.parametrize("terminal", [False, True])
def test_progress_goes_to_stderr_and_only_to_a_terminal(tmp_path: Path, terminal: bool) -> None:
    requests = tmp_path / "requests"
    requests.mkdir()
    for n in (1, 2):
        (requests / f"b{n}.ndjson").write_bytes(orjson.dumps({"method": "POST", "path": "/users/track",
                                                              "body": {"attributes": [{"external_id": f"u{n}"}]}}))
    store = str(tmp_path / "store")
    shell = CliRunner(env={"TTY_COMPATIBLE": "1" if terminal else "0", "COLUMNS": "120"})

    results = {
        "Applying": shell.invoke(app, ["apply", str(requests), "--store", store]),
        "Exporting every user": shell.invoke(app, ["export", "--all", "--out", str(tmp_path / "out"), "--store", store]),
        "Compacting": shell.invoke(app, ["compact", "--store", store]),
    }

    for label, result in results.items():
        assert result.exit_code == 0, result.output
        assert label not in result.stdout  # piped output stays clean
        assert (label in result.stderr) is terminal, result.stderr
    assert len((tmp_path / "out" / "users.ndjson").read_bytes().splitlines()) == 2


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"engagelake {version('engagelake')}"


def test_apply_an_empty_folder_is_a_red_error(tmp_path: Path) -> None:
    (tmp_path / "requests").mkdir()

    result = runner.invoke(
        app, ["apply", str(tmp_path / "requests"), "--store", str(tmp_path / "store")]
    )

    assert result.exit_code == 1
    assert "no .ndjson or .parquet request files in" in result.stderr


def test_apply_a_broken_file_is_a_red_error(tmp_path: Path) -> None:
    (tmp_path / "broken.ndjson").write_text('{"method": "POST"}\n')

    result = runner.invoke(
        app, ["apply", str(tmp_path / "broken.ndjson"), "--store", str(tmp_path / "store")]
    )

    assert result.exit_code == 1
    assert "broken.ndjson line 1: 'path' must be a string" in result.stderr


def _merged_chain(store: Path) -> Workspace:
    """user-3 merged into user-2, user-2 into user-1, two skipped merges, user-1 renamed: a copy
    at `store` of a store built once."""
    return _copy_of_built(store, _merge_chain)


def _copy_of_built(store: Path, build: Any) -> Workspace:
    """A copy at `store` of the store that `build` fills, built once per process (opened as the
    CLI opens one: the default clock and seed)."""
    template = helpers.templates() / f"cli-{build.__name__}"
    if not template.exists():
        building = template.with_name(f"{template.name}.building")
        shutil.rmtree(building, ignore_errors=True)
        ws = Workspace.open(building)
        build(ws)
        ws.store.wait_for_merges()
        ws.close()
        building.rename(template)
    helpers.copy_store(template, store)
    return Workspace.open(store)


def _merge_chain(ws: Workspace) -> None:
    ws.call("POST", "/users/track", {"attributes": [{"external_id": f"user-{i}"} for i in (1, 2, 3)]})
    ws.call("POST", "/users/merge", {"merge_updates": [
        {"identifier_to_merge": {"external_id": "user-3"}, "identifier_to_keep": {"external_id": "user-2"}}]})
    ws.call("POST", "/users/merge", {"merge_updates": [
        {"identifier_to_merge": {"external_id": "user-2"}, "identifier_to_keep": {"external_id": "user-1"}},
        {"identifier_to_merge": {"external_id": "ghost"}, "identifier_to_keep": {"external_id": "user-1"}},
        {"identifier_to_merge": {"external_id": "ghost"}, "identifier_to_keep": {"external_id": "nobody"}}]})
    ws.call("POST", "/users/external_ids/rename", {"external_id_renames": [
        {"current_external_id": "user-1", "new_external_id": "customer-1"}]})


def _no_times(text: str) -> str:
    return re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "<time>", text)


def test_lineage_prints_a_tree_with_merged_profiles_nested(tmp_path: Path) -> None:
    ws = _merged_chain(tmp_path / "store")
    sid = {orjson.loads(r["source"])["external_id"]: r["source_sid"][:8]
           for r in ws.lineage("user-3").iter_rows(named=True) if r["kind"] == "rename" or r["outcome"] == "applied"}

    result = CliRunner(env={"COLUMNS": "120"}).invoke(app, ["lineage", "user-3", "--store", str(tmp_path / "store")])

    assert result.exit_code == 0, result.output
    assert _no_times(result.stdout) == f"""\
external_id user-3: 4 lineage row(s)
└── profile {sid["user-1"]} (live)
    ├── <time>  merge user-2 → user-1  (profile {sid["user-2"]} merged in)
    │   └── <time>  merge user-3 → user-2  (profile {sid["user-3"]} merged in)
    ├── <time>  merge ghost → user-1  skipped: unresolvable: identifier_to_merge
    └── <time>  rename user-1 → customer-1
"""


def test_lineage_puts_steps_that_resolved_to_no_profile_apart(tmp_path: Path) -> None:
    _merged_chain(tmp_path / "store")

    result = CliRunner(env={"COLUMNS": "120"}).invoke(app, ["lineage", "nobody", "--store", str(tmp_path / "store")])

    assert result.exit_code == 0, result.output
    assert _no_times(result.stdout) == """\
external_id nobody: 1 lineage row(s)
└── steps that resolved to no profile
    └── <time>  merge ghost → nobody  skipped: unresolvable: identifier_to_merge
"""


def test_lineage_table_and_json_formats(tmp_path: Path) -> None:
    ws = _merged_chain(tmp_path / "store")
    args = ["lineage", "user-1", "--store", str(tmp_path / "store")]

    table = CliRunner(env={"COLUMNS": "250"}).invoke(app, [*args, "--format", "table"])
    as_json = runner.invoke(app, [*args, "-f", "json"])

    assert table.exit_code == 0 and as_json.exit_code == 0, table.output + as_json.output
    rows = [line for line in table.stdout.splitlines() if line.startswith("│")]
    assert [r.split("│")[1].strip() for r in rows] == ["merge", "merge", "merge", "rename"]
    assert "unresolvable: identifier_to_merge" in table.stdout
    assert_frame_equal(pl.read_json(io.BytesIO(as_json.stdout_bytes)),
                       ws.lineage("user-1").with_columns(pl.col("at").dt.strftime("%Y-%m-%dT%H:%M:%S%.6f+00:00")))


def test_lineage_of_an_unknown_identifier_says_so(tmp_path: Path) -> None:
    Workspace.open(tmp_path / "store")
    result = runner.invoke(app, ["lineage", "nobody", "--store", str(tmp_path / "store")])
    assert result.exit_code == 0
    assert "no lineage for external_id 'nobody'" in result.output


def test_lineage_with_a_bad_kind_is_a_red_error(tmp_path: Path) -> None:
    Workspace.open(tmp_path / "store")
    result = runner.invoke(app, ["lineage", "x", "--kind", "shoe", "--store", str(tmp_path / "store")])
    assert result.exit_code == 1
    assert "kind must be one of external_id, user_alias, service_id, email, phone, not 'shoe': pass one with --kind" \
        in result.stderr.replace("\n", "")


def test_revoking_an_unknown_key_or_token_says_where_the_names_are(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    Workspace.open(store)
    wide = CliRunner(env={"COLUMNS": "200"})

    key = wide.invoke(app, ["keys", "revoke", "nope", "--store", store])
    token = wide.invoke(app, ["scim-tokens", "revoke", "nope", "--store", store])

    assert key.exit_code == token.exit_code == 1
    assert key.stderr == f"error: no active key named 'nope'; `engagelake keys list --store {store}` shows every key's name\n"
    assert token.stderr == (f"error: no active SCIM token with ID 'nope'; `engagelake scim-tokens list --store {store}` "
                            "shows every token's ID\n")


def test_compact_prints_the_rows_kept(tmp_path: Path) -> None:
    ws = Workspace.open(tmp_path / "store")
    ws.call("POST", "/users/track", {"attributes": [{"external_id": "a"}, {"external_id": "b"}]})
    ws.call("POST", "/users/delete", {"external_ids": ["a"]})
    result = runner.invoke(app, ["compact", "--store", str(tmp_path / "store")])
    assert result.exit_code == 0, result.output
    assert "profiles 1" in result.output


def test_cleanup_push_profiles_prints_how_many_went(tmp_path: Path) -> None:
    ws = Workspace.open(tmp_path / "store")
    tokens = [{"app_id": "app", "token": t} for t in ("T1", "T2")]
    ws.call("POST", "/users/track", {"attributes": [{"push_token_import": True, "push_tokens": tokens}]})
    ws.call("POST", "/users/track", {"attributes": [{"external_id": "u1", "push_tokens": tokens}]})
    result = runner.invoke(app, ["cleanup-push-profiles", "--store", str(tmp_path / "store")])
    assert result.exit_code == 0, result.output
    assert "deleted 2 temporary" in result.output
    assert ws.table("profiles").collect()["external_id"].to_list() == ["u1"]


def test_publish_writes_current_rows_for_outside_readers(tmp_path: Path) -> None:
    ws = Workspace.open(tmp_path / "store")
    ws.call("POST", "/users/track", {"attributes": [{"external_id": "a"}, {"external_id": "b"}]})
    ws.call("POST", "/users/track", {"attributes": [{"external_id": "a", "first_name": "Ann"}]})
    result = runner.invoke(app, ["publish", "--store", str(tmp_path / "store")])
    assert result.exit_code == 0, result.output
    said = result.output.replace("\n", "")  # rich wraps long lines
    assert "to " + str(tmp_path / "store" / "current") in said and "profiles 2" in said
    profiles = pl.read_delta(str(tmp_path / "store" / "current" / "profiles"))
    assert sorted(profiles["first_name"].to_list(), key=str) == ["Ann", None]


# --- check and repair ------------------------------------------------------------------------------
def _two_batches(store: Path) -> None:
    """Two batches of one track each: a copy at `store` of a store built once."""
    _copy_of_built(store, _track_twice).close()


def _track_twice(ws: Workspace) -> None:
    ws.call("POST", "/users/track", {"attributes": [{"external_id": "a"}]})
    ws.call("POST", "/users/track", {"attributes": [{"external_id": "b"}]})


def test_check_a_healthy_store_exits_0(tmp_path: Path) -> None:
    _two_batches(tmp_path / "store")
    result = runner.invoke(app, ["check", "--store", str(tmp_path / "store")])
    assert result.exit_code == 0, result.output
    assert "healthy; head batch 2" in result.output and "PROBLEM" not in result.output


def test_check_names_a_missing_data_file_and_repair_refuses(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _two_batches(store)
    lost = max((store / "profiles").glob("*.parquet"), key=lambda p: p.stat().st_mtime)
    lost.unlink()

    result = runner.invoke(app, ["check", "--store", str(store)])
    assert result.exit_code == 1
    assert f"PROBLEM {lost}: missing" in result.output.replace("\n", "")
    result = runner.invoke(app, ["repair", "--store", str(store), "--yes"])
    assert result.exit_code == 1 and "cannot be repaired safely" in result.stderr
    result = runner.invoke(app, ["sql", "select count(*) from profiles", "--store", str(store)])
    assert result.exit_code == 1 and lost.name in result.stderr and "Traceback" not in result.output


def test_repair_shows_its_plan_asks_and_rolls_back(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _two_batches(store)
    max((store / "_ledger" / "_delta_log").glob("*.json")).unlink()  # the newest ledger entry

    result = runner.invoke(app, ["check", "--store", str(store)])
    assert result.exit_code == 1 and "holds the ledger row of batch 2" in result.output.replace("\n", "")
    result = runner.invoke(app, ["repair", "--store", str(store)], input="n\n")
    assert result.exit_code == 1 and "discard batch 2" in result.output and "nothing was changed" in result.stderr
    assert runner.invoke(app, ["check", "--store", str(store)]).exit_code == 1
    result = runner.invoke(app, ["repair", "--store", str(store)], input="y\n")
    assert result.exit_code == 0, result.output
    assert "roll profiles back from version 2 to version 1" in result.output and "healthy" in result.output
    assert runner.invoke(app, ["repair", "--store", str(store)]).output.strip().endswith("nothing to repair")


def test_reading_commands_never_create_a_store(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    for store, message in ((tmp_path / "empty", "no store at"), (tmp_path / "file", "is a file")):
        result = runner.invoke(app, ["sql", "select 1", "--store", str(store)])
        assert result.exit_code == 1 and message in result.stderr, result.output
    assert list((tmp_path / "empty").iterdir()) == []
    result = runner.invoke(app, ["demo", "--store", str(tmp_path / "file")])
    assert result.exit_code == 1 and "is a file" in result.stderr


def test_apply_again_after_the_stored_responses_expired_says_skipped(tmp_path: Path) -> None:
    path = tmp_path / "ok.ndjson"
    path.write_bytes(orjson.dumps({"method": "POST", "path": "/users/track",
                                   "body": {"events": [{"external_id": "u", "name": "e",
                                                        "time": "2026-11-20T10:00:00Z"}]}}) + b"\n")
    store = str(tmp_path / "store")
    assert runner.invoke(app, ["apply", str(path), "--store", store]).exit_code == 0
    compacted = runner.invoke(app, ["compact", "--store", store, "--response-retention-days", "0"])
    assert compacted.exit_code == 0, compacted.output

    again = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["apply", str(path), "--store", store])

    assert again.exit_code == 0, again.output
    assert "skipped: applied at" in again.stdout
    assert Workspace.open(store).table("events").collect().height == 1
