"""Store tables of the REST server's credentials: API keys and SCIM tokens, merged into
tables/schema.py.

Only a SHA-256 digest of each secret is stored: a secret is 256 random bits, so its digest
cannot be reversed or guessed, and a copy of the store (a backup, a published snapshot) lets
nobody in. A revoked credential keeps its row with `revoked_at` set, for the audit.
"""

from __future__ import annotations

import polars as pl

from engagelake.tables.types import UTC_TS

# not published with the data (`Workspace.publish`): who may call the API is no reader's business
UNPUBLISHED = ("api_keys", "scim_tokens")

SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "api_keys": {
        "key_id": pl.String(),  # the public part of the key: `elk_<key_id>_<secret>`
        "name": pl.String(),
        "secret_sha256": pl.String(),  # hex digest of the secret part
        "permissions": pl.String(),  # JSON array of permission names, or ["all"]
        "created_at": UTC_TS,
        "revoked_at": UTC_TS,
    },
    "scim_tokens": {
        "token_id": pl.String(),  # `els_<token_id>_<secret>`
        "origin": pl.String(),  # the X-Request-Origin the token must come with
        "secret_sha256": pl.String(),
        "created_at": UTC_TS,
        "revoked_at": UTC_TS,
    },
}
KEYS: dict[str, tuple[str, ...] | None] = {
    "api_keys": ("key_id",),
    "scim_tokens": ("token_id",),
}
