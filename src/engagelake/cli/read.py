"""The commands that read a store and write nothing to it: `export`, `sql`, `lineage`."""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from engagelake.cli.common import (
    DEFAULT_STORE,
    Store,
    console,
    fail,
    input_errors,
    open_existing,
    progress,
    say,
)
from engagelake.cli.render import print_frame, print_lineage_tree

if TYPE_CHECKING:
    from engagelake.workspace import Workspace


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
        fail("--all exports every user; leave out --external-id and --email, or drop --all")
    if all_users and out is None:
        fail(
            "--all needs --out DIR: the whole store is written to DIR/users.ndjson and DIR/users.parquet"
        )
    if not all_users and not external_id and email is None:
        fail(
            "nothing to export: give --external-id ID (repeatable), --email ADDRESS, or --all --out DIR"
        )
    with input_errors():
        workspace = open_existing(store)
        if all_users:
            assert out is not None
            _write_every_user(workspace, fields_to_export, out)
            return
        body = _export_ids(workspace, external_id or [], email, fields_to_export)
        if out is None:
            console().print_json(data=body)
        else:
            _write_export(body["users"], out)


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
    with input_errors():
        workspace = open_existing(store)
        try:
            frame = workspace.sql(query)
        except duckdb.Error as error:
            hint = "; `engagelake sql --help` lists the tables" if isinstance(error, duckdb.CatalogException) else ""
            fail(f"SQL error: {str(error).splitlines()[0]}{hint}")
        if chosen is SqlFormat.table:
            print_frame(frame, limit)
        else:
            _write_frame(frame, chosen, out)


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
    with input_errors():
        workspace = open_existing(store)
        try:
            rows = workspace.lineage(identifier, kind=kind)
        except ValueError as error:
            fail(f"{error}: pass one with --kind")
    if format_ is LineageFormat.json:
        typer.echo(rows.write_json())
    elif rows.height == 0:
        say(f"no lineage for {kind} {identifier!r}", markup=False)
    elif format_ is LineageFormat.table:
        from engagelake.rules.identity.lineage import describe

        print_frame(describe(rows), limit)
    else:
        print_lineage_tree(f"{kind} {identifier}", rows, limit)


# --- export ---------------------------------------------------------------------------------------
def _parse_fields(fields: str | None) -> list[str] | None:
    """`a,b` → `["a", "b"]`, checked against the export field names."""
    if fields is None:
        return None
    from engagelake.rules.messages import EXPORT_FIELDS

    names = [name.strip() for name in fields.split(",") if name.strip()]
    if not names:
        fail("--fields is empty; give comma-separated field names, e.g. --fields first_name,email")
    if unknown := [name for name in names if name not in EXPORT_FIELDS]:
        fail(
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
        fail(
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
    with progress(*columns, transient=True) as bar:
        task = bar.add_task("export", total=users)

        def chunks() -> Iterator[list[dict[str, Any]]]:
            for chunk in workspace.iter_users(fields):
                yield chunk
                bar.advance(task, len(chunk))

        ndjson, parquet, count = write_user_chunks(chunks(), out, fields or list(EXPORT_FIELDS))
    say(f"wrote {count:,} users to {ndjson} and {parquet}", markup=False)


def _write_export(users: list[dict[str, Any]], out: Path) -> None:
    """Write users.ndjson and users.parquet into `out` and say where."""
    from engagelake.files import write_users_files

    ndjson, parquet = write_users_files(users, out)
    say(f"wrote {len(users):,} users to {ndjson} and {parquet}", markup=False)


# --- sql ------------------------------------------------------------------------------------------
def _sql_format(chosen: SqlFormat | None, out: Path | None) -> SqlFormat:
    """The format `engagelake sql` writes: --format, else the suffix of --out, else a table."""
    if chosen is None and out is not None:
        suffixes = {f".{f.value}": f for f in SqlFormat if f is not SqlFormat.table}
        if out.suffix.lower() not in suffixes:
            fail(f"cannot tell the format of --out {out} from its suffix; add --format csv, json or parquet, "
                 "or name the file .csv, .json or .parquet")
        return suffixes[out.suffix.lower()]
    if chosen is SqlFormat.table and out is not None:
        fail("--out writes a file, the table format prints to the screen: add --format csv, json or parquet")
    if chosen is SqlFormat.parquet and out is None:
        fail("--format parquet writes a binary file: add --out PATH, e.g. --out result.parquet")
    return chosen or SqlFormat.table


def _write_frame(frame: Any, chosen: SqlFormat, out: Path | None) -> None:
    """Write a polars frame as csv, a JSON array or Parquet: to `out`, or (csv, json) to stdout."""
    if chosen is SqlFormat.csv and (nested := [n for n, t in frame.schema.items() if t.is_nested()]):
        fail(f"csv cannot hold the nested column(s) {', '.join(nested)}; use --format json or parquet, "
             f"or turn them into text in the query, e.g. to_json({nested[0]})")
    if out is None:
        typer.echo(frame.write_csv() if chosen is SqlFormat.csv else frame.write_json(), nl=chosen is SqlFormat.json)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    {"csv": frame.write_csv, "json": frame.write_json, "parquet": frame.write_parquet}[chosen.value](out)
    say(f"wrote {frame.height:,} rows to {out}", markup=False)
