"""Schemas and keys of the store's tables: one place that names every column."""

from __future__ import annotations

import functools

import polars as pl

from engagelake.tables import campaigns as tables_campaigns
from engagelake.tables import catalogs as tables_catalogs
from engagelake.tables import credentials as tables_credentials
from engagelake.tables import emails as tables_emails
from engagelake.tables import preference_centers as tables_preference_centers
from engagelake.tables import scim as tables_scim
from engagelake.tables.types import UTC_TS

PROFILE_STRING_FIELDS = (
    "first_name", "last_name", "email", "phone", "dob", "gender", "country", "language",
    "home_city", "time_zone", "email_subscribe", "push_subscribe", "attributed_campaign",
    "attributed_source", "attributed_adgroup", "attributed_ad",
)

SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "profiles": {
        "service_id": pl.String(),
        "external_id": pl.String(),
        "created_at": UTC_TS,
        "created_seq": pl.Int64(),
        "updated_at": UTC_TS,
        "update_seq": pl.Int64(),
        "random_bucket": pl.Int32(),
        **{name: pl.String() for name in PROFILE_STRING_FIELDS},
        "language_explicit": pl.Boolean(),
        "last_coordinates": pl.List(pl.Float64()),
        "push_opted_in_at": UTC_TS,
        "push_anonymous": pl.Boolean(),
        # when email_subscribe last changed to unsubscribed (GET /email/unsubscribes)
        "email_unsubscribed_at": UTC_TS,
    },
    # every external ID that resolves: the primary one of each user, and deprecated ones
    "external_ids": {"external_id": pl.String(), "service_id": pl.String(), "primary": pl.Boolean()},
    "aliases": {"alias_label": pl.String(), "alias_name": pl.String(), "service_id": pl.String()},
    # one row per user and custom attribute; value is compact JSON text
    "attributes": {"service_id": pl.String(), "name": pl.String(), "value": pl.String()},
    "subscriptions": {"service_id": pl.String(), "group_id": pl.String(), "state": pl.String()},
    "push_tokens": {
        "app_id": pl.String(), "token": pl.String(), "device_id": pl.String(),
        "service_id": pl.String(), "update_seq": pl.Int64(), "pos": pl.Int64(),
    },
    "events": {
        "service_id": pl.String(), "name": pl.String(), "time": UTC_TS, "app_id": pl.String(),
        "properties": pl.String(), "update_seq": pl.Int64(),
    },
    "purchases": {
        "service_id": pl.String(), "product_id": pl.String(), "currency": pl.String(),
        "price": pl.Float64(), "quantity": pl.Int64(), "time": UTC_TS, "app_id": pl.String(),
        "properties": pl.String(), "update_seq": pl.Int64(),
    },
    # where the history of a merged or deleted profile went: `into` is the surviving profile,
    # null when deleted. Event and purchase logs are never rewritten by a batch; readers remap
    # their service_id through this table, and compaction rewrites them for good.
    "redirects": {"service_id": pl.String(), "into": pl.String(), "at": UTC_TS},
    # lineage: one row per merge, identify, rename, remove, alias and delete item, applied or skipped
    "merges": {
        "batch": pl.String(), "request": pl.Int64(), "item": pl.Int64(), "seq": pl.Int64(),
        "kind": pl.String(), "rule": pl.String(), "outcome": pl.String(), "reason": pl.String(),
        "source": pl.String(), "target": pl.String(),  # the identifiers as sent, JSON
        "source_sid": pl.String(), "target_sid": pl.String(), "at": UTC_TS,
    },
}

# Key columns of state tables (latest row per key wins in the append logs); None = append-only log.
KEYS: dict[str, tuple[str, ...] | None] = {
    "profiles": ("service_id",),
    "external_ids": ("external_id",),
    "aliases": ("alias_label", "alias_name"),
    "attributes": ("service_id", "name"),
    "subscriptions": ("service_id", "group_id"),
    "push_tokens": ("app_id", "token"),
    "events": None,
    "purchases": None,
    "redirects": ("service_id",),
    "merges": None,
}

# logs whose rows follow redirects to the surviving profile (never rewritten by a batch)
HISTORY = ("events", "purchases")
# What a batch reads back of those logs (an export's summaries and revenue): their other
# columns, the properties above all, are written and never read by a batch (`read_back`)
HISTORY_READ = {
    "events": ("service_id", "name", "time"),
    "purchases": ("service_id", "product_id", "time", "price", "quantity"),
}

USER_TABLES = tuple(SCHEMAS)  # the user tables; resource tables follow

for _module in (tables_scim, tables_preference_centers, tables_catalogs, tables_campaigns, tables_credentials,
                tables_emails):
    SCHEMAS.update(_module.SCHEMAS)
    KEYS.update(_module.KEYS)

TABLES = tuple(SCHEMAS)

# Secondary indexes, store-internal tables: a probe of a table by a column its files are not
# sorted by reads the index instead of that whole column. An index holds (value, key) for every
# row ever written with a value, sorted by value; readers then check the keys' current rows, so
# nothing is ever deleted from an index until compaction rebuilds it.
INDEXES: dict[str, tuple[str, str]] = {
    "_index_profiles_email": ("profiles", "email"),
    "_index_profiles_phone": ("profiles", "phone"),
    "_index_external_ids_service_id": ("external_ids", "service_id"),
    "_index_aliases_service_id": ("aliases", "service_id"),
    "_index_push_tokens_service_id": ("push_tokens", "service_id"),
    "_index_push_tokens_device_id": ("push_tokens", "device_id"),
    "_index_redirects_into": ("redirects", "into"),
}
INDEX_OF = {pair: index for index, pair in INDEXES.items()}
for _index, (_table, _column) in INDEXES.items():
    _key = [_column, *[k for k in KEYS[_table] or () if k != _column]]
    SCHEMAS[_index] = {c: SCHEMAS[_table][c] for c in _key}
    KEYS[_index] = tuple(_key)

STORED = TABLES + tuple(INDEXES)  # every table the store keeps


def empty(name: str) -> pl.DataFrame:
    """An empty frame with the table's schema (a fresh one: clearing a kept template costs 1.5%
    of building it from the schema, and every batch state starts from 26 of them)."""
    return _empty_template(name).clear()


@functools.cache
def _empty_template(name: str) -> pl.DataFrame:
    return pl.DataFrame(schema=SCHEMAS[name])


def conform(name: str, frame: pl.DataFrame) -> pl.DataFrame:
    """Select and cast the table's columns in schema order (missing ones become null)."""
    schema = SCHEMAS[name]
    return frame.select(
        [
            (pl.col(c) if c in frame.columns else pl.lit(None)).cast(t).alias(c)
            for c, t in schema.items()
        ]
    )


def read_back(name: str) -> list[str]:
    """The columns of `name` a probe answers: every column, or `HISTORY_READ`'s."""
    return list(HISTORY_READ.get(name, SCHEMAS[name]))
