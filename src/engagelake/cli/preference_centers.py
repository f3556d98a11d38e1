"""`engagelake preference-centers`: a center made from the default page, and a user's signed
link to it."""

from __future__ import annotations

from typing import Annotated

import typer

from engagelake.cli.common import DEFAULT_STORE, Store, fail, input_errors, open_existing


def create_default(
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
            fail(f"--group takes ID=LABEL, not {text!r}")
        groups[group_id.strip()] = label.strip()
    with input_errors():
        created = open_existing(store).preference_centers.create_default(name, groups, title=title)
    typer.echo(f"created preference center {name!r}; its liquid_tag is {created['liquid_tag']}")
    typer.echo(created["preference_center_api_id"])


def link(
    center: Annotated[str, typer.Option(help="The center's ID or name.")],
    external_id: Annotated[str, typer.Option(help="The user's external ID.")],
    expires_in_days: Annotated[
        float | None, typer.Option(min=0.001, show_default=False,
                                   help="How long the link works, in days (default 30, or the store's longest link "
                                        "life when shorter: engagelake link-keys max-lifetime).")
    ] = None,
    base_url: Annotated[str | None, typer.Option(help="The server's public URL (default: the one recorded by "
                                                      "serve --public-url).")] = None,
    store: Store = DEFAULT_STORE,
) -> None:
    """Print a user's signed link to a center's page, alone, on the last line.

    The link is the recipient's only credential: it opens the page and saves the form until it expires. It is signed with the store's link keys (engagelake link-keys list): set $ENGAGELAKE_LINK_KEYS to the server's key file when the store is on object storage.

    Example:
      engagelake preference-centers link --center main --external-id u1
    """
    from datetime import timedelta

    with input_errors():
        url = open_existing(store).preference_centers.link(
            center, external_id, expires_in=None if expires_in_days is None else timedelta(days=expires_in_days),
            base_url=base_url)
    typer.echo(url)
