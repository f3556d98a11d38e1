"""Store table of email addresses' own states (issue 53), merged into tables/schema.py.

One row per normalized address that `POST /email/status`, `/email/blocklist` or the ESP's
feedback gave a state: the global subscription state set for the address (and when), and when
it hard-bounced or was reported as spam (null: it is not on that list). A user's own
`email_subscribe` stays on its profile; this row answers for an address nobody holds yet, and
holds the lists that belong to an address rather than to a user (docs/semantics.md, "Email
lists"). A row with nothing left to say is deleted.
"""

from __future__ import annotations

import polars as pl

from engagelake.tables.types import UTC_TS

SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "email_addresses": {
        "email": pl.String(), "state": pl.String(), "state_at": UTC_TS,
        "hard_bounced_at": UTC_TS, "spam_at": UTC_TS,
    },
}
KEYS: dict[str, tuple[str, ...] | None] = {"email_addresses": ("email",)}
