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
    """Rows a batch writes: upserts per keyed table (whole new rows), deleted keys, appended logs."""

    upserts: dict[str, list[pl.DataFrame]] = field(default_factory=dict)
    deletes: dict[str, list[pl.DataFrame]] = field(default_factory=dict)

    def upsert(self, name: str, rows: pl.DataFrame) -> None:
        if rows.height:
            self.upserts.setdefault(name, []).append(conform(name, rows))

    def delete(self, name: str, keys: pl.DataFrame) -> None:
        key = KEYS[name]
        assert key is not None, f"{name} is append-only"
        if keys.height:
            self.deletes.setdefault(name, []).append(keys.select(key))

    def merged(self) -> dict[str, tuple[pl.DataFrame | None, pl.DataFrame | None]]:
        """Per table: (rows to write, keys deleted); the last upsert of a key wins."""
        out: dict[str, tuple[pl.DataFrame | None, pl.DataFrame | None]] = {}
        for name in TABLES:
            key = KEYS[name]
            ups = pl.concat(self.upserts[name]) if name in self.upserts else None
            dels = pl.concat(self.deletes[name]).unique() if name in self.deletes else None
            if ups is not None and key is not None:
                ups = ups.unique(subset=list(key), keep="last", maintain_order=True)
                if dels is not None:
                    dels = dels.join(ups.select(key), on=list(key), how="anti")
            if ups is not None or dels is not None:
                out[name] = (ups, dels)
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
