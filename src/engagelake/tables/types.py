"""Column types the table modules share (a module of its own: `schema.py` imports the others)."""

from __future__ import annotations

import polars as pl

UTC_TS = pl.Datetime("us", "UTC")  # the tables' timestamp columns: microseconds, UTC
