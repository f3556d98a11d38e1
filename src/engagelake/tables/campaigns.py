"""Store tables of campaigns and their translations, merged into tables/schema.py.

Nested data is compact JSON text: the workspace's multi-language setting (`enabled`, `locales`)
and each translation map (`{translation uuid: text}`).
"""

from __future__ import annotations

import polars as pl

from engagelake.tables.types import UTC_TS

SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    # workspace-level settings by name; `value` is JSON text (today only `multi_language`)
    "campaign_settings": {"setting": pl.String(), "value": pl.String(), "updated_at": UTC_TS},
    "campaigns": {"campaign_id": pl.String(), "name": pl.String(), "updated_at": UTC_TS},
    # one row per message variation; `position` keeps the order of the campaign definition
    "campaign_messages": {
        "campaign_id": pl.String(), "message_variation_id": pl.String(), "name": pl.String(),
        "channel": pl.String(), "multi_language": pl.Boolean(), "position": pl.Int64(),
    },
    # one row per (message variation, locale name); `translation_map` is JSON text
    "campaign_translations": {
        "campaign_id": pl.String(), "message_variation_id": pl.String(), "locale": pl.String(),
        "translation_map": pl.String(),
    },
}
KEYS: dict[str, tuple[str, ...] | None] = {
    "campaign_settings": ("setting",),
    "campaigns": ("campaign_id",),
    "campaign_messages": ("campaign_id", "message_variation_id"),
    "campaign_translations": ("campaign_id", "message_variation_id", "locale"),
}
