"""What the rules may ask of the stored tables: probes by key and whole scans, at one version.

A store snapshot implements this; `rules.state.State` reads through it, so rules never import
the store and the store never imports rules."""

from __future__ import annotations

from typing import Protocol

import polars as pl

# A boolean column a source may add to the rows it returns: true for rows the batch staged
# itself (its earlier passes, `store/staging.py`), which the store's indexes do not hold yet.
STAGED = "_staged"


class RowSource(Protocol):
    def probe(self, name: str, column: str, values: pl.Series, held: pl.DataFrame | None = None) -> pl.DataFrame:
        """Current stored rows of `name` whose `column` is one of `values`, in the columns
        `read_back(name)` names (log tables: the stored rows as written, history not
        remapped through redirects). `held` lists keys
        whose rows the caller already has: rows of those keys may be left out. The rows may
        carry a `STAGED` column."""
        ...

    def holds(self, name: str) -> bool:
        """Whether `name` may have stored rows at all (false: every probe answers nothing)."""
        ...

    def rows(self, name: str) -> int:
        """About how many rows `name` stores (every stored version of a key counted; none
        staged): what a read of the table costs, without opening a file."""
        ...

    def scan(self, name: str) -> pl.LazyFrame:
        """Every current stored row of `name`, lazily (log tables: as written); it may carry a
        `STAGED` column."""
        ...
