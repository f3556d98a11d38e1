"""The REST server's credentials: `engagelake keys` (API keys) and `engagelake scim-tokens`.

Both groups create a secret and print it once, list every one ever created, and revoke one; a
`Credential` holds what differs between them, and its methods are the commands' shared bodies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from engagelake.cli.common import DEFAULT_STORE, Store, fail, input_errors, open_existing, say
from engagelake.cli.render import print_rows

if TYPE_CHECKING:
    from engagelake.resources.credentials import Credentials


@dataclass(frozen=True)
class Credential:
    """One kind of server credential, as its command group shows it."""

    command: str  # the group's name: `engagelake <command> create|list|revoke`
    noun: str  # one of them, in messages: "API key"
    plural: str  # the group's help starts with it: "API keys"
    example: str  # the group's example
    columns: dict[str, str]  # `list`'s table: header -> field
    named_by: str  # what `list` shows to revoke one by: "key's name"
    rows_of: Callable[[Credentials], list[dict[str, Any]]]
    revoke_in: Callable[[Credentials, str], object]

    @property
    def help(self) -> str:
        """The group's help."""
        return (f"{self.plural} of the REST server: create, list, revoke.\n\nEach command has its own --help."
                f"\n\nExample:\n  {self.example}")

    def create(self, store: str, what: str, make: Callable[[Credentials], str]) -> None:
        """Make a secret (`what` names it in the message) in the store, created when missing;
        print it, alone, on the last line."""
        with input_errors():
            from engagelake import Workspace

            secret = make(Workspace.open(store).credentials)
        typer.echo(f"created {self.noun} {what}; it is shown once, store it now:")
        typer.echo(secret)

    def print_all(self, store: str) -> None:
        """A table of every one ever created, without a secret."""
        with input_errors():
            rows = self.rows_of(open_existing(store).credentials)
        print_rows(rows, self.columns)

    def revoke(self, store: str, handle: str) -> None:
        """Revoke the one `handle` names; an unknown handle says how to list them."""
        from engagelake.errors import ConfigError

        with input_errors():
            try:
                self.revoke_in(open_existing(store).credentials, handle)
            except ConfigError as error:
                fail(f"{error}; `engagelake {self.command} list --store {store}` shows every {self.named_by}")
        say(f"revoked {self.noun} {handle!r}", markup=False)


API_KEYS = Credential(
    command="keys", noun="API key", plural="API keys",
    example="engagelake keys create --name ingest --permissions users.track",
    columns={"name": "name", "key ID": "key_id", "permissions": "permissions", "created": "created_at",
             "revoked": "revoked_at"},
    named_by="key's name",
    rows_of=lambda credentials: credentials.list_keys(),
    revoke_in=lambda credentials, name: credentials.revoke_key(name),
)
SCIM_TOKENS = Credential(
    command="scim-tokens", noun="SCIM token", plural="SCIM tokens",
    example="engagelake scim-tokens create --origin https://idp.example.com",
    columns={"token ID": "token_id", "origin": "origin", "created": "created_at", "revoked": "revoked_at"},
    named_by="token's ID",
    rows_of=lambda credentials: credentials.list_scim_tokens(),
    revoke_in=lambda credentials, token_id: credentials.revoke_scim_token(token_id),
)


# --- engagelake keys ------------------------------------------------------------------------------
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
    API_KEYS.create(store, repr(name), lambda credentials: credentials.create_key(name, permissions.split(",")))


def keys_list(store: Store = DEFAULT_STORE) -> None:
    """List every API key ever created: names, IDs, permissions, times; no secret.

    Revoked keys stay listed, with the time they were revoked.

    Example:
      engagelake keys list --store data/store
    """
    API_KEYS.print_all(store)


def keys_revoke(
    name: Annotated[str, typer.Argument(help="The name of the key to revoke.", metavar="NAME", show_default=False)],
    store: Store = DEFAULT_STORE,
) -> None:
    """Revoke an API key by its name: a running server refuses it within a second.

    The name is the one given to keys create, as keys list shows it.

    Example:
      engagelake keys revoke ingest --store data/store
    """
    API_KEYS.revoke(store, name)


# --- engagelake scim-tokens -----------------------------------------------------------------------
def scim_tokens_create(
    origin: Annotated[str, typer.Option(help="The caller's origin, sent as X-Request-Origin with the token.")],
    store: Store = DEFAULT_STORE,
) -> None:
    """Create a SCIM token bound to an origin; print it, alone, on the last line.

    It is shown once: the store keeps only its digest. Callers send it with the header X-Request-Origin set to the same origin.

    Example:
      engagelake scim-tokens create --origin https://idp.example.com
    """
    SCIM_TOKENS.create(store, f"for origin {origin!r}", lambda credentials: credentials.create_scim_token(origin))


def scim_tokens_list(store: Store = DEFAULT_STORE) -> None:
    """List every SCIM token ever created: IDs, origins, times; never a secret.

    Revoked tokens stay listed, with the time they were revoked.

    Example:
      engagelake scim-tokens list --store data/store
    """
    SCIM_TOKENS.print_all(store)


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
    SCIM_TOKENS.revoke(store, token_id)
