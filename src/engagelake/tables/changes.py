"""The changes a batch makes to the tables, and how history follows redirects."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import polars as pl

from engagelake.tables.partial import PARTIAL, SET, newest
from engagelake.tables.schema import KEYS, TABLES, conform


@dataclass
class Changes:
    """Rows a batch writes, in order: upserts of keyed tables (whole new rows, or partial rows
    of `PARTIAL` tables: `tables/partial.py`), deleted keys, appended log rows. For each key
    the last change wins (partial rows fold into the rows before them)."""

    parts: dict[str, list[pl.DataFrame]] = field(default_factory=dict)
    # changes staged to files before `parts` (`store/staging.py`), read only when merged
    earlier: dict[str, list[pl.LazyFrame]] = field(default_factory=dict)
    # keyed tables whose `parts` are one frame of one row per key (`newest` of what they were)
    one_per_key: set[str] = field(default_factory=set)

    def upsert(self, name: str, rows: pl.DataFrame) -> None:
        """Upsert whole rows, or partial rows when `rows` has a `SET` mask column."""
        if rows.height:
            part = conform(name, rows).with_columns(_deleted=pl.lit(False))
            if name in PARTIAL:
                part = part.with_columns((rows[SET] if SET in rows.columns else pl.lit(None, pl.Int64)).alias(SET))
            self.parts.setdefault(name, []).append(part)
            self.one_per_key.discard(name)

    def delete(self, name: str, keys: pl.DataFrame) -> None:
        key = KEYS[name]
        assert key is not None, f"{name} is append-only"
        if keys.height:
            part = conform(name, keys.select(key)).with_columns(_deleted=pl.lit(True))
            if name in PARTIAL:
                part = part.with_columns(pl.lit(None, pl.Int64).alias(SET))
            self.parts.setdefault(name, []).append(part)
            self.one_per_key.discard(name)

    def extend(self, other: Changes) -> None:
        for name, frames in other.parts.items():
            self.parts.setdefault(name, []).extend(frames)
            self.one_per_key.discard(name)

    def newest(self, name: str) -> pl.DataFrame:
        """The rows of keyed table `name`, one per key: the newest, partial rows folded
        (`tables/partial.newest`; tombstones kept). They replace the table's parts, so that
        the next caller (a pass's staging asks twice) finds them merged."""
        if name not in self.one_per_key:
            self.set_newest(name, newest(name, pl.concat(self.parts[name])))
        return self.parts[name][0]

    def set_newest(self, name: str, rows: pl.DataFrame) -> None:
        """Replace the parts of keyed table `name` with `rows`, one row per key."""
        self.parts[name] = [rows]
        self.one_per_key.add(name)

    def __bool__(self) -> bool:
        return bool(self.parts or self.earlier)

    def merged(self) -> dict[str, tuple[pl.DataFrame | None, pl.DataFrame | None]]:
        """Per table: (rows to write, keys deleted), the last change of each key winning. The
        rows of a `PARTIAL` table carry their `SET` mask (null: a whole row)."""
        return dict(self.merged_tables())

    def merged_tables(self) -> Iterator[tuple[str, tuple[pl.DataFrame | None, pl.DataFrame | None]]]:
        """`merged()` one table at a time: a table's staged changes are read when it comes."""
        for name in TABLES:
            if (merged := self.merged_table(name)) is not None:
                yield name, merged

    def merged_table(self, name: str) -> tuple[pl.DataFrame | None, pl.DataFrame | None] | None:
        """One table's (rows to write, keys deleted); None when the batch leaves it alone."""
        if name not in self.parts and name not in self.earlier:
            return None
        key = KEYS[name]
        staged = self.earlier.get(name, [])
        mine = self.parts.get(name, [])
        rows = pl.concat([*staged, *(f.lazy() for f in mine)]).collect() if staged else pl.concat(mine)
        if key is not None:
            rows = newest(name, rows)
        # one split, in order (two filters and a drop were three queries, run twice a pass)
        split = rows.partition_by("_deleted", as_dict=True, include_key=False, maintain_order=True)
        ups, gone = split.get((False,)), split.get((True,))
        dels = gone.select(key) if gone is not None and key is not None else None
        return ups if ups is not None and ups.height else None, dels if dels is not None and dels.height else None


def remap_history(log: pl.DataFrame, redirects: pl.DataFrame) -> pl.DataFrame:
    """An event or purchase log with merged profiles' rows moved to the surviving profile and
    deleted profiles' rows dropped (`redirects`: service_id -> into, null into = deleted).
    Redirects are kept flat (every `into` is a live profile), so one lookup is enough."""
    if redirects.height == 0 or log.height == 0:
        return log
    gone = redirects.filter(pl.col("into").is_null())["service_id"]
    moved = redirects.filter(pl.col("into").is_not_null())
    if gone.len():
        log = log.filter(~pl.col("service_id").is_in(gone.implode()))
    if moved.height:  # a hash lookup per row, in place: no join, order kept
        log = log.with_columns(pl.col("service_id").replace(moved["service_id"], moved["into"]))
    return log
