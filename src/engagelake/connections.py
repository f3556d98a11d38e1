"""DuckDB connections kept by each thread between uses: connecting costs 13-27 ms (a database
of its own, its settings), more than a small request's parse or a small run merge. A use
takes the thread's connection for its key, or makes one; it hands it back left as it found
it (its temporary tables dropped, its registered frames and views unregistered), or closes it
when the use failed, since its state is then unknown. `rules/duck.py` keeps the rules'
connections, `store/merging.py` the run merges'."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb  # imported where used: a process that only reads never loads it

_local = threading.local()


@contextmanager
def kept(key: Hashable, make: Callable[[], duckdb.DuckDBPyConnection]) -> Iterator[duckdb.DuckDBPyConnection]:
    """This thread's connection for `key` (`make` makes one when there is none), kept after a
    use that succeeded. A nested use of the same key gets a connection of its own."""
    connections: dict[Hashable, duckdb.DuckDBPyConnection] = _local.__dict__.setdefault("connections", {})
    con = connections.pop(key, None)  # taken while in use
    if con is None:
        con = make()
    try:
        yield con
    except BaseException:
        con.close()  # its state is unknown: never reused
        raise
    clear(con)
    if key in connections:  # a nested use kept one meanwhile
        con.close()
    else:
        connections[key] = con


def clear(con: duckdb.DuckDBPyConnection) -> None:
    """Drop what a use left in `con`: temporary tables, temporary views (registered frames among
    them) and views of the main schema (a snapshot's views, `Snapshot.duckdb`)."""
    # `execute`, not `sql`: DuckDB's relation layer made this small query cost 2.5 ms, not 0.9
    left = con.execute("SELECT table_name, 'table' FROM duckdb_tables() WHERE temporary UNION ALL "
                       "SELECT view_name, CASE WHEN temporary THEN 'temporary' ELSE 'view' END FROM duckdb_views() "
                       "WHERE NOT internal").fetchall()
    for name, kind in left:  # one catalog query, not one per kind (a small request's parse uses two connections)
        if kind == "table":
            con.execute(f'DROP TABLE temp."{name}"')
        elif kind == "temporary":
            con.unregister(name)
        else:
            con.execute(f'DROP VIEW IF EXISTS "{name}"')
