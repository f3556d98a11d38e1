"""The commands that keep a store healthy and lean: `compact`, `cleanup-push-profiles`,
`publish`, `check`, `repair` and `forget-check` (is a deleted user's data gone from disk?)."""

from __future__ import annotations

from typing import Annotated

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
    stderr,
)
from engagelake.cli.render import print_forget_report

RESPONSE_RETENTION_DAYS = 7.0  # `compact`'s default: the store's RESPONSE_RETENTION (the CLI imports it lazily)


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
    with input_errors():
        workspace = open_existing(store, response_retention=timedelta(days=response_retention_days))
        with progress(*columns, transient=True) as bar:
            task = bar.add_task("compact", total=None, table="")

            def on_table(name: str, done: int, total: int) -> None:
                bar.update(task, completed=done, total=total, table=name)

            kept = workspace.compact(on_table=on_table)
    say("compacted: " + ", ".join(f"{name} {rows:,}" for name, rows in kept.items()))


def cleanup_push_profiles(store: Store = DEFAULT_STORE) -> None:
    """Delete push_token_import's temporary profiles that hold no push token now.

    The specification's monthly check (the flow cleanup_push_token_profiles runs the same): anonymous profiles created by push token imports, without a push token now and without an identifier gained since, are deleted as /users/delete deletes, each with a lineage row (kind cleanup).

    Example:
      engagelake cleanup-push-profiles --store data/store
    """
    with input_errors():
        deleted = open_existing(store).cleanup_push_profiles()
    say(f"deleted {deleted:,} temporary anonymous profiles without a push token")


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
    with input_errors():
        workspace = open_existing(store)
        with stderr().status("Publishing current rows"):
            rows = workspace.publish(out)
    target = out or f"{store.rstrip('/')}/current"
    say(f"published batch {workspace.store.head.batch_no} to {target}: "
        + ", ".join(f"{name} {n:,}" for name, n in rows.items()), markup=False)


def check(
    store: Store = DEFAULT_STORE,
    deep: Annotated[bool, typer.Option("--deep", help="Decode every data page too, not only each file's footer: "
                                       "finds a page damaged under a sound footer, and reads the whole store.")] = False,
) -> None:
    """Verify a store (a folder or an s3:// URI) against its ledger; exit 0 when healthy, 1 otherwise.

    Every table version the ledger names must exist, its Delta log entries parse, and every data file it references exist and its Parquet footer read (with --deep: every page decode). Prints one line per problem, notes (such as what the read caches under _footers/ hold), then what `engagelake repair` would do about it.

    Examples:
      engagelake check --store data/store
      engagelake check --deep --store data/store
      engagelake check --store s3://lake/engagement
    """
    with input_errors():
        from engagelake import Workspace

        report = Workspace.check(store, deep=deep)
    for line in Workspace.check_lines(report):
        typer.echo(line)
    if report.repairable and not report.unrepairable():
        typer.echo(f"`engagelake repair --store {store}` would:")
        for line in report.plan():
            typer.echo(f"  {line}")
    if not report.healthy:
        raise typer.Exit(1)


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
    with input_errors():
        from engagelake import Workspace

        report = Workspace.check(store)
        if blocking := report.unrepairable():
            for line in Workspace.check_lines(report):
                typer.echo(line)
            fail(f"{len(blocking)} problem(s) cannot be repaired safely: restore the files named from a backup; "
                 "nothing was changed")
        if not report.repairable:
            typer.echo(f"{store}: nothing to repair")
            return
        typer.echo(f"repair will, in {store}:")
        for line in report.plan():
            typer.echo(f"  {line}")
        if not yes and not typer.confirm("Proceed?", default=False):
            fail("repair declined: nothing was changed (--yes repairs without asking)")
        Workspace.repair(store)
        after = Workspace.check(store)
    for line in Workspace.check_lines(after):
        typer.echo(line)
    if not after.healthy:
        raise typer.Exit(1)


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
        fail("nothing to look for: give --external-id, --email, --phone, --alias NAME:LABEL or --value TEXT")
    with input_errors():
        workspace = open_existing(store)
        with console().status("searching every file of the store..."):
            report = workspace.forget_check(external_id=external_id, email=email, phone=phone, alias=names,
                                            values=value or ())
    print_forget_report(report)
    if report.found:
        raise typer.Exit(1)


def _parse_alias(alias: str) -> tuple[str, str]:
    """`NAME:LABEL` → `(NAME, LABEL)`, split at the last colon (a name may hold colons)."""
    name, colon, label = alias.rpartition(":")
    if not colon or not name or not label:
        fail(f"--alias {alias!r} is not NAME:LABEL; give the alias name and label, e.g. --alias user-42:crm")
    return name, label
