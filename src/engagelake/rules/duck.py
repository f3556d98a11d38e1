"""The DuckDB connection a thread's rules compute with, kept between uses: connecting costs
13-16 ms, more than the rest of a one-object request's parse. Each use leaves it as it found
it (its temporary tables dropped, its registered frames unregistered)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from engagelake.cpus import pinned

if TYPE_CHECKING:
    import duckdb  # imported where used: a process that only reads never loads it

_local = threading.local()


@contextmanager
def connection(threads: int | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """This thread's in-memory connection (with `threads` worker threads; None: DuckDB's
    default, or one thread, the caller's, while it is pinned to one CPU: `cpus.py`)."""
    import duckdb
    if threads is None and pinned():
        threads = 1
    kept: dict[int | None, duckdb.DuckDBPyConnection] = _local.__dict__.setdefault("connections", {})
    con = kept.pop(threads, None)  # taken while in use: a nested use gets a connection of its own
    if con is None:
        con = duckdb.connect(config={"threads": threads} if threads else {})
    try:
        yield con
    except BaseException:
        con.close()  # its state is unknown: never reused
        raise
    _clear(con)
    kept.setdefault(threads, con)


def _clear(con: duckdb.DuckDBPyConnection) -> None:
    # `execute`, not `sql`: DuckDB's relation layer made this small query cost 2.5 ms, not 0.9
    left = con.execute("SELECT table_name, true FROM duckdb_tables() WHERE temporary UNION ALL "
                       "SELECT view_name, false FROM duckdb_views() WHERE temporary AND NOT internal").fetchall()
    for name, table in left:  # one catalog query, not one per kind (a small request's parse uses two connections)
        if table:
            con.execute(f'DROP TABLE temp."{name}"')
        else:
            con.unregister(name)
