"""`engagelake subscriptions`: users' subscription group states, as the hosted API's reads
answer them (`GET /subscription/status/get`, `GET /subscription/user/status`) and its write sets
them (`POST /subscription/status/set`)."""

from __future__ import annotations

from typing import Annotated

import typer

from engagelake.cli.common import DEFAULT_STORE, Store, fail, input_errors, open_existing

ExternalIds = Annotated[list[str] | None, typer.Option("--external-id", help="A user's external ID (repeatable).")]
Emails = Annotated[list[str] | None, typer.Option("--email", help="An email address (repeatable).")]
Phones = Annotated[list[str] | None, typer.Option("--phone", help="A phone number, E.164 (repeatable).")]


def status(
    group: Annotated[str, typer.Option(help="The subscription group's ID.")],
    external_id: ExternalIds = None,
    email: Emails = None,
    phone: Phones = None,
    store: Store = DEFAULT_STORE,
) -> None:
    """Print each user's state in one group: a line `IDENTIFIER<TAB>STATE` each (Subscribed, Unsubscribed, Unknown).

    Give external IDs, or emails, or phones (at most 50 of a kind); with external IDs the others are not looked up.

    Example:
      engagelake subscriptions status --group news --external-id u1
    """
    if not (external_id or email or phone):
        fail("give at least one user: --external-id, --email or --phone")
    with input_errors():
        states = open_existing(store).subscriptions.status(group, external_ids=external_id or [], emails=email or [],
                                                           phones=phone or [])
    for identifier, state in states.items():
        typer.echo(f"{identifier}\t{state}")


def user(
    external_id: ExternalIds = None,
    email: Emails = None,
    phone: Phones = None,
    store: Store = DEFAULT_STORE,
) -> None:
    """Print the groups of each user: a line `EXTERNAL_ID<TAB>EMAIL<TAB>GROUP<TAB>STATE` per group (- for none).

    A user with no recorded state prints one line with - for the group and state.

    Example:
      engagelake subscriptions user --email ada@example.com
    """
    if not (external_id or email or phone):
        fail("give at least one user: --external-id, --email or --phone")
    with input_errors():
        users = open_existing(store).subscriptions.of_users(external_ids=external_id or [], emails=email or [],
                                                            phones=phone or [])
    for found in users:
        who = f"{found['external_id'] or '-'}\t{found['email'] or '-'}"
        for group in found["subscription_groups"] or [{"subscription_group_id": "-", "subscription_status": "-"}]:
            typer.echo(f"{who}\t{group['subscription_group_id']}\t{group['subscription_status']}")


def set_state(
    group: Annotated[str, typer.Option(help="The subscription group's ID.")],
    state: Annotated[str, typer.Option(help="subscribed or unsubscribed.")],
    external_id: ExternalIds = None,
    email: Emails = None,
    phone: Phones = None,
    store: Store = DEFAULT_STORE,
) -> None:
    """Set one group's state for the users named, as POST /subscription/status/set does.

    Give external IDs, and emails or phones (at most 50 of a kind). Unknown users are not created.

    Example:
      engagelake subscriptions set --group news --state subscribed --email a@b.co
    """
    if not (external_id or email or phone):
        fail("give at least one user: --external-id, --email or --phone")
    with input_errors():
        open_existing(store).subscriptions.set(group, state, external_ids=external_id or [], emails=email or [],
                                               phones=phone or [])
    typer.echo(f"{group}: {state}")
