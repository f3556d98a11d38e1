"""The store's current view as frames, and the changes a batch makes to it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import polars as pl

from engagelake.store.schema import KEYS, TABLES, conform, empty


@dataclass(frozen=True)
class State:
    """Current rows of every table plus the store-wide counters."""

    tables: dict[str, pl.DataFrame]
    next_profile_n: int = 0  # profiles ever created: the next service_id ordinal
    next_update_seq: int = 0  # objects ever applied: orders "most recently updated"

    @staticmethod
    def empty() -> State:
        return State({name: empty(name) for name in TABLES})

    def __getitem__(self, name: str) -> pl.DataFrame:
        return self.tables[name]


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


def apply_changes(state: State, changes: Changes, *, next_profile_n: int, next_update_seq: int) -> State:
    """The state after `changes`: keyed tables replace rows by key, logs append."""
    tables = dict(state.tables)
    for name, (ups, dels) in changes.merged().items():
        key = KEYS[name]
        cur = tables[name]
        if key is None:
            if ups is not None:
                cur = pl.concat([cur, ups])
        else:
            drop = [f for f in (ups, dels) if f is not None]
            cur = cur.join(pl.concat([f.select(key) for f in drop]), on=list(key), how="anti")
            if ups is not None:
                cur = pl.concat([cur, ups])
        tables[name] = cur
    return replace(state, tables=tables, next_profile_n=next_profile_n, next_update_seq=next_update_seq)
