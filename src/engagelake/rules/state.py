"""The store's current view as frames, and the changes a batch makes to it."""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from engagelake.store.schema import KEYS, TABLES, conform, empty


@dataclass(frozen=True)
class State:
    """Current rows of every table plus the store-wide counters."""

    tables: dict[str, pl.DataFrame]
    next_profile_n: int = 0  # profiles ever created: the next service_id ordinal
    next_update_seq: int = 0  # objects ever applied: orders "most recently updated"
    # read indexes built on first use for this version of the state (never carried over)
    _sorted: dict[tuple[str, str], pl.DataFrame] = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def empty() -> State:
        return State({name: empty(name) for name in TABLES})

    def __getitem__(self, name: str) -> pl.DataFrame:
        return self.tables[name]

    def rows_where(self, name: str, column: str, values: list[str]) -> pl.DataFrame:
        """Rows of `name` whose `column` is one of `values`, by binary search on a copy of the
        table sorted by that column (built once per state version), so point reads such as
        an export cost what they return, not the size of the table."""
        key = (name, column)
        if key not in self._sorted:
            self._sorted[key] = self.tables[name].drop_nulls(column).sort(column)
        table = self._sorted[key]
        wanted = pl.Series(sorted(set(values)), dtype=pl.String)
        col = table[column]
        lo = col.search_sorted(wanted, side="left").to_list()
        hi = col.search_sorted(wanted, side="right").to_list()
        parts = [table.slice(a, b - a) for a, b in zip(lo, hi, strict=True) if b > a]
        return pl.concat(parts) if parts else table.clear()


@dataclass
class Changes:
    """Rows a batch writes, in order: upserts of keyed tables (whole new rows), deleted keys,
    appended log rows. For each key the last change wins."""

    parts: dict[str, list[pl.DataFrame]] = field(default_factory=dict)

    def upsert(self, name: str, rows: pl.DataFrame) -> None:
        if rows.height:
            self.parts.setdefault(name, []).append(conform(name, rows).with_columns(_deleted=pl.lit(False)))

    def delete(self, name: str, keys: pl.DataFrame) -> None:
        key = KEYS[name]
        assert key is not None, f"{name} is append-only"
        if keys.height:
            self.parts.setdefault(name, []).append(
                conform(name, keys.select(key)).with_columns(_deleted=pl.lit(True)))

    def extend(self, other: Changes) -> None:
        for name, frames in other.parts.items():
            self.parts.setdefault(name, []).extend(frames)

    def __bool__(self) -> bool:
        return bool(self.parts)

    def merged(self) -> dict[str, tuple[pl.DataFrame | None, pl.DataFrame | None]]:
        """Per table: (rows to write, keys deleted), the last change of each key winning."""
        out: dict[str, tuple[pl.DataFrame | None, pl.DataFrame | None]] = {}
        for name in TABLES:  # a fixed table order: the commit's failpoints depend on it
            if name not in self.parts:
                continue
            frames, key = self.parts[name], KEYS[name]
            rows = pl.concat(frames)
            if key is not None:
                rows = rows.unique(subset=list(key), keep="last", maintain_order=True)
            ups = rows.filter(~pl.col("_deleted")).drop("_deleted")
            dels = rows.filter(pl.col("_deleted")).select(key) if key is not None else None
            out[name] = (ups if ups.height else None, dels if dels is not None and dels.height else None)
        return out


def remap_history(log: pl.DataFrame, redirects: pl.DataFrame) -> pl.DataFrame:
    """An event or purchase log with merged profiles' rows moved to the surviving profile and
    deleted profiles' rows dropped (`redirects`: service_id -> into, null into = deleted)."""
    if redirects.height == 0 or log.height == 0:
        return log
    gone = redirects.filter(pl.col("into").is_null())["service_id"]
    moved = redirects.filter(pl.col("into").is_not_null())
    if gone.len():
        log = log.filter(~pl.col("service_id").is_in(gone.implode()))
    if moved.height:  # a hash lookup per row, in place: no join, order kept
        log = log.with_columns(pl.col("service_id").replace(moved["service_id"], moved["into"]))
    return log


def apply_changes(state: State, changes: Changes, *, next_profile_n: int, next_update_seq: int) -> State:
    """The state after `changes`: keyed tables replace rows by key, logs append."""
    tables = dict(state.tables)
    for name, (ups, dels) in changes.merged().items():
        key = KEYS[name]
        cur = tables[name]
        if key is not None:
            gone = pl.concat([f.select(key) for f in (ups, dels) if f is not None])
            # a cheap one-column probe first: only rows of touched users go through the join
            first = gone[key[0]].unique().implode()
            touched = pl.col(key[0]).is_in(first)
            kept = cur.filter(touched).join(gone, on=list(key), how="anti")
            cur = pl.concat([cur.filter(~touched), kept], rechunk=False)
        if ups is not None:
            cur = pl.concat([cur, ups], rechunk=False)
        if name == "redirects" and ups is not None:  # history follows merges, goes with deletes
            for log in ("events", "purchases"):
                tables[log] = remap_history(tables[log], ups)
        if cur.n_chunks() > 64:  # many small batches: compact the in-memory chunks now and then
            cur = cur.rechunk()
        tables[name] = cur
    return State(tables, next_profile_n=next_profile_n, next_update_seq=next_update_seq)
