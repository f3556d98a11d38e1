"""Store tables of this resource: schemas and keys, merged into store/schema.py."""

from __future__ import annotations

import polars as pl

SCHEMAS: dict[str, dict[str, pl.DataType]] = {}
KEYS: dict[str, tuple[str, ...] | None] = {}
