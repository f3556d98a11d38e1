"""A compaction in parts: its plan, the parts any process writes, and the SQL of a part.

A compaction rewrites each table as its current rows, sorted as its files keep them
(`runs.sort_order`). The big sorted tables cut into ranges of their sort column, and a range
is a part: its rows are the table's current rows in that range, in the same order, so the
files of the parts, in the order of their ranges, hold what one process would have written.
A part reads the tables as the planning compaction's head left them and writes its files into
the table's folder without committing them; the compaction that planned it (it holds the
writer lock throughout) commits every part of a table as one version once all are written
(`DeltaStore.compaction`). A part that fails leaves no file; one that ran and was never
committed leaves files no version names, which the next compaction's vacuum deletes.

An index is one part, whole: it is the distinct values of a column of its table, which is
not sorted by that column, so a range of it would read the whole table. The small unsorted
tables (lineage, resources), and a table whose files lack a column of its schema (delta-rs
writes it, evolving the schema), are written by the compaction itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engagelake.store.merging import sql_text
from engagelake.store.runs import SORT_BY, sort_order
from engagelake.tables.partial import PARTIAL
from engagelake.tables.schema import HISTORY, INDEXES, KEYS, SCHEMAS

if TYPE_CHECKING:
    from engagelake.store.layout import Head

# A part's own cost (a connection, its table's view, the footers of the table's files) is
# about 0.15 s, and a Prefect task's on a Dask cluster 0.26 s; a part writes about 550,000
# stored rows a second (1M users, this machine): below this many rows a part costs more than
# it shares out
MIN_PART_ROWS = 500_000


@dataclass(frozen=True)
class Part:
    """One table's current rows whose sort column lies in [low, high) (None: no bound)."""

    table: str
    low: str | None
    high: str | None


@dataclass(frozen=True)
class Plan:
    """What a compaction's parts need, in any process: the head they read, the batch number
    the compaction stamps its rows with, and the parts."""

    uri: str
    head: Head
    batch_no: int
    parts: tuple[Part, ...]


@dataclass(frozen=True)
class Written:
    """A part's files (Delta add actions, not committed) and their rows."""

    part: Part
    batch_no: int  # the compaction's (`Plan.batch_no`): a part of another is refused
    adds: list[dict[str, Any]] = field(default_factory=list)
    rows: int = 0


def splits(name: str) -> bool:
    """Whether `name` may be compacted in ranges (its current rows filter by its sort column
    where its files are read, so a part reads only its range)."""
    return name in SORT_BY and name not in INDEXES


def rows_sql(name: str, batch_no: int, part: Part | None = None) -> str:
    """SQL of the rows a compaction writes for the sorted table `name` (over `Snapshot.duckdb`'s
    views), stamped with `batch_no`, in the files' order: all of them, or `part`'s range."""
    order = sort_order(name, KEYS[name])
    assert order is not None, "a sorted table"
    columns = ", ".join(f'"{c}"' for c in SCHEMAS[name])
    source = f'"{name}"'
    if name in INDEXES:  # an index of the current rows only: stale entries go
        table, column = INDEXES[name]
        source = f'(SELECT DISTINCT {columns} FROM "{table}" WHERE "{column}" IS NOT NULL)'
    where = ""
    if part is not None and (part.low, part.high) != (None, None):
        if name in HISTORY:  # history moved to survivors: a part is by the survivor's ID
            source = _history_in_range(name, columns, part)
        else:
            where = f" WHERE {_in_range(SORT_BY[name], part)}"
    mask = ", NULL::BIGINT AS _set" if name in PARTIAL else ""  # current rows are whole
    by = ", ".join(f'"{c}"' for c in order)
    return (f"SELECT {columns}, {batch_no}::BIGINT AS _batch, false AS _deleted{mask} "
            f"FROM {source}{where} ORDER BY {by}")


def _in_range(column: str, part: Part, qualifier: str = "") -> str:
    """`column` in [low, high); the range without an end takes the nulls too (they sort last)."""
    ref = f'{qualifier}"{column}"'
    bounds = []
    if part.low:
        bounds.append(f"{ref} >= {sql_text(part.low)}")
    if part.high is not None:
        bounds.append(f"{ref} < {sql_text(part.high)}")
    condition = " AND ".join(bounds) or "true"
    return f"({condition})" if part.high is not None else f"({condition} OR {ref} IS NULL)"


def _history_in_range(name: str, columns: str, part: Part) -> str:
    """The history view's rows (`Snapshot.duckdb`) whose survivor's ID lies in `part`'s range,
    read so that the range filters the stored rows where they are read: a user's own rows by
    their ID, plus the rows of the profiles merged into a user of the range (none, usually)."""
    own = (f'SELECT {columns} FROM "_stored_{name}" h WHERE {_in_range("service_id", part, "h.")} '
           f'AND NOT EXISTS (SELECT 1 FROM redirects r WHERE r.service_id = h.service_id)')  # (NOT IN drops nulls)
    moved = (f'SELECT h.* REPLACE (r."into" AS service_id) FROM "_stored_{name}" h '
             f'JOIN redirects r USING (service_id) WHERE r."into" IS NOT NULL AND {_in_range("into", part, "r.")}')
    return f"({own} UNION ALL {moved})"

