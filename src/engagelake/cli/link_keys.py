"""`engagelake link-keys`: the keys that sign recipients' preference links (`link_keys.py`).

`rotate` makes a new signing key (the older ones still verify what they signed), `retire` stops
a key verifying, `revoke` refuses every link issued before now, `max-lifetime` bounds how long a
link may work, and `list` shows the ring without a secret.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from engagelake.cli.common import DEFAULT_STORE, Store, cell, fail, input_errors, open_existing, say
from engagelake.cli.render import print_rows

if TYPE_CHECKING:
    from engagelake.link_keys import LinkKeys

HELP = ("The keys that sign recipients' preference links: rotate, retire, revoke, max-lifetime, list.\n\n"
        "They live in <store>/_secrets/link-keys.json (owner-only) unless --link-keys or $ENGAGELAKE_LINK_KEYS "
        "names another file (required for a store on object storage). Each command has its own --help."
        "\n\nExample:\n  engagelake link-keys rotate --store data/store")

KeyFile = Annotated[
    str | None,
    typer.Option("--link-keys", envvar="ENGAGELAKE_LINK_KEYS", show_default=False,
                 help="The key file (default: the store's _secrets/link-keys.json; a store on object storage "
                      "needs one). Every process of the store must be given the same."),
]


def _keys(store: str, key_file: str | None) -> LinkKeys:
    return open_existing(store, link_keys=key_file).link_keys


def rotate(
    retire_others: Annotated[
        bool, typer.Option(help="Retire every older key too: the links they signed stop working (a key that "
                                "leaked, a copy of the store that went astray).")
    ] = False,
    store: Store = DEFAULT_STORE,
    key_file: KeyFile = None,
) -> None:
    """Make a new key that signs every link from now on; print its ID on the last line.

    Links signed by the older keys keep working until they expire, or until their key is retired (engagelake link-keys retire ID, or --retire-others). A running server uses the new key at its next request.

    Examples:
      engagelake link-keys rotate --store data/store
      engagelake link-keys rotate --retire-others --store data/store
    """
    with input_errors():
        keys = _keys(store, key_file)
        key = keys.rotate(retire_others=retire_others)
    say(f"new link key {key.id} signs from now on, in {keys.path}"
        + ("; every older key is retired" if retire_others else ""), markup=False)
    typer.echo(key.id)


def retire(
    key_id: Annotated[str, typer.Argument(help="The key's ID, as link-keys list shows it.", metavar="KEY_ID",
                                          show_default=False)],
    store: Store = DEFAULT_STORE,
    key_file: KeyFile = None,
) -> None:
    """Retire a key: every link it signed stops working at once.

    The key that signs new links cannot be retired: rotate first.

    Example:
      engagelake link-keys retire 3f9c2a71 --store data/store
    """
    from engagelake.errors import ConfigError

    with input_errors():
        try:
            _keys(store, key_file).retire(key_id)
        except ConfigError as error:
            fail(str(error))
    say(f"retired link key {key_id!r}: the links it signed no longer work", markup=False)


def revoke(store: Store = DEFAULT_STORE, key_file: KeyFile = None) -> None:
    """Revoke every link issued before now, whatever key signed it; links made afterwards work.

    The keys stay: after a key leaked, rotate with --retire-others instead (a key that leaked can sign links that look new).

    Example:
      engagelake link-keys revoke --store data/store
    """
    with input_errors():
        epoch = _keys(store, key_file).revoke()
    say(f"every link issued before {epoch:%Y-%m-%d %H:%M:%S %Z} is refused from now on", markup=False)


def max_lifetime(
    days: Annotated[float, typer.Argument(help="The longest a link may work, in days (1 hour to 366 days).",
                                          metavar="DAYS", show_default=False)],
    store: Store = DEFAULT_STORE,
    key_file: KeyFile = None,
) -> None:
    """Set the longest a link may work: longer links are refused when made, and when used.

    The default is 90 days. Lowering it also refuses the links already sent that were made to work longer.

    Example:
      engagelake link-keys max-lifetime 30 --store data/store
    """
    from datetime import timedelta

    with input_errors():
        lifetime = _keys(store, key_file).set_max_lifetime(timedelta(days=days))
    say(f"links may work {lifetime / timedelta(days=1):g} days at most", markup=False)


def list_keys(store: Store = DEFAULT_STORE, key_file: KeyFile = None) -> None:
    """List the link keys (IDs and times, never a secret), the revocation time and the longest link life.

    The newest key not retired signs new links; every key not retired checks the links it signed.

    Example:
      engagelake link-keys list --store data/store
    """
    from datetime import timedelta

    from engagelake.link_keys import readable_by_others

    with input_errors():
        keys = _keys(store, key_file)
        ring = keys.ring()
    assert keys.path is not None  # `ring` raised otherwise
    signing = ring.signing
    rows = [{"id": k.id, "created": k.created, "retired": k.retired,
             "use": "signs and checks" if k is signing else ("checks" if k.retired is None else "retired")}
            for k in ring.keys]
    say(f"link keys of {store}: {keys.path}", markup=False)
    if rows:
        print_rows(rows, {"key ID": "id", "use": "use", "created": "created", "retired": "retired"})
    else:
        say("no key yet: the first link made (or link-keys rotate) makes one", markup=False)
    revoked = ("no link was revoked" if ring.revoked_before is None
               else f"links issued before {ring.revoked_before:%Y-%m-%d %H:%M:%S %Z} are refused")
    say(f"{revoked}; a link works {ring.max_lifetime / timedelta(days=1):g} days at most", markup=False)
    if readable_by_others(keys.path):
        say(f"[bold yellow]warning:[/bold yellow] {cell(keys.path)} can be read by other users: chmod 600 it, and "
            "rotate with --retire-others if someone else may have read it")
