"""Store tables of catalogs: definitions and items, merged into tables/schema.py.

Item values are compact JSON text (the whole item, `id` first, every catalog field present, null
when not sent), so a catalog's fields can be read with DuckDB's JSON functions, e.g.
`select json_extract(item, '$.price') from catalog_items where catalog = 'shoes'`.
"""

from __future__ import annotations

import polars as pl

from engagelake.tables.types import UTC_TS

SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    # one row per catalog; `fields` is JSON text [{name, type}], `id` first
    "catalogs": {
        "name": pl.String(), "description": pl.String(), "fields": pl.String(),
        "created_at": UTC_TS, "updated_at": UTC_TS,
    },
    # one row per (catalog, item id); `item` is the whole item as JSON text
    "catalog_items": {
        "catalog": pl.String(), "id": pl.String(), "item": pl.String(), "updated_at": UTC_TS,
    },
}
KEYS: dict[str, tuple[str, ...] | None] = {
    "catalogs": ("name",),
    "catalog_items": ("catalog", "id"),
}
