"""Store tables of preference centers: the centers themselves and a log of form submits."""

from __future__ import annotations

import polars as pl

from engagelake.tables.types import UTC_TS

SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    # one row per center; `options` is compact JSON text (null when none was sent)
    "preference_centers": {
        "center_id": pl.String(),
        "name": pl.String(),
        "title": pl.String(),
        "page_html": pl.String(),
        "confirmation_html": pl.String(),
        "state": pl.String(),
        "options": pl.String(),
        "created_at": UTC_TS,
        "updated_at": UTC_TS,
        "created_seq": pl.Int64(),  # creation order: the order of the list endpoint
    },
    # lineage: one row per accepted form submit (fields as submitted, compact JSON)
    "preference_center_submits": {
        "center_id": pl.String(),
        "service_id": pl.String(),
        "fields": pl.String(),
        "token_expires_at": UTC_TS,
        "at": UTC_TS,
    },
}

KEYS: dict[str, tuple[str, ...] | None] = {
    "preference_centers": ("center_id",),
    "preference_center_submits": None,
}
