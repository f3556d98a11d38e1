"""The `engagelake` command line: `demo`, `apply`, `export`, `sql`, `lineage`, `compact`,
`cleanup-push-profiles`, `publish`, `check`, `repair`, `forget-check`, `serve`, `keys`,
`scim-tokens`.

Every command is a thin edge over `Workspace` (or, for `demo`, the `track_batch` flow, which
calls `Workspace`). Heavy modules (polars, duckdb, deltalake, prefect) are imported inside the
commands so that `engagelake --help` starts fast. Bad input ends with a red one-line message
and exit code 1, never a traceback.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from engagelake.files import AppliedFile
    from engagelake.store.forget import ForgetReport
    from engagelake.workspace import Workspace

app = typer.Typer(
    name="engagelake",  # its help is the docstring of `main`
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

DEFAULT_STORE = "data/store"
DEMO_REQUESTS = Path("data/demo/requests")
REJECTIONS_SHOWN = 5  # rejected requests `apply` prints
RESPONSE_RETENTION_DAYS = 7.0  # `compact`'s default: the store's RESPONSE_RETENTION (the CLI imports it lazily)
SAMPLE_FIELDS = [
    "external_id", "first_name", "email", "country", "language", "created_at",
    "custom_attributes", "custom_events", "purchases", "total_revenue",
]  # fmt: skip

Store = Annotated[
    str,
    typer.Option(
        "--store",
        "-s",
        help="Store location: a folder or a URI. demo, apply, serve and the create commands make a new store "
        "where the path is missing or an empty folder; no command makes one over other files.",
        envvar="ENGAGELAKE_STORE",
    ),
]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"engagelake {version('engagelake')}")
        raise typer.Exit()


@app.callback()
def main(
    _: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """engagelake: the customer-engagement REST API (/users/track, /users/export/ids, ...) as vectorized Polars/DuckDB rules over Delta Lake tables.

    Every command takes --store (default data/store, or $ENGAGELAKE_STORE) and has its own --help with an example.

    Examples:
      engagelake demo --users 1000 --objects 10000
      engagelake sql "select count(*) as users from profiles"
      engagelake lineage user-000050
    """


class SqlFormat(StrEnum):
    """What `engagelake sql` writes."""

    table = "table"
    csv = "csv"
    json = "json"
    parquet = "parquet"


class LineageFormat(StrEnum):
    """What `engagelake lineage` prints."""

    tree = "tree"
    table = "table"
    json = "json"


# --- commands ------------------------------------------------------------------------------------
@app.command()
def demo(
    users: Annotated[int, typer.Option(min=1, help="Number of distinct users.")] = 100_000,
    objects: Annotated[
        int, typer.Option(min=1, help="Attribute, event and purchase objects in all.")
    ] = 1_000_000,
    store: Store = DEFAULT_STORE,
    seed: Annotated[int, typer.Option(help="Random seed of the generated workload.")] = 7,
    requests_dir: Annotated[
        Path,
        typer.Option(
            help="Folder for the generated request files (earlier requests-*.ndjson there are replaced)."
        ),
    ] = DEMO_REQUESTS,
    per_file: Annotated[
        int, typer.Option(min=1, help="Requests per request file (one batch per file).")
    ] = 1000,
) -> None:
    """Generate a /users/track workload, apply it with Prefect flows, show results.

    The workload is written to --requests-dir as NDJSON request files and applied to --store by the track_batch flow, one batch per file; then one user in a hundred is merged into its neighbour (a merge request file beside the requests, applied by the merge_batch flow); then a summary (users, events, purchases, throughput), a sample export of 3 users and the lineage tree of one merged user are printed.

    Re-running with the same options on the same day (UTC) applies nothing twice: each file is an idempotent batch, and the summary says the files were already applied instead of showing a throughput.

    Examples:
      engagelake demo
      engagelake demo --users 1000 --objects 10000 --store /tmp/demo-store
    """
    # Progress bars instead of Prefect's console log; an explicit setting still wins.
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")  # nor the client's telemetry notice on a terminal's first run
    with _input_errors():
        from engagelake.store.delta import store_state

        if store_state(store) == "new":  # refuses a file, or a folder of other things, before any work
            _say(f"creating a new store at {store}", markup=False)
        else:
            _say(f"adding to the store at {store} (its earlier batches stay)", markup=False)
        started = datetime.now(UTC)
        applied, objects_by_file = _run_demo(users, objects, store, seed, requests_dir, per_file)
        from engagelake import Workspace

        merged = _merge_duplicates(users, store, requests_dir.parent / "merges")
        workspace = Workspace.open(store)
        _print_summary(workspace, applied, objects_by_file, _replayed(workspace, applied, started))
        _print_sample(workspace)
        if merged:
            _print_lineage(workspace, merged[0])


@app.command("apply")
def apply_files(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="Request files (.ndjson, or .parquet with columns method, path, body, query) "
            "or folders of them.",
            metavar="FILE",
            show_default=False,
        ),
    ],
    store: Store = DEFAULT_STORE,
    allow_errors: Annotated[
        bool,
        typer.Option("--allow-errors", help="Exit 0 even when some requests were rejected (4xx)."),
    ] = False,
) -> None:
    """Apply request files to the store, one atomic batch per file; print a summary.

    Each file is applied with the idempotency key "<file name>:<sha256>", so applying the same file again changes nothing and gives the same responses. Responses are written beside each file as <stem>.responses.ndjson.

    A rejected request (4xx) does not stop the others: the batch commits, the first rejections are printed, and the command exits 1 unless --allow-errors is given.

    Examples:
      engagelake apply data/demo/requests --store data/store
      engagelake apply batch-001.ndjson batch-002.parquet --allow-errors
    """
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from engagelake import IdempotentResponsesExpired, Workspace
    from engagelake.files import list_request_files, read_request_file, write_responses_file

    with _input_errors():
        paths = [p for f in files for p in (list_request_files(f) if f.is_dir() else [f])]
        if missing := [str(p) for p in paths if not p.is_file()]:
            _fail(f"no such request file: {', '.join(missing)}; check the path, or pass the folder that holds the files")
        if not paths:
            _fail(f"no .ndjson or .parquet request files in {', '.join(map(str, files))} "
                  "(*.responses.ndjson are responses, not requests)")
        workspace = Workspace.open(store)
        table = Table("file", "requests", "statuses", "non-fatal errors", "seconds")
        table.columns[0].overflow = "fold"
        rejected: list[tuple[str, int, int, str]] = []  # (file, line, status, message)
        columns = (TextColumn("Applying {task.fields[file]}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("files"), TimeElapsedColumn())
        with _progress(*columns, transient=True) as progress:
            task = progress.add_task("apply", total=len(paths), file="")
            for path in paths:
                progress.update(task, file=path.name)
                batch = read_request_file(path)
                started = time.perf_counter()
                try:
                    responses = workspace.apply(batch.iter_requests(), idempotency_key=batch.idempotency_key)
                except IdempotentResponsesExpired as done:  # applied before: nothing to do
                    table.add_row(path.name, "-", f"skipped: applied at {done.committed_at:%Y-%m-%d %H:%M:%S} UTC",
                                  "-", "-")
                    progress.advance(task)
                    continue
                applied = write_responses_file(batch, responses, seconds=time.perf_counter() - started)
                table.add_row(*_applied_row(applied))
                rejected += [(path.name, line, r.status, _message(r.body))
                             for line, r in enumerate(responses, 1) if r.status >= 400]
                progress.advance(task)
        with _stderr().status("Merging sorted runs"):  # they follow each commit, in a thread
            workspace.close()
    _console().print(table)
    for error in workspace.store.merge_errors:  # the batches are committed: a warning, not a failure
        _say(f"[yellow]warning:[/yellow] merging sorted runs failed ({_cell(error)}); nothing is lost, "
             "the next batch merges again")
    _say("Responses are beside each file as <stem>.responses.ndjson.")
    if rejected:
        shown = rejected[:REJECTIONS_SHOWN]
        _say(f"[red]{len(rejected):,} request(s) rejected[/red] (the others are committed); first {len(shown)}:")
        for name, line, status, message in shown:
            _say(f"  {name} line {line}: {status} {message}", markup=False)
        if not allow_errors:
            raise typer.Exit(1)


@app.command()
def export(
    external_id: Annotated[
        list[str] | None,
        typer.Option(
            "--external-id", "-e", help="External ID to export; repeat for more (up to 50)."
        ),
    ] = None,
    email: Annotated[
        str | None, typer.Option(help="Export the users with this email address.")
    ] = None,
    fields: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated fields_to_export, e.g. first_name,custom_attributes. Default: all."
        ),
    ] = None,
    all_users: Annotated[
        bool, typer.Option("--all", help="Export every user of the store (needs --out).")
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Write users.ndjson and users.parquet into this folder instead of printing JSON."
        ),
    ] = None,
    store: Store = DEFAULT_STORE,
) -> None:
    """Export users as /users/export/ids does: by external ID, by email, or --all.

    Without --out the API's JSON response is printed; with --out, users.ndjson and users.parquet are written (nested values as JSON text in Parquet). For more than 50 external IDs use the export_batch flow.

    Examples:
      engagelake export -e user-000042 --fields first_name,country
      engagelake export --email ines.0@mail.example.net
      engagelake export --all --out data/exports
    """
    fields_to_export = _parse_fields(fields)
    if all_users and (external_id or email):
        _fail("--all exports every user; leave out --external-id and --email, or drop --all")
    if all_users and out is None:
        _fail(
            "--all needs --out DIR: the whole store is written to DIR/users.ndjson and DIR/users.parquet"
        )
    if not all_users and not external_id and email is None:
        _fail(
            "nothing to export: give --external-id ID (repeatable), --email ADDRESS, or --all --out DIR"
        )
    with _input_errors():
        workspace = _open_existing(store)
        if all_users:
            assert out is not None
            _write_every_user(workspace, fields_to_export, out)
            return
        body = _export_ids(workspace, external_id or [], email, fields_to_export)
        if out is None:
            _console().print_json(data=body)
        else:
            _write_export(body["users"], out)


@app.command()
def sql(
    query: Annotated[
        str,
        typer.Argument(
            help="DuckDB SQL over the store's tables: profiles, external_ids, aliases, attributes, "
            "events, purchases, push_tokens, subscriptions, redirects, merges (lineage), and the "
            "resource tables.",
            metavar="QUERY",
            show_default=False,
        ),
    ],
    store: Store = DEFAULT_STORE,
    limit: Annotated[
        int, typer.Option(min=1, help="Show at most this many rows (table format; the other formats hold every row).")
    ] = 50,
    format_: Annotated[
        SqlFormat | None,
        typer.Option("--format", "-f", show_default=False,
                     help="table (the default): a table on screen, at most --limit rows; csv; json: one JSON "
                     "array of row objects; parquet (needs --out). With --out and no --format, the file's "
                     "suffix (.csv, .json, .parquet) names the format."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", show_default=False,
                     help="Write the result to this file instead of printing it (csv, json or parquet)."),
    ] = None,
) -> None:
    """Run a DuckDB SQL query over the store; print the result or write it to a file.

    The table format prints at most --limit rows; csv and json print every row, for pipes; --out writes every row to a file (parquet needs it).

    Examples:
      engagelake sql "select name, count(*) as n from events group by name"
      engagelake sql "select * from profiles" --format csv > profiles.csv
      engagelake sql "select * from purchases" --out purchases.parquet
    """
    import duckdb

    chosen = _sql_format(format_, out)
    with _input_errors():
        workspace = _open_existing(store)
        try:
            frame = workspace.sql(query)
        except duckdb.Error as error:
            hint = "; `engagelake sql --help` lists the tables" if isinstance(error, duckdb.CatalogException) else ""
            _fail(f"SQL error: {str(error).splitlines()[0]}{hint}")
        if chosen is SqlFormat.table:
            _print_frame(frame, limit)
        else:
            _write_frame(frame, chosen, out)


@app.command()
def lineage(
    identifier: Annotated[
        str,
        typer.Argument(help="The identifier whose history to show (an external ID by default).",
                       metavar="IDENTIFIER", show_default=False),
    ],
    kind: Annotated[
        str,
        typer.Option("--kind", help="What IDENTIFIER is: external_id, user_alias (as label:name), "
                     "service_id, email or phone."),
    ] = "external_id",
    store: Store = DEFAULT_STORE,
    limit: Annotated[
        int, typer.Option(min=1, help="Show at most this many rows (tree and table; json holds every row).")
    ] = 200,
    format_: Annotated[
        LineageFormat,
        typer.Option("--format", "-f", help="tree: each surviving profile with its steps, merged profiles "
                     "nested under their merge; table: one row per step; json: one JSON array of the "
                     "lineage rows, every column."),
    ] = LineageFormat.tree,
) -> None:
    """Show a user's history as a tree: merges, renames, deletes and the rest.

    Every step that touched the profiles this identifier names or named is shown (merge, identify, rename, remove, alias_new, alias_update, delete, cleanup), skipped ones with their reason; a profile merged into another is nested, with its own earlier history, under the merge that folded it in.

    Examples:
      engagelake lineage user-000050
      engagelake lineage crm:4711 --kind user_alias --format json
    """
    with _input_errors():
        workspace = _open_existing(store)
        try:
            rows = workspace.lineage(identifier, kind=kind)
        except ValueError as error:
            _fail(f"{error}: pass one with --kind")
    if format_ is LineageFormat.json:
        typer.echo(rows.write_json())
    elif rows.height == 0:
        _say(f"no lineage for {kind} {identifier!r}", markup=False)
    elif format_ is LineageFormat.table:
        from engagelake.rules.identity.lineage import describe

        _print_frame(describe(rows), limit)
    else:
        _print_lineage_tree(f"{kind} {identifier}", rows, limit)


@app.command()
def compact(
    store: Store = DEFAULT_STORE,
    response_retention_days: Annotated[
        float,
        typer.Option("--response-retention-days", min=0,
                     help="Keep the stored responses of keyed batches (for idempotent replays) this many days."),
    ] = RESPONSE_RETENTION_DAYS,
) -> None:
    """Rewrite every table to its current rows; delete files no version needs.

    After a delete, the user's data is then gone from disk. Readers opened before must reopen afterwards. Stored responses of keyed batches go too: those older than the retention window, and those of any batch that concerned a deleted user (docs/privacy.md). On a terminal a progress bar counts the tables.

    Example:
      engagelake compact --store data/store --response-retention-days 7
    """
    from datetime import timedelta

    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    columns = (TextColumn("Compacting {task.fields[table]:<30}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("tables"), TimeElapsedColumn())
    with _input_errors():
        workspace = _open_existing(store, response_retention=timedelta(days=response_retention_days))
        with _progress(*columns, transient=True) as progress:
            task = progress.add_task("compact", total=None, table="")

            def on_table(name: str, done: int, total: int) -> None:
                progress.update(task, completed=done, total=total, table=name)

            kept = workspace.compact(on_table=on_table)
    _say("compacted: " + ", ".join(f"{name} {rows:,}" for name, rows in kept.items()))


@app.command()
def cleanup_push_profiles(store: Store = DEFAULT_STORE) -> None:
    """Delete push_token_import's temporary profiles that hold no push token now.

    The specification's monthly check (the flow cleanup_push_token_profiles runs the same): anonymous profiles created by push token imports, without a push token now and without an identifier gained since, are deleted as /users/delete deletes, each with a lineage row (kind cleanup).

    Example:
      engagelake cleanup-push-profiles --store data/store
    """
    with _input_errors():
        deleted = _open_existing(store).cleanup_push_profiles()
    _say(f"deleted {deleted:,} temporary anonymous profiles without a push token")


@app.command()
def publish(
    store: Store = DEFAULT_STORE,
    out: Annotated[
        str | None,
        typer.Option("--out", "-o", help="Where to write the tables (a folder or URI); default STORE/current.",
                     show_default=False),
    ] = None,
) -> None:
    """Write every table's current rows as plain Delta tables, for other readers.

    For Spark, DuckDB's delta_scan or pl.read_delta: one row per key, no tombstones, merged users' events under the survivor. Each run replaces the last; OUT/_published.json names the batch shown.

    Examples:
      engagelake publish --store data/store
      engagelake publish --store data/store --out /srv/lake/engagelake
    """
    with _input_errors():
        workspace = _open_existing(store)
        with _stderr().status("Publishing current rows"):
            rows = workspace.publish(out)
    target = out or f"{store.rstrip('/')}/current"
    _say(f"published batch {workspace.store.head.batch_no} to {target}: "
         + ", ".join(f"{name} {n:,}" for name, n in rows.items()), markup=False)


@app.command()
def check(store: Store = DEFAULT_STORE) -> None:
    """Verify a store (a folder or an s3:// URI) against its ledger; exit 0 when healthy, 1 otherwise.

    Every table version the ledger names must exist, its Delta log entries parse, and every data file it references exist and its Parquet footer read. Prints one line per problem, notes (such as what the read caches under _footers/ hold), then what `engagelake repair` would do about it.

    Examples:
      engagelake check --store data/store
      engagelake check --store s3://lake/engagement
    """
    with _input_errors():
        from engagelake import Workspace
        from engagelake.store.check import iter_lines

        report = Workspace.check(store)
    for line in iter_lines(report):
        typer.echo(line)
    if report.repairable and not report.unrepairable():
        typer.echo(f"`engagelake repair --store {store}` would:")
        for line in report.plan():
            typer.echo(f"  {line}")
    if not report.healthy:
        raise typer.Exit(1)


@app.command()
def repair(
    store: Store = DEFAULT_STORE,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Proceed without asking.")] = False,
) -> None:
    """Undo what a dead or damaged commit left, where nothing committed is lost.

    Rolls tables back to the versions the ledger names, and moves torn log entries and lost ledger rows aside into STORE/_repaired/. Prints the plan and asks first (--yes: does not ask). Missing or unreadable files that committed data needs are not repairable: restore them from a backup.

    Examples:
      engagelake repair --store data/store
      engagelake repair --store data/store --yes
    """
    with _input_errors():
        from engagelake import Workspace
        from engagelake.store.check import iter_lines

        report = Workspace.check(store)
        if blocking := report.unrepairable():
            for line in iter_lines(report):
                typer.echo(line)
            _fail(f"{len(blocking)} problem(s) cannot be repaired safely: restore the files named from a backup; "
                  "nothing was changed")
        if not report.repairable:
            typer.echo(f"{store}: nothing to repair")
            return
        typer.echo(f"repair will, in {store}:")
        for line in report.plan():
            typer.echo(f"  {line}")
        if not yes and not typer.confirm("Proceed?", default=False):
            _fail("repair declined: nothing was changed (--yes repairs without asking)")
        Workspace.repair(store)
        after = Workspace.check(store)
    for line in iter_lines(after):
        typer.echo(line)
    if not after.healthy:
        raise typer.Exit(1)


@app.command("forget-check")
def forget_check(
    store: Store = DEFAULT_STORE,
    external_id: Annotated[str | None, typer.Option("--external-id", "-e", help="The user's external ID.")] = None,
    email: Annotated[str | None, typer.Option(help="The user's email address.")] = None,
    phone: Annotated[str | None, typer.Option(help="The user's phone number.")] = None,
    alias: Annotated[
        str | None,
        typer.Option(help="The user's alias as NAME:LABEL (split at the last colon); its name is searched for."),
    ] = None,
    value: Annotated[
        list[str] | None,
        typer.Option("--value", help="Another text to search for (repeatable): an event property, a value kept "
                     "from before the delete."),
    ] = None,
) -> None:
    """Verify a hard delete: search every file of a store (every object under its prefix on S3) for any copy of a user's data.

    Table data, files of older versions still on disk, Delta log entries and checkpoints, Parquet statistics (footer and page index), footer caches, the published current/ folder and any other file are searched, Parquet decoded. Prints each place a value occurs and each table's old versions still on disk; exits 1 when a value occurs anywhere (or a file could not be searched whole), 0 otherwise.

    Searched for: the identifier given, every --value, and while the identifier still names a profile, each string of its full export of 3 characters or more (shorter ones, such as country codes, are in other users' rows too), except its service_id (kept on purpose after a delete, in redirects and lineage: pass it with --value to see where), alias labels, app ids, platforms and times the engine wrote. Run it before the delete to see the values, then after delete and compact with them as --value: a value other users share is found in their rows too.

    Examples:
      engagelake forget-check --store data/store --external-id user-42
      engagelake forget-check --external-id user-42 --value user42@example.com
      engagelake forget-check --store s3://lake/engagement --external-id user-42
    """
    names = _parse_alias(alias) if alias is not None else None
    if external_id is None and email is None and phone is None and names is None and not value:
        _fail("nothing to look for: give --external-id, --email, --phone, --alias NAME:LABEL or --value TEXT")
    with _input_errors():
        workspace = _open_existing(store)
        with _console().status("searching every file of the store..."):
            report = workspace.forget_check(external_id=external_id, email=email, phone=phone, alias=names,
                                            values=value or ())
    _print_forget_report(report)
    if report.found:
        raise typer.Exit(1)


# --- the REST server and its credentials ------------------------------------------------------------
keys_app = typer.Typer(
    help="API keys of the REST server: create, list, revoke.\n\nEach command has its own --help.\n\nExample:\n"
    "  engagelake keys create --name ingest --permissions users.track",
    no_args_is_help=True,
)
scim_tokens_app = typer.Typer(
    help="SCIM tokens of the REST server: create, list, revoke.\n\nEach command has its own --help.\n\nExample:\n"
    "  engagelake scim-tokens create --origin https://idp.example.com",
    no_args_is_help=True,
)
preference_centers_app = typer.Typer(
    help="Preference centers for email recipients: create one from the default page, make a user's "
    "signed link.\n\nEach command has its own --help.\n\nExample:\n"
    "  engagelake preference-centers create-default --name main --group news=News",
    no_args_is_help=True,
)
app.add_typer(keys_app, name="keys")
app.add_typer(scim_tokens_app, name="scim-tokens")
app.add_typer(preference_centers_app, name="preference-centers")


@app.command()
def serve(
    store: Store = DEFAULT_STORE,
    host: Annotated[str, typer.Option(help="Interface to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port.")] = 8000,
    rate_limits: Annotated[
        str, typer.Option("--rate-limits", help="on: the specification's limits; off: none (benchmarks, trusted callers).")
    ] = "on",
    rate_limit: Annotated[
        list[str] | None,
        typer.Option("--rate-limit", metavar="NAME=REQUESTS/SECONDS",
                     help="Override one limit, e.g. --rate-limit export=500/60 (repeatable; names in docs/server.md)."),
    ] = None,
    max_body_bytes: Annotated[int, typer.Option(min=1, help="Largest request body accepted (413 beyond).")] = 10 * 1024 * 1024,
    max_queued: Annotated[int, typer.Option(min=1, help="Requests waiting to be applied before new ones get 503 "
                                                         "with Retry-After.")] = 2000,
    public_url: Annotated[
        str | None, typer.Option(help="The URL recipients reach this server at (behind a proxy: the proxy's), "
                                      "recorded in the store as the base of preference center links.")
    ] = None,
    access_log: Annotated[
        bool, typer.Option(help="Log one line per request (off: a busy server's event loop does less; the "
                                "proxy in front usually logs them).")
    ] = True,
) -> None:
    """Serve the API over HTTP: every endpoint, with keys, SCIM tokens, rate limits.

    Create a key first (engagelake keys create --name NAME --permissions all); GET /healthz answers once the server is ready. SIGTERM or Ctrl-C finishes and commits the requests in flight, then stops.

    Examples:
      engagelake serve --store data/store --port 8000
      engagelake serve --rate-limits off --host 0.0.0.0
      engagelake serve --public-url https://prefs.example.com
    """
    from engagelake.api.limits import DEFAULT_LIMITS, parse_limit

    if rate_limits not in ("on", "off"):
        _fail(f"--rate-limits takes on or off, not {rate_limits!r}")
    limits = dict(DEFAULT_LIMITS)
    for text in rate_limit or []:
        try:
            name, limit = parse_limit(text)
        except ValueError as error:
            _fail(f"--rate-limit: {error}")
        limits[name] = limit
    with _input_errors():
        import uvicorn

        from engagelake import Workspace
        from engagelake.api import create_app

        _log_to_stderr("engagelake")  # the writer's reports (INFO), beside uvicorn's own lines
        workspace = Workspace.open(store)
        if public_url is not None:
            workspace.preference_centers.set_public_url(public_url)
        app_ = create_app(workspace, rate_limits=limits if rate_limits == "on" else None,
                          max_body_bytes=max_body_bytes, max_queued=max_queued)
        uvicorn.run(app_, host=host, port=port, log_level="info", access_log=access_log)


@keys_app.command("create")
def keys_create(
    name: Annotated[str, typer.Option(help="A name for the key, unique among active keys (revoke by it).")],
    permissions: Annotated[
        str, typer.Option(help="Comma-separated permissions, e.g. users.track,users.export.ids; or all.")
    ],
    store: Store = DEFAULT_STORE,
) -> None:
    """Create an API key and print it, alone, on the last line; it is shown once.

    The store keeps only its digest. Permissions are endpoint permissions such as users.track and users.export.ids, or all.

    Examples:
      engagelake keys create --name ingest --permissions users.track
      KEY=$(engagelake keys create --name app --permissions all | tail -1)
    """
    with _input_errors():
        from engagelake import Workspace

        key = Workspace.open(store).credentials.create_key(name, permissions.split(","))
    typer.echo(f"created API key {name!r}; it is shown once, store it now:")
    typer.echo(key)


@keys_app.command("list")
def keys_list(store: Store = DEFAULT_STORE) -> None:
    """List every API key ever created: names, IDs, permissions, times; no secret.

    Revoked keys stay listed, with the time they were revoked.

    Example:
      engagelake keys list --store data/store
    """
    with _input_errors():
        keys = _open_existing(store).credentials.list_keys()
    _print_rows(keys, {"name": "name", "key ID": "key_id", "permissions": "permissions", "created": "created_at",
                       "revoked": "revoked_at"})


@keys_app.command("revoke")
def keys_revoke(
    name: Annotated[str, typer.Argument(help="The name of the key to revoke.", metavar="NAME", show_default=False)],
    store: Store = DEFAULT_STORE,
) -> None:
    """Revoke an API key by its name: a running server refuses it within a second.

    The name is the one given to keys create, as keys list shows it.

    Example:
      engagelake keys revoke ingest --store data/store
    """
    from engagelake.errors import ConfigError

    with _input_errors():
        try:
            _open_existing(store).credentials.revoke_key(name)
        except ConfigError as error:
            _fail(f"{error}; `engagelake keys list --store {store}` shows every key's name")
    _say(f"revoked API key {name!r}", markup=False)


@scim_tokens_app.command("create")
def scim_tokens_create(
    origin: Annotated[str, typer.Option(help="The caller's origin, sent as X-Request-Origin with the token.")],
    store: Store = DEFAULT_STORE,
) -> None:
    """Create a SCIM token bound to an origin; print it, alone, on the last line.

    It is shown once: the store keeps only its digest. Callers send it with the header X-Request-Origin set to the same origin.

    Example:
      engagelake scim-tokens create --origin https://idp.example.com
    """
    with _input_errors():
        from engagelake import Workspace

        token = Workspace.open(store).credentials.create_scim_token(origin)
    typer.echo(f"created SCIM token for origin {origin!r}; it is shown once, store it now:")
    typer.echo(token)


@scim_tokens_app.command("list")
def scim_tokens_list(store: Store = DEFAULT_STORE) -> None:
    """List every SCIM token ever created: IDs, origins, times; never a secret.

    Revoked tokens stay listed, with the time they were revoked.

    Example:
      engagelake scim-tokens list --store data/store
    """
    with _input_errors():
        tokens = _open_existing(store).credentials.list_scim_tokens()
    _print_rows(tokens, {"token ID": "token_id", "origin": "origin", "created": "created_at", "revoked": "revoked_at"})


@scim_tokens_app.command("revoke")
def scim_tokens_revoke(
    token_id: Annotated[str, typer.Argument(help="The token's ID (the part after els_, before the next _).",
                                            metavar="TOKEN_ID", show_default=False)],
    store: Store = DEFAULT_STORE,
) -> None:
    """Revoke a SCIM token by its ID: a running server refuses it within a second.

    The ID is the part of the token after els_ and before the next _, as scim-tokens list shows it.

    Example:
      engagelake scim-tokens revoke 086cb1ed58e6 --store data/store
    """
    from engagelake.errors import ConfigError

    with _input_errors():
        try:
            _open_existing(store).credentials.revoke_scim_token(token_id)
        except ConfigError as error:
            _fail(f"{error}; `engagelake scim-tokens list --store {store}` shows every token's ID")
    _say(f"revoked SCIM token {token_id!r}", markup=False)


@preference_centers_app.command("create-default")
def preference_centers_create_default(
    name: Annotated[str, typer.Option(help="The center's name, unique in the store (its liquid_tag names it).")],
    group: Annotated[
        list[str], typer.Option(metavar="ID=LABEL", help="A subscription group and its label on the page (repeatable, "
                                                         "in page order).")
    ],
    title: Annotated[str, typer.Option(help="The page's title and heading.")] = "Email preferences",
    store: Store = DEFAULT_STORE,
) -> None:
    """Create a preference center from the default page; print its ID, alone, on the last line.

    The page has one checkbox per group, a global unsubscribe and a save button; it needs no JavaScript and fits a phone's screen (data/preference_center/).

    Example:
      engagelake preference-centers create-default --name main --group news=News
    """
    groups: dict[str, str] = {}
    for text in group:
        group_id, sep, label = text.partition("=")
        if not sep or not group_id.strip() or not label.strip():
            _fail(f"--group takes ID=LABEL, not {text!r}")
        groups[group_id.strip()] = label.strip()
    with _input_errors():
        created = _open_existing(store).preference_centers.create_default(name, groups, title=title)
    typer.echo(f"created preference center {name!r}; its liquid_tag is {created['liquid_tag']}")
    typer.echo(created["preference_center_api_id"])


@preference_centers_app.command("link")
def preference_centers_link(
    center: Annotated[str, typer.Option(help="The center's ID or name.")],
    external_id: Annotated[str, typer.Option(help="The user's external ID.")],
    expires_in_days: Annotated[float, typer.Option(min=0.001, help="How long the link works.")] = 30,
    base_url: Annotated[str | None, typer.Option(help="The server's public URL (default: the one recorded by "
                                                      "serve --public-url).")] = None,
    store: Store = DEFAULT_STORE,
) -> None:
    """Print a user's signed link to a center's page, alone, on the last line.

    The link is the recipient's only credential: it opens the page and saves the form until it expires.

    Example:
      engagelake preference-centers link --center main --external-id u1
    """
    from datetime import timedelta

    with _input_errors():
        url = _open_existing(store).preference_centers.link(
            center, external_id, expires_in=timedelta(days=expires_in_days), base_url=base_url)
    typer.echo(url)


# --- demo steps ----------------------------------------------------------------------------------
def _run_demo(
    users: int, objects: int, store: str, seed: int, requests_dir: Path, per_file: int
) -> tuple[list[AppliedFile], dict[Path, int]]:
    """Write the workload's request files, then apply them with the track_batch flow under
    progress bars; return what applying each file gave and the objects in each file."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from engagelake.demo import count_objects, generate_workload, write_request_files

    _remove_demo_files(requests_dir)
    file_objects: list[int] = []
    columns = (
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with _progress(*columns) as progress:
        generating = progress.add_task("Generating requests", total=objects)

        def counted(requests: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
            for index, request in enumerate(requests):
                n = count_objects(request)
                if index % per_file == 0:
                    file_objects.append(0)
                file_objects[-1] += n
                progress.advance(generating, n)
                yield request

        midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        workload = generate_workload(users, objects, seed, now=midnight)
        paths = write_request_files(counted(workload), requests_dir, per_file)
        objects_by_file = dict(zip(paths, file_objects, strict=True))
        applying = progress.add_task("Applying (track_batch flow)", total=sum(file_objects))
        started = time.perf_counter()
        applied = _apply_with_flow(requests_dir, store, progress, applying, objects_by_file)
        wall = time.perf_counter() - started
    _say(f"[dim]flow wall time {wall:,.1f} s, including Prefect's start[/dim]")
    return applied, objects_by_file


def _replayed(workspace: Workspace, applied: list[AppliedFile], started: datetime) -> set[Path]:
    """The request files whose batch was committed before `started`: applying them again was
    an idempotent replay that wrote nothing."""
    from engagelake.files import read_request_file

    replayed = set()
    for file in applied:
        committed_at = workspace.batch_committed_at(read_request_file(file.path).idempotency_key)
        if committed_at is not None and committed_at < started:
            replayed.add(file.path)
    return replayed


def _apply_with_flow(
    folder: Path, store: str, progress: Progress, task: TaskID, objects_by_file: dict[Path, int]
) -> list[AppliedFile]:
    """Run the track_batch flow over `folder`, advancing `task` as each file is applied."""
    from flows.track_batch import track_batch

    def advance(applied: AppliedFile) -> None:
        progress.advance(task, objects_by_file.get(applied.path, 0))

    return track_batch(str(folder), store, on_file_applied=advance)


def _merge_duplicates(users: int, store: str, folder: Path) -> list[str]:
    """Merge user-(i+51) into user-(i+50) for every hundred users, with the merge_batch flow;
    return the external IDs kept."""
    import orjson
    from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

    from flows.track_batch import merge_batch

    pairs = [(f"user-{i + 51:06d}", f"user-{i + 50:06d}") for i in range(0, users - 51, 100)]
    if not pairs:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    updates = [{"identifier_to_merge": {"external_id": a}, "identifier_to_keep": {"external_id": b}} for a, b in pairs]
    requests = [{"method": "POST", "path": "/users/merge", "body": {"merge_updates": updates[i:i + 50]}}
                for i in range(0, len(updates), 50)]
    (folder / "merges-000.ndjson").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in requests))
    columns = (TextColumn("{task.description:<28}"), SpinnerColumn(), TimeElapsedColumn())
    with _progress(*columns) as progress:
        progress.add_task(f"Merging {len(pairs):,} duplicates (merge_batch flow)", total=None)
        merge_batch(str(folder), store)
    return [keep for _, keep in pairs]


def _print_lineage(workspace: Workspace, external_id: str) -> None:
    rows = workspace.lineage(external_id)
    _say(f"\nLineage: engagelake lineage {external_id}", markup=False)
    _print_lineage_tree(f"external_id {external_id}", rows, 10)


def _remove_demo_files(folder: Path) -> None:
    """Remove request and responses files of an earlier demo run (only `requests-*.ndjson`)."""
    if folder.is_dir():
        for path in folder.glob("requests-*.ndjson"):
            path.unlink()


def _print_summary(
    workspace: Workspace, applied: list[AppliedFile], objects_by_file: dict[Path, int], replayed: set[Path]
) -> None:
    """Users, events and purchases in the store; files, objects and apply throughput of the
    files this run applied (time spent in `Workspace.apply`, without Prefect's start-up). Files
    already applied before (a re-run over the same store) were replays: no throughput for them."""
    from rich.table import Table

    counts = workspace.sql(
        "select (select count(*) from profiles) as users, (select count(*) from events) as events, "
        "(select count(*) from purchases) as purchases"
    ).row(0, named=True)
    new = [file for file in applied if file.path not in replayed]
    objects, seconds = sum(objects_by_file.get(f.path, 0) for f in new), sum(f.seconds for f in new)
    table = Table(
        "users", "events", "purchases", "files applied", "objects", "seconds", "objects/s", title="engagelake demo"
    )
    table.add_row(
        f"{counts['users']:,}", f"{counts['events']:,}", f"{counts['purchases']:,}", f"{len(new):,}",
        f"{objects:,}", f"{seconds:,.1f}" if new else "–", f"{objects / max(seconds, 1e-9):,.0f}" if new else "–",
    )  # fmt: skip
    _console().print(table)
    if replayed:
        which = "All" if not new else f"{len(replayed):,} of the"
        _say(
            f"{which} {len(applied):,} request files were already applied to this store: an idempotent replay, "
            "nothing written again" + (", so no throughput to show" if not new else ", not counted above")
            + ". Measure with a new --store, or another --seed or --objects.")


def _print_sample(workspace: Workspace) -> None:
    """A sample export of the first three users, as the API returns them."""
    ids = workspace.sql(
        "select external_id from profiles where external_id is not null order by created_seq limit 3"
    )["external_id"].to_list()
    response = workspace.call(
        "POST", "/users/export/ids", {"external_ids": ids, "fields_to_export": SAMPLE_FIELDS}
    )
    _say(f"\nSample export: POST /users/export/ids {ids}", markup=False)
    _console().print_json(data=response.body)


# --- helpers -------------------------------------------------------------------------------------
def _log_to_stderr(name: str) -> None:
    """INFO and above of logger `name` on stderr, in uvicorn's style (uvicorn configures only its
    own loggers, so these would otherwise be dropped)."""
    import logging

    logger = logging.getLogger(name)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


@contextmanager
def _input_errors() -> Iterator[None]:
    """Turn engagelake's own errors and file errors into a red one-line message and exit 1."""
    from engagelake.errors import EngagelakeError

    try:
        yield
    except (EngagelakeError, OSError) as error:
        _fail(str(error))


def _fail(message: str) -> NoReturn:
    """Print `error: <message>` in red on stderr and exit with code 1."""
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/bold red] {escape(message)}")
    raise typer.Exit(1)


def _stderr() -> Any:
    """The stderr console: progress and status displays go there, never into piped output."""
    from rich.console import Console

    return Console(stderr=True)


def _progress(*columns: Any, transient: bool = False) -> Progress:
    """A rich progress display on stderr, shown only when stderr is a terminal (not in pipes,
    logs or tests, where a redrawn bar would garble the text)."""
    from rich.progress import Progress

    console = _stderr()
    return Progress(*columns, console=console, transient=transient, disable=not console.is_terminal)


def _say(message: str, *, markup: bool = True) -> None:
    """Print a message on stdout, unwrapped (a terminal wraps it; a pipe gets it whole)."""
    _console().print(message, markup=markup, soft_wrap=True)


def _console() -> Any:
    """The stdout console (created per call so that test runners can capture it)."""
    from rich.console import Console

    return Console()


def _open_existing(store: str, **options: Any) -> Workspace:
    """Open a store that must exist already (reading commands never create one); `options`
    go to `Workspace.open`."""
    from engagelake import Workspace

    if "://" not in store and not Path(store).exists():
        _fail(
            f"no store at {store!r}; pass --store PATH, or create one with `engagelake demo` or `engagelake apply FILE`"
        )
    return Workspace.open(store, create=False, **options)


def _parse_alias(alias: str) -> tuple[str, str]:
    """`NAME:LABEL` → `(NAME, LABEL)`, split at the last colon (a name may hold colons)."""
    name, colon, label = alias.rpartition(":")
    if not colon or not name or not label:
        _fail(f"--alias {alias!r} is not NAME:LABEL; give the alias name and label, e.g. --alias user-42:crm")
    return name, label


def _print_forget_report(report: ForgetReport) -> None:
    """Where the values occur (a table: one row per file, place and column), the retained old
    versions, the files that could not be searched whole, and a verdict."""
    from rich.table import Table

    from engagelake.store.forget import PLACES

    console = _console()
    console.print(f"searched {report.files:,} files under {_cell(report.root)} for {len(report.values)} value(s)")
    if report.profiles:  # the values a check after the delete needs: the profile is gone then
        console.print(f"the identifiers name {report.profiles} profile(s): their current values are searched too. "
                      "To check them after the delete, pass:")
        console.print(_cell(" ".join(f"--value {shlex.quote(v)}" for v in report.values)), soft_wrap=True)
    places: dict[tuple[str, str, str], tuple[list[str], list[str]]] = {}
    for o in sorted(report.occurrences, key=lambda o: (o.path, PLACES.index(o.place))):
        values, details = places.setdefault((o.path, o.place, o.column or ""), ([], []))
        values.extend(v for v in [o.value] if v not in values)
        details.extend(d for d in [o.detail] if d and d not in details)
    if places:
        table = Table("file", "place", "column", "values", "detail", title="copies found")
        table.columns[0].overflow = "fold"
        for (path, place, column), (values, details) in places.items():
            detail = ", ".join(details[:2]) + (f", ... ({len(details)} in all)" if len(details) > 2 else "")
            table.add_row(_cell(path), place, _cell(column), _cell(", ".join(values)), _cell(detail))
        console.print(table)
    if report.retained:
        table = Table("table", "version", "old data files", "old log entries",
                      title="old versions still on disk (vacuum retention)")
        table.columns[2].overflow = table.columns[3].overflow = "fold"
        for kept in report.retained:
            table.add_row(_cell(kept.table), str(kept.version), _cell("\n".join(kept.old_files) or "-"),
                          _cell("\n".join(kept.old_log_entries) or "-"))
        console.print(table)
    for line in report.notes:
        console.print(f"[dim]note: {_cell(line)}[/dim]")
    for line in report.unreadable:
        console.print(f"[bold red]not searched whole[/bold red] (raw bytes only): {_cell(line)}")
    if report.occurrences:
        found = len({o.value for o in report.occurrences})
        console.print(f"[bold red]{found} of {len(report.values)} value(s) found in {len(places)} place(s) of "
                      f"{len({o.path for o in report.occurrences})} file(s)[/bold red]")
    elif report.unreadable:
        console.print("[bold red]no copy found in the files searched, but some could not be searched whole[/bold red]")
    else:
        console.print("[bold green]no copy of any value found[/bold green]"
                      + (" (old versions are still on disk: see above)" if report.retained else ""))


def _parse_fields(fields: str | None) -> list[str] | None:
    """`a,b` → `["a", "b"]`, checked against the export field names."""
    if fields is None:
        return None
    from engagelake.rules.messages import EXPORT_FIELDS

    names = [name.strip() for name in fields.split(",") if name.strip()]
    if not names:
        _fail("--fields is empty; give comma-separated field names, e.g. --fields first_name,email")
    if unknown := [name for name in names if name not in EXPORT_FIELDS]:
        _fail(
            f"unknown field(s) {', '.join(unknown)} in --fields; valid: {', '.join(EXPORT_FIELDS)}"
        )
    return names


def _export_ids(
    workspace: Workspace, external_ids: list[str], email: str | None, fields: list[str] | None
) -> dict[str, Any]:
    """One POST /users/export/ids; its body, or a red error with the API's message."""
    from engagelake.rules.messages import EXPORT_FIELDS

    body: dict[str, Any] = {"fields_to_export": fields or list(EXPORT_FIELDS)}
    if external_ids:
        body["external_ids"] = external_ids
    if email is not None:
        body["email_address"] = email
    response = workspace.call("POST", "/users/export/ids", body)
    if response.status != 200 or response.body is None:
        _fail(
            f"/users/export/ids answered {response.status}: {(response.body or {}).get('message')}"
        )
    return response.body


def _write_every_user(workspace: Workspace, fields: list[str] | None, out: Path) -> None:
    """Stream every user into users.ndjson and users.parquet in `out`, chunk by chunk."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from engagelake.files import write_user_chunks
    from engagelake.rules.messages import EXPORT_FIELDS

    users = workspace.sql("select count(*) as n from profiles")["n"][0]
    columns = (TextColumn("Exporting every user"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())
    with _progress(*columns, transient=True) as progress:
        task = progress.add_task("export", total=users)

        def chunks() -> Iterator[list[dict[str, Any]]]:
            for chunk in workspace.iter_users(fields):
                yield chunk
                progress.advance(task, len(chunk))

        ndjson, parquet, count = write_user_chunks(chunks(), out, fields or list(EXPORT_FIELDS))
    _say(f"wrote {count:,} users to {ndjson} and {parquet}", markup=False)


def _write_export(users: list[dict[str, Any]], out: Path) -> None:
    """Write users.ndjson and users.parquet into `out` and say where."""
    from engagelake.files import write_users_files

    ndjson, parquet = write_users_files(users, out)
    _say(f"wrote {len(users):,} users to {ndjson} and {parquet}", markup=False)


def _message(body: Any) -> str:
    """A rejected response's message, for one line of the summary."""
    message = body.get("message") if isinstance(body, dict) else None
    return str(message if message is not None else body)[:200]


def _applied_row(applied: AppliedFile) -> tuple[str, ...]:
    """One summary row of an applied request file."""
    statuses = ", ".join(f"{status}×{count}" for status, count in applied.statuses.items())
    return (
        applied.path.name, f"{applied.requests:,}", statuses, f"{applied.errors:,}",
        f"{applied.seconds:.2f}",
    )  # fmt: skip


def _print_frame(frame: Any, limit: int) -> None:
    """Print a polars frame as a rich table, at most `limit` rows."""
    from rich.table import Table

    table = Table(*frame.columns)
    for row in frame.head(limit).iter_rows():
        table.add_row(*("[dim]null[/dim]" if v is None else _cell(v) for v in row))
    _console().print(table)
    if frame.height > limit:
        _say(f"[dim]… {frame.height - limit:,} more rows (--limit {limit})[/dim]")


def _sql_format(chosen: SqlFormat | None, out: Path | None) -> SqlFormat:
    """The format `engagelake sql` writes: --format, else the suffix of --out, else a table."""
    if chosen is None and out is not None:
        suffixes = {f".{f.value}": f for f in SqlFormat if f is not SqlFormat.table}
        if out.suffix.lower() not in suffixes:
            _fail(f"cannot tell the format of --out {out} from its suffix; add --format csv, json or parquet, "
                  "or name the file .csv, .json or .parquet")
        return suffixes[out.suffix.lower()]
    if chosen is SqlFormat.table and out is not None:
        _fail("--out writes a file, the table format prints to the screen: add --format csv, json or parquet")
    if chosen is SqlFormat.parquet and out is None:
        _fail("--format parquet writes a binary file: add --out PATH, e.g. --out result.parquet")
    return chosen or SqlFormat.table


def _write_frame(frame: Any, chosen: SqlFormat, out: Path | None) -> None:
    """Write a polars frame as csv, a JSON array or Parquet: to `out`, or (csv, json) to stdout."""
    if chosen is SqlFormat.csv and (nested := [n for n, t in frame.schema.items() if t.is_nested()]):
        _fail(f"csv cannot hold the nested column(s) {', '.join(nested)}; use --format json or parquet, "
              f"or turn them into text in the query, e.g. to_json({nested[0]})")
    if out is None:
        typer.echo(frame.write_csv() if chosen is SqlFormat.csv else frame.write_json(), nl=chosen is SqlFormat.json)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    {"csv": frame.write_csv, "json": frame.write_json, "parquet": frame.write_parquet}[chosen.value](out)
    _say(f"wrote {frame.height:,} rows to {out}", markup=False)


def _print_lineage_tree(title: str, rows: Any, limit: int) -> None:
    """Print lineage rows (the first `limit`) as a rich tree: each profile not merged away, its
    steps in order, and under each applied merge the merged profile's own steps."""
    from rich.markup import escape
    from rich.tree import Tree

    from engagelake.rules.identity.lineage import LineageStep, ProfileHistory, lineage_tree

    def step_text(step: LineageStep) -> str:
        text = f"[dim]{step.at:%Y-%m-%d %H:%M:%S}[/dim]  [bold]{step.kind}[/bold] {escape(step.source or '')}"
        text += f" → {escape(step.target)}" if step.target is not None else ""
        if step.merged is not None:
            text += f"  [dim](profile {step.merged.service_id[:8]} merged in)[/dim]"
        if step.outcome != "applied":
            text += f"  [yellow]{escape(step.outcome)}: {escape(step.reason or 'no reason given')}[/yellow]"
        return text

    def add_steps(branch: Tree, history: ProfileHistory) -> None:
        for step in history.steps:
            node = branch.add(step_text(step))
            if step.merged is not None:
                add_steps(node, step.merged)

    roots, loose = lineage_tree(rows.head(limit))
    tree = Tree(f"[bold]{escape(title)}[/bold]: {rows.height:,} lineage row(s)")
    for root in roots:
        state = "[red]deleted[/red]" if root.deleted else "[green]live[/green]"
        add_steps(tree.add(f"profile {root.service_id[:8]} ({state})"), root)
    if loose:
        branch = tree.add("[dim]steps that resolved to no profile[/dim]")
        for step in loose:
            branch.add(step_text(step))
    _console().print(tree)
    if rows.height > limit:
        _say(f"[dim]… {rows.height - limit:,} more rows (--limit {limit})[/dim]")


def _print_rows(rows: list[dict[str, Any]], columns: dict[str, str]) -> None:
    """A table of `rows`, one column per header -> field (lists joined, times to the second,
    nulls blank)."""
    from rich.table import Table

    def text(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, list):
            return ", ".join(map(_cell, value))
        if isinstance(value, datetime):
            return value.strftime("%Y-%m-%d %H:%M:%S %Z")
        return _cell(value)

    table = Table(*columns)
    for row in rows:
        table.add_row(*(text(row[field]) for field in columns.values()))
    _console().print(table)


def _cell(value: Any) -> str:
    """A table cell: the value's text, with rich markup escaped."""
    from rich.markup import escape

    return escape(str(value))
