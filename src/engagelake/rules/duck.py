"""The DuckDB connection a thread's rules compute with, kept between uses (`connections.py`):
connecting costs 13-16 ms, more than the rest of a one-object request's parse. Each use leaves
it as it found it (its temporary tables dropped, its registered frames unregistered)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from engagelake.connections import kept
from engagelake.cpus import pinned

if TYPE_CHECKING:
    import duckdb  # imported where used: a process that only reads never loads it


@contextmanager
def connection(threads: int | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """This thread's in-memory connection (with `threads` worker threads; None: DuckDB's
    default, or one thread, the caller's, while it is pinned to one CPU: `cpus.py`)."""
    import duckdb
    if threads is None and pinned():
        threads = 1
    with kept(("rules", threads), lambda: duckdb.connect(config={"threads": threads} if threads else {})) as con:
        yield con
