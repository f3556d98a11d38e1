"""The `engagelake` command line: `demo`, `apply`, `export`, `sql`, `lineage`, `compact`,
`cleanup-push-profiles`, `publish`, `check`, `repair`, `forget-check`, `serve`, `keys`,
`scim-tokens`, `preference-centers`, `link-keys`.

This module builds the Typer app and registers every command and group; the commands live by
kind in `ingest` (demo, apply), `read` (export, sql, lineage), `maintain` (compact,
cleanup-push-profiles, publish, check, repair, forget-check), `serve`, `credentials` (keys,
scim-tokens), `preference_centers` and `link_keys`; `render` shows results, `common` holds the --store
option, the consoles and the error exit. Command modules never import this one.

Every command is a thin edge over `Workspace` (or, for `demo`, the `track_batch` flow, which
calls `Workspace`). Heavy modules (polars, duckdb, deltalake, prefect) are imported inside the
commands so that `engagelake --help` starts fast. Bad input ends with a red one-line message
and exit code 1, never a traceback.
"""

from __future__ import annotations

from typing import Annotated

import typer

from engagelake.cli import (
    credentials,
    emails,
    ingest,
    link_keys,
    maintain,
    preference_centers,
    read,
    serve,
    subscriptions,
)

__all__ = ["app"]

app = typer.Typer(
    name="engagelake",  # its help is the docstring of `main`
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


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


def _group(text: str) -> typer.Typer:
    """A command group: its help, and the help again when called without a command."""
    return typer.Typer(help=text, no_args_is_help=True)


# The order here is the order of `engagelake --help` (commands first, then the groups).
app.command()(ingest.demo)
app.command("apply")(ingest.apply_files)
app.command()(read.export)
app.command()(read.sql)
app.command()(read.lineage)
app.command()(maintain.compact)
app.command()(maintain.cleanup_push_profiles)
app.command()(maintain.publish)
app.command()(maintain.check)
app.command()(maintain.repair)
app.command("forget-check")(maintain.forget_check)
app.command()(serve.serve)

keys_app = _group(credentials.API_KEYS.help)
keys_app.command("create")(credentials.keys_create)
keys_app.command("list")(credentials.keys_list)
keys_app.command("revoke")(credentials.keys_revoke)
app.add_typer(keys_app, name="keys")

scim_tokens_app = _group(credentials.SCIM_TOKENS.help)
scim_tokens_app.command("create")(credentials.scim_tokens_create)
scim_tokens_app.command("list")(credentials.scim_tokens_list)
scim_tokens_app.command("revoke")(credentials.scim_tokens_revoke)
app.add_typer(scim_tokens_app, name="scim-tokens")

preference_centers_app = _group(
    "Preference centers for email recipients: create one from the default page, make a user's "
    "signed link.\n\nEach command has its own --help.\n\nExample:\n"
    "  engagelake preference-centers create-default --name main --group news=News"
)
preference_centers_app.command("create-default")(preference_centers.create_default)
preference_centers_app.command("link")(preference_centers.link)
app.add_typer(preference_centers_app, name="preference-centers")

subscriptions_app = _group(
    "Users' subscription group states: read them as GET /subscription/status/get and "
    "/subscription/user/status answer them, set them as POST /subscription/status/set does.\n\nEach command has its own --help.\n\nExample:\n"
    "  engagelake subscriptions status --group news --external-id u1"
)
subscriptions_app.command("status")(subscriptions.status)
subscriptions_app.command("user")(subscriptions.user)
subscriptions_app.command("set")(subscriptions.set_state)
app.add_typer(subscriptions_app, name="subscriptions")

emails_app = _group(
    "Addresses' global email states and the email lists, as the /email/ endpoints set and answer "
    "them.\n\nEach command has its own --help.\n\nExample:\n"
    "  engagelake emails unsubscribes --start 2026-06-01 --end 2026-07-01"
)
emails_app.command("status")(emails.status)
emails_app.command("blocklist")(emails.blocklist)
emails_app.command("unsubscribes")(emails.unsubscribes)
emails_app.command("hard-bounces")(emails.hard_bounces)
app.add_typer(emails_app, name="emails")

link_keys_app = _group(link_keys.HELP)
link_keys_app.command("rotate")(link_keys.rotate)
link_keys_app.command("retire")(link_keys.retire)
link_keys_app.command("revoke")(link_keys.revoke)
link_keys_app.command("max-lifetime")(link_keys.max_lifetime)
link_keys_app.command("list")(link_keys.list_keys)
app.add_typer(link_keys_app, name="link-keys")
