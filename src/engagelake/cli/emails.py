"""`engagelake emails`: addresses' global email states and the email lists, as the hosted
API's `/email/` endpoints set and answer them (`ws.emails`)."""

from __future__ import annotations

from typing import Annotated

import typer

from engagelake.cli.common import DEFAULT_STORE, Store, fail, input_errors, open_existing

Emails = Annotated[list[str], typer.Option("--email", help="An email address (repeatable, at most 50).")]
Start = Annotated[str | None, typer.Option("--start", help="First day, YYYY-MM-DD (midnight UTC).")]
End = Annotated[str | None, typer.Option("--end", help="The day the range ends before, YYYY-MM-DD.")]
One = Annotated[str | None, typer.Option("--email", help="One address instead of a date range.")]


def status(
    state: Annotated[str, typer.Option(help="subscribed, unsubscribed or opted_in.")],
    email: Emails,
    store: Store = DEFAULT_STORE,
) -> None:
    """Set the global email state of addresses and of every user holding them (POST /email/status).

    An address nobody holds keeps its state for itself. Prints `EMAIL<TAB>STATE` per address.

    Example:
      engagelake emails status --state unsubscribed --email ada@example.com
    """
    with input_errors():
        open_existing(store).emails.set_status(email, state)
    for address in email:
        typer.echo(f"{address}\t{state}")


def blocklist(email: Emails, store: Store = DEFAULT_STORE) -> None:
    """Unsubscribe addresses and mark them hard-bounced (POST /email/blocklist).

    Every user holding an address is unsubscribed too. Prints `EMAIL<TAB>blocklisted` per address.

    Example:
      engagelake emails blocklist --email trap@example.com
    """
    with input_errors():
        open_existing(store).emails.blocklist(email)
    for address in email:
        typer.echo(f"{address}\tblocklisted")


def unsubscribes(start: Start = None, end: End = None, email: One = None, store: Store = DEFAULT_STORE) -> None:
    """Print the unsubscribed addresses, newest first: `EMAIL<TAB>UNSUBSCRIBED_AT` each.

    Give a range (--start and --end: --end's own day is left out) or one --email.

    Example:
      engagelake emails unsubscribes --start 2026-06-01 --end 2026-07-01
    """
    if email is None and (start is None or end is None):
        fail("give --start and --end (YYYY-MM-DD), or --email")
    with input_errors():
        listed = open_existing(store).emails.unsubscribes(start, end, email=email)
    for row in listed:
        typer.echo(f"{row['email']}\t{row['unsubscribed_at']}")


def hard_bounces(start: Start = None, end: End = None, email: One = None, store: Store = DEFAULT_STORE) -> None:
    """Print the hard-bounced addresses, newest first: `EMAIL<TAB>HARD_BOUNCED_AT` each.

    Give a range (--start and --end: --end's own day is left out) or one --email.

    Example:
      engagelake emails hard-bounces --start 2026-06-01 --end 2026-07-01
    """
    if email is None and (start is None or end is None):
        fail("give --start and --end (YYYY-MM-DD), or --email")
    with input_errors():
        listed = open_existing(store).emails.hard_bounces(start, end, email=email)
    for row in listed:
        typer.echo(f"{row['email']}\t{row['hard_bounced_at']}")
