"""API keys and SCIM tokens of the REST server: created, listed and revoked through the
workspace (`ws.credentials`), checked by the server against what the store holds.

A key reads `elk_<key_id>_<secret>` and a SCIM token `els_<token_id>_<secret>`: the ID finds
the row, and the secret's SHA-256 digest is compared with the stored one in constant time.
Secrets are 256 random bits, shown once, when created; the store keeps only digests.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
import polars as pl

from engagelake.errors import ConfigError
from engagelake.permissions import ALL, check_permissions
from engagelake.routing import Client, Context
from engagelake.rules.state import Changes

T = TypeVar("T")
KEY_PREFIX = "elk"
TOKEN_PREFIX = "els"


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _new(prefix: str) -> tuple[str, str, str]:
    """(id, secret, the whole credential)."""
    ident, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    return ident, secret, f"{prefix}_{ident}_{secret}"


def _split(presented: str, prefix: str) -> tuple[str, str] | None:
    parts = presented.split("_", 2)
    if len(parts) != 3 or parts[0] != prefix or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    name: str
    permissions: frozenset[str]

    def allows(self, permission: str) -> bool:
        return ALL in self.permissions or permission in self.permissions


class KeyRing:
    """The active credentials of a store, as the server checks them."""

    def __init__(self, api_keys: pl.DataFrame, scim_tokens: pl.DataFrame):
        active_keys = api_keys.filter(pl.col("revoked_at").is_null())
        self._keys = {r["key_id"]: (r["secret_sha256"], ApiKey(r["key_id"], r["name"],
                                                                  frozenset(orjson.loads(r["permissions"]))))
                      for r in active_keys.iter_rows(named=True)}
        active_tokens = scim_tokens.filter(pl.col("revoked_at").is_null())
        self._tokens = {r["token_id"]: (r["secret_sha256"], r["origin"]) for r in active_tokens.iter_rows(named=True)}

    def api_key(self, presented: str) -> ApiKey | None:
        """The active key `presented` is, or None."""
        return _check(self._keys, presented, KEY_PREFIX)

    def scim_token(self, presented: str) -> str | None:
        """The origin an active SCIM token `presented` is bound to, or None."""
        return _check(self._tokens, presented, TOKEN_PREFIX)


def _check(active: dict[str, tuple[str, T]], presented: str, prefix: str) -> T | None:
    """What `active` holds for the credential `presented` (by its ID), when its secret's digest
    matches; one digest comparison either way, so timing tells nothing."""
    split = _split(presented, prefix)
    found = active.get(split[0]) if split else None
    if split is None or found is None:
        hmac.compare_digest(_digest(presented), "0" * 64)
        return None
    digest, value = found
    return value if hmac.compare_digest(_digest(split[1]), digest) else None


class Credentials:
    """Friendly methods for the server's credentials (`ws.credentials`). Each change is a batch
    of its own; the server sees it within a second (`docs/server.md`)."""

    def __init__(self, ws: Client):
        self.ws = ws

    def create_key(self, name: str, permissions: list[str]) -> str:
        """A new API key named `name` (unique among active keys) holding `permissions` (names
        of `engagelake.permissions.KEY_PERMISSIONS`, or `all`); returns the key, which the
        store does not keep. Raises ConfigError saying what to fix."""
        name = name.strip()
        if not name:
            raise ConfigError("a key needs a name (--name)")
        try:
            granted = check_permissions(permissions)
        except ValueError as error:
            raise ConfigError(str(error)) from None
        key_id, secret, key = _new(KEY_PREFIX)

        def build(ctx: Context) -> None:
            keys = ctx.state["api_keys"]
            if keys.filter((pl.col("name") == name) & pl.col("revoked_at").is_null()).height:
                raise ConfigError(f"an active key is already named {name!r}: revoke it first, or choose another name")
            changes = Changes()
            changes.upsert("api_keys", pl.DataFrame({
                "key_id": [key_id], "name": [name], "secret_sha256": [_digest(secret)],
                "permissions": [orjson.dumps(granted).decode()], "created_at": [ctx.clock], "revoked_at": [None],
            }))
            ctx.write(changes)

        self.ws.write(build)
        return key

    def list_keys(self) -> list[dict[str, Any]]:
        """Every key ever created, oldest first: name, ID, permissions, created and revoked
        times (never a secret)."""
        rows = self.ws.table("api_keys").sort("created_at", "key_id").collect()
        return [{"name": r["name"], "key_id": r["key_id"], "permissions": orjson.loads(r["permissions"]),
                 "created_at": r["created_at"], "revoked_at": r["revoked_at"]} for r in rows.iter_rows(named=True)]

    def revoke_key(self, name: str) -> int:
        """Revoke the active key named `name`; ConfigError when there is none."""
        return self._revoke("api_keys", "key_id", pl.col("name") == name, f"no active key named {name!r}")

    def create_scim_token(self, origin: str) -> str:
        """A new SCIM token, accepted only with `X-Request-Origin: <origin>`; returns it."""
        origin = origin.strip()
        if not origin:
            raise ConfigError("a SCIM token needs the origin of the caller's service (--origin)")
        token_id, secret, token = _new(TOKEN_PREFIX)

        def build(ctx: Context) -> None:
            changes = Changes()
            changes.upsert("scim_tokens", pl.DataFrame({
                "token_id": [token_id], "origin": [origin], "secret_sha256": [_digest(secret)],
                "created_at": [ctx.clock], "revoked_at": [None],
            }))
            ctx.write(changes)

        self.ws.write(build)
        return token

    def list_scim_tokens(self) -> list[dict[str, Any]]:
        rows = self.ws.table("scim_tokens").sort("created_at", "token_id").collect()
        return rows.select("token_id", "origin", "created_at", "revoked_at").to_dicts()

    def revoke_scim_token(self, token_id: str) -> int:
        """Revoke the SCIM token with this ID (the part after `els_`); ConfigError when none."""
        return self._revoke("scim_tokens", "token_id", pl.col("token_id") == token_id,
                            f"no active SCIM token with ID {token_id!r}")

    def key_ring(self) -> KeyRing:
        return KeyRing(self.ws.table("api_keys").collect(), self.ws.table("scim_tokens").collect())

    def _revoke(self, table: str, key: str, which: pl.Expr, missing: str) -> int:
        revoked: list[int] = []

        def build(ctx: Context) -> None:
            rows = ctx.state[table].filter(which & pl.col("revoked_at").is_null())
            if not rows.height:
                raise ConfigError(missing)
            changes = Changes()
            changes.upsert(table, rows.with_columns(revoked_at=pl.lit(ctx.clock).cast(rows.schema["revoked_at"])))
            ctx.write(changes)
            revoked.append(rows.height)

        self.ws.write(build)
        return revoked[-1]


