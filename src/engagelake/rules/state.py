"""The store as one batch sees it: stored rows read on demand, overlaid with the batch's changes.

A `State` holds no copy of the store. Rules ask for rows by key (`rows_where`), and the state
probes the store snapshot for the keys it has not seen yet; rows the batch wrote shadow the
stored ones. So a batch reads what it touches, and memory follows the batch. `state[name]`
still gives a whole table, read from the store on first use, for rules that need one (small
resource tables, whole-store jobs).
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from engagelake.cpus import pinned
from engagelake.tables.changes import Changes, remap_history
from engagelake.tables.partial import PARTIAL, SET, fold_over, newest, sets
from engagelake.tables.schema import HISTORY, INDEXES, KEYS, SCHEMAS, TABLES, empty, read_back
from engagelake.tables.source import STAGED, RowSource

__all__ = ["Changes", "State", "apply_changes"]

# Tables a prefetch reads at once (an export reads up to six), no more than the cores: their
# reads are CPU work (see `store/runs.py`, READ_THREADS)
PREFETCH_THREADS = min(6, os.cpu_count() or 1)
# A pinned batch prefetches this many users' rows or fewer table after table in its own thread
# (warm exports at 10M: 1 user 15.5-16.0 against 19.0-19.1 ms p50, 10 users 29.6 against
# 35.2-37.3, 25 users 44.5 against 48.1). For 50 users, side by side was faster at 1.18M users
# (46.0-46.4 against 49.1-50.6 ms) and slower at 10M (61-62 against 58-60): kept as it was.
SERIAL_PREFETCH_USERS = 32
# columns that name a user, in any table (lineage rows name two)
SUBJECT_COLUMNS = ("service_id", "into", "source_sid", "target_sid")

@dataclass(frozen=True)
class State:
    """Current rows as far as this batch has read or written them, plus the store counters.

    `known[name]` holds stored rows read so far (unchanged) and the rows this batch wrote; for
    the event and purchase logs it holds only the rows this batch appended, unless the log was
    read whole. `shadow[name]` lists the keys the batch wrote or deleted: stored rows of those
    keys are stale. `probed` remembers the values already looked up per (table, column), so a
    key is read from the store once per batch. Tables in `whole` are complete in `known`.

    Partial rows (`tables/partial.py`) of keys whose row the batch holds fold into it at once;
    the others wait in `pending[name]`, unread, and fold into their stored row when a rule
    asks for it (or when the batch stages). A batch that only sets fields never reads them."""

    source: RowSource | None
    known: dict[str, pl.DataFrame]
    shadow: dict[str, pl.DataFrame] = field(default_factory=dict)
    whole: set[str] = field(default_factory=set)
    probed: dict[tuple[str, str], pl.Series] = field(default_factory=dict)
    next_profile_n: int = 0  # profiles ever created: the next service_id ordinal
    next_update_seq: int = 0  # objects ever applied: orders "most recently updated"
    reads: list[tuple[str, str, int]] = field(default_factory=list)  # (table, column or "*", rows read)
    # (value, key) pairs of the stored rows read, per index: the index holds them already
    indexed: dict[str, list[pl.DataFrame]] = field(default_factory=dict)
    # partial rows (with `SET`) of keys not read yet, one per key
    pending: dict[str, pl.DataFrame] = field(default_factory=dict)
    # per event and purchase log, the users whose stored rows were read and those rows, as
    # stored (history is remapped through the redirects when asked for)
    logs: dict[str, tuple[pl.Series, pl.DataFrame]] = field(default_factory=dict)
    # the users this batch read or wrote, as service_id columns (None: not recorded): a keyed
    # batch's stored responses concern them, and go when one of them is deleted (`subjects`)
    subjects: list[pl.Series] | None = None

    @staticmethod
    def empty() -> State:
        """An empty store: every table whole and empty."""
        return State(None, {name: empty(name) for name in TABLES}, whole=set(TABLES))

    @staticmethod
    def over(source: RowSource, *, next_profile_n: int, next_update_seq: int,
             reads: list[tuple[str, str, int]] | None = None, subjects: list[pl.Series] | None = None) -> State:
        """A state that reads `source` on demand (`reads`: the list to log reads to;
        `subjects`: the list to note the users read and written to, if any)."""
        return State(source, {name: empty(name) for name in TABLES},
                     next_profile_n=next_profile_n, next_update_seq=next_update_seq,
                     reads=[] if reads is None else reads, subjects=subjects)

    def note_subjects(self, rows: pl.DataFrame) -> None:
        """Note the users `rows` name (any service_id column), when this batch records them."""
        if self.subjects is not None and rows.height:
            self.subjects.extend(rows[c] for c in SUBJECT_COLUMNS if c in rows.columns)

    def subject_ids(self) -> pl.Series | None:
        """The distinct service_ids this batch read or wrote (None: not recorded)."""
        if self.subjects is None:
            return None
        ids = pl.concat([s.cast(pl.String).rename("service_id") for s in self.subjects]) if self.subjects \
            else pl.Series("service_id", [], pl.String)
        return ids.drop_nulls().unique()

    # --- whole tables --------------------------------------------------------------------------
    def __getitem__(self, name: str) -> pl.DataFrame:
        if name not in self.whole:
            self._read_whole(name)
        return self.known[name]

    def _read_whole(self, name: str) -> None:
        assert self.source is not None
        stored = self._note_stored(name, self.source.scan(name).collect())
        self.reads.append((name, "*", stored.height))
        pending = self.pending.pop(name, None)
        if pending is not None:  # not in `shadow`: their stored rows are kept, folded
            stored = fold_over(name, stored, pending)
        key = KEYS[name]
        if key is None:
            if name in HISTORY:
                stored = remap_history(stored, self["redirects"])
            self.known[name] = pl.concat([stored, self.known[name]], how="vertical_relaxed")
        else:
            shadow = self.shadow.get(name)
            if shadow is not None:  # stored rows keep their order; the batch's rows follow
                stored = stored.join(shadow, on=list(key), how="anti")
                mine = self.known[name].join(shadow, on=list(key), how="semi")
            else:
                mine = self.known[name].clear()
            self.known[name] = pl.concat([stored, mine], how="vertical_relaxed")
            if pending is not None:
                self._shadow(name, pending.select(key))
        self.whole.add(name)

    def _shadow(self, name: str, keys: pl.DataFrame) -> None:
        old = self.shadow.get(name)
        self.shadow[name] = keys if old is None else pl.concat([old, keys]).unique()

    # --- rows by key ---------------------------------------------------------------------------
    def rows_where(self, name: str, column: str, values: Any) -> pl.DataFrame:
        """Current rows of `name` whose `column` is one of `values`, reading from the store only
        the values not looked up before in this batch. For the event and purchase logs `column`
        must be `service_id`: the rows of merged profiles redirected into them are included.
        The rows hold the columns `read_back(name)` names."""
        if not self._may_hold(name):  # nothing stored, nothing written: no answer to look for
            return self.known[name].select(read_back(name))
        wanted = _values(values, self.known[name].schema[column])
        if wanted.len() == 0:  # nothing asked (about half the lookups of a small track pass)
            held = self.known[name].clear()
            return held if name not in self.whole and name not in HISTORY else held.select(read_back(name))
        self._resolve_pending(name, column, wanted)
        if name in self.whole:
            return self.known[name].filter(pl.col(column).is_in(wanted.implode())).select(read_back(name))
        if name in HISTORY:
            return self._history(name, column, wanted)
        self._probe(name, column, wanted)
        return self.known[name].filter(pl.col(column).is_in(wanted.implode()))

    def _probe(self, name: str, column: str, wanted: pl.Series) -> None:
        if (read := self._plan_probe(name, column, wanted)) is not None:
            self._take(read, read.run())

    def _plan_probe(self, name: str, column: str, wanted: pl.Series) -> _Read | None:
        """The store read `rows_where` needs for `wanted` (None: the batch has every row)."""
        assert self.source is not None
        seen = self.probed.get((name, column))
        new = wanted if seen is None else wanted.filter(~wanted.is_in(seen.implode()))
        key = KEYS[name]
        assert key is not None
        if key == (column,):  # a key this batch already holds (or deleted) needs no read
            for held in (self.known[name], self.shadow.get(name)):
                if held is not None and held.height and new.len():
                    new = new.filter(~new.is_in(held[column].implode()))
            # none of the batch's keys: nothing stale
            return _Read(self.source, name, column, new) if new.len() else None
        if new.len() == 0:
            return None
        # rows of keys the batch holds (read or written) are stale or known: a secondary
        # probe does not read them, and any other probe drops them
        stale = [f for f in (self.shadow.get(name), self.known[name].select(key)) if f is not None and f.height]
        held = pl.concat(stale) if stale else None
        if held is not None and column in key:  # rows read have their `column` in `new`
            held = held.filter(pl.col(column).is_in(new.implode()))
        return _Read(self.source, name, column, new, held)

    def _take(self, read: _Read, rows: pl.DataFrame) -> None:
        """Keep the rows a planned read found."""
        name, column, new = read.name, read.column, read.values
        if read.held is not None and rows.height:
            rows = rows.join(read.held, on=list(KEYS[name] or ()), how="anti")
        self.reads.append((name, column, rows.height))
        rows = self._note_stored(name, rows)
        if read.log:  # raw stored log rows: remapped through the redirects when asked for
            old = self.logs.get(name)
            self.logs[name] = (new, rows) if old is None else (pl.concat([old[0], new]), pl.concat([old[1], rows]))
            return
        rows = self._fold_pending(name, rows)
        if rows.height:
            self.known[name] = pl.concat([self.known[name], rows], how="vertical_relaxed")
        seen = self.probed.get((name, column))
        self.probed[(name, column)] = new if seen is None else pl.concat([seen, new])

    def prefetch(self, names: list[str], users: Any) -> None:
        """Read the rows of `users` (service IDs) of several tables at once, so that the
        `rows_where(name, "service_id", users)` that follow read nothing: an export's reads
        run side by side (pyarrow and Polars read without the GIL, a point read is mostly
        waiting on decompression)."""
        reads = []
        for name in names:
            if name in self.whole or not self._may_hold(name):
                continue
            wanted = _values(users, self.known[name].schema["service_id"])
            if name in HISTORY:
                read = self._plan_log_read(name, self._history_ids(wanted))
            else:
                self._resolve_pending(name, "service_id", wanted)
                read = self._plan_probe(name, "service_id", wanted)
            if read is not None:
                reads.append(read)
        # a batch pinned to one CPU (a small one: `cpus.py`) reads a few users' tables one after
        # another, in its own thread: handing each to a thread cost more than it saved
        side_by_side = len(reads) > 1 and (not pinned() or len(users) > SERIAL_PREFETCH_USERS)
        found = _probe_pool().map(_Read.run, reads) if side_by_side else map(_Read.run, reads)
        for read, rows in zip(reads, found, strict=True):
            self._take(read, rows)

    def _may_hold(self, name: str) -> bool:
        """False when the batch holds no row of `name` and the store none either."""
        if name in self.whole or self.known[name].height or name in self.pending:
            return True
        assert self.source is not None
        return self.source.holds(name)

    def _resolve_pending(self, name: str, column: str, wanted: pl.Series) -> None:
        """Fold the pending partial rows that may answer a probe of `column` for `wanted`."""
        if (pending := self.pending.get(name)) is not None:
            self._resolve(name, pending.filter(pl.col(column).is_in(wanted.implode()) & sets(name, column)))

    def _resolve(self, name: str, partial: pl.DataFrame) -> None:
        """Read the stored rows of `partial`'s keys and fold the pending rows into them."""
        if partial.height == 0:
            return
        rows = self._fold_pending(name, self._stored_rows_of(name, partial))
        self.known[name] = pl.concat([self.known[name], rows], how="vertical_relaxed")

    def _stored_rows_of(self, name: str, rows: pl.DataFrame) -> pl.DataFrame:
        """The current stored rows of the keys of `rows` (a single-column key), read and noted."""
        assert self.source is not None
        lead = (KEYS[name] or ())[0]
        stored = self.source.probe(name, lead, rows[lead].unique())
        self.reads.append((name, lead, stored.height))
        return self._note_stored(name, stored)

    def _fold_pending(self, name: str, rows: pl.DataFrame) -> pl.DataFrame:
        """`rows` (stored, current) with this batch's pending partial rows of their keys folded
        in: those keys count as written by the batch from then on."""
        pending = self.pending.get(name)
        if pending is None or rows.height == 0:
            return rows
        key = list(KEYS[name] or ())
        mine = pending.join(rows.select(key), on=key, how="semi")
        if mine.height == 0:
            return rows
        rest = pending.join(mine.select(key), on=key, how="anti")
        if rest.height:
            self.pending[name] = rest
        else:
            del self.pending[name]
        self._shadow(name, mine.select(key))
        return fold_over(name, rows, mine)

    def resolve_changes(self, changes: Changes) -> Changes:
        """`changes` with the partial rows of keys the batch holds replaced by the whole rows
        they make (nothing is read). The held rows may or may not have the partial rows
        applied already: folding a partial row in again changes nothing. Partial rows of keys
        not read stay partial: the stages keep them so, and fold them over the stored rows when
        a later pass reads those keys. The state is not updated: a batch starts a new one after
        staging."""
        for name in PARTIAL:
            if not changes.parts.get(name):
                continue
            rows = changes.newest(name)
            partial = rows.filter(pl.col(SET).is_not_null())
            key = list(KEYS[name] or ())
            held = self.known[name].join(partial.select(key), on=key, how="semi")
            if held.height == 0:
                continue
            whole = fold_over(name, held, partial).with_columns(_deleted=pl.lit(False),
                                                                 **{SET: pl.lit(None, pl.Int64)})
            changes.set_newest(name, pl.concat([rows.join(held.select(key), on=key, how="anti"),
                                                whole.select(rows.columns)]))
        return changes

    def _note_stored(self, name: str, rows: pl.DataFrame) -> pl.DataFrame:
        """Remember the index entries of stored rows just read (every stored row has its
        entries: the commit writes them with the row, compaction rebuilds them); rows the
        batch staged itself have none yet. Returns the rows without the `STAGED` mark."""
        stored = rows
        if STAGED in rows.columns:
            stored, rows = rows.filter(~pl.col(STAGED)), rows.drop(STAGED)
        self.note_subjects(rows)
        for index, (table, _) in INDEXES.items():
            if table == name and stored.height:  # a selection shares the rows' buffers: no copy
                self.indexed.setdefault(index, []).append(stored.select(list(SCHEMAS[index])))
        return rows

    def index_entries_stored(self) -> dict[str, pl.DataFrame]:
        """Per index, the (value, key) pairs it already holds, as far as this batch read them:
        the commit need not write them again."""
        return {index: pl.concat(parts) for index, parts in self.indexed.items() if parts}

    def _history(self, name: str, column: str, users: pl.Series) -> pl.DataFrame:
        """Log rows of `users`: their stored rows and those of profiles merged into them, moved
        through the current redirects, plus the rows this batch appended."""
        assert column == "service_id", "history is read by user"
        ids = self._history_ids(users)
        if (read := self._plan_log_read(name, ids)) is not None:
            self._take(read, read.run())
        redirects = self.rows_where("redirects", "service_id", ids)
        stored = self.logs[name][1].filter(pl.col("service_id").is_in(ids.implode()))
        stored = remap_history(stored, redirects).filter(pl.col("service_id").is_in(users.implode()))
        mine = self.known[name].filter(pl.col("service_id").is_in(users.implode())).select(read_back(name))
        return pl.concat([stored, mine], how="vertical_relaxed")

    def _history_ids(self, users: pl.Series) -> pl.Series:
        """`users` and the profiles merged into them: whose stored log rows are theirs."""
        merged_in = self.rows_where("redirects", "into", users)["service_id"]
        return pl.concat([users, merged_in]).unique()

    def _plan_log_read(self, name: str, ids: pl.Series) -> _Read | None:
        """The store read of the log rows of `ids` not read before in this batch."""
        assert self.source is not None
        if (old := self.logs.get(name)) is not None:
            ids = ids.filter(~ids.is_in(old[0].implode()))
            if ids.len() == 0:
                return None
        return _Read(self.source, name, "service_id", ids, log=True)


@dataclass(frozen=True)
class _Read:
    """One store read a probe needs: planned and kept by the batch's thread, run by any."""

    source: RowSource
    name: str
    column: str
    values: pl.Series
    held: pl.DataFrame | None = None
    log: bool = False

    def run(self) -> pl.DataFrame:
        return self.source.probe(self.name, self.column, self.values, self.held)


@functools.cache
def _probe_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=PREFETCH_THREADS, thread_name_prefix="engagelake-prefetch")


def _values(values: Any, dtype: pl.DataType) -> pl.Series:
    series = values if isinstance(values, pl.Series) else pl.Series(list(values), dtype=dtype)
    # one query, not three (each Series method is a query of its own: 34 against 82 µs)
    return series.to_frame().select(pl.first().cast(dtype).drop_nulls().unique()).to_series()


def apply_changes(state: State, changes: Changes, *, next_profile_n: int, next_update_seq: int) -> State:
    """The state after `changes`: keyed tables replace rows by key, logs append; partial rows
    fold into the rows the batch holds, or wait in `pending`."""
    known, shadow, pending = dict(state.known), dict(state.shadow), dict(state.pending)
    for name, (ups, dels) in changes.merged().items():
        for frame in (ups, dels):
            if frame is not None:
                state.note_subjects(frame)
        key = KEYS[name]
        cur = known[name]
        if name in PARTIAL:
            ups, pending = _partial_rows(name, cur, ups, dels, pending, whole=name in state.whole)
        if key is not None and (ups is not None or dels is not None):
            gone = pl.concat([f.select(key) for f in (ups, dels) if f is not None])
            # a cheap one-column probe first: only rows of touched keys go through the join
            first = gone[key[0]].unique().implode()
            touched = pl.col(key[0]).is_in(first)
            kept = cur.filter(touched).join(gone, on=list(key), how="anti")
            cur = pl.concat([cur.filter(~touched), kept], rechunk=False)
            old = shadow.get(name)
            shadow[name] = gone if old is None else pl.concat([old, gone]).unique()
        if ups is not None:
            cur = pl.concat([cur, ups], rechunk=False)
        if name == "redirects" and ups is not None:  # history follows merges, goes with deletes
            for log in HISTORY:
                known[log] = remap_history(known[log], ups)
        if cur.n_chunks() > 64:  # many small batches: compact the in-memory chunks now and then
            cur = cur.rechunk()
        known[name] = cur
    return State(state.source, known, shadow, set(state.whole), dict(state.probed),
                 next_profile_n=next_profile_n, next_update_seq=next_update_seq, reads=state.reads,
                 indexed=state.indexed, pending=pending, logs=dict(state.logs), subjects=state.subjects)


def _partial_rows(name: str, held: pl.DataFrame, ups: pl.DataFrame | None, dels: pl.DataFrame | None,
                  pending: dict[str, pl.DataFrame], *, whole: bool) -> tuple[pl.DataFrame | None, dict[str, pl.DataFrame]]:
    """Split a `PARTIAL` table's upserts: whole rows, plus partial rows folded into the `held`
    rows of their keys, go on as upserts; the other partial rows join `pending` (in a `whole`
    table they have no row to fold into, and go)."""
    key = list(KEYS[name] or ())
    old = pending.get(name)
    if ups is None:
        partial = None
    else:
        partial = ups.filter(pl.col(SET).is_not_null())
        ups = ups.filter(pl.col(SET).is_null()).drop(SET)
    if old is not None:  # whole rows and deletes replace what was pending
        for gone in (ups, dels):
            if gone is not None and gone.height:
                old = old.join(gone.select(key), on=key, how="anti")
    if partial is not None and partial.height:
        into = held.join(partial.select(key), on=key, how="semi")
        folded = fold_over(name, into, partial)
        ups = folded if ups is None else pl.concat([ups, folded], how="vertical_relaxed")
        rest = partial.join(into.select(key), on=key, how="anti")
        if rest.height and not whole:
            old = rest if old is None else newest(name, pl.concat([old, rest.select(old.columns)]))
    pending = {**pending}
    if old is not None and old.height:
        pending[name] = old
    else:
        pending.pop(name, None)
    return (ups if ups is not None and ups.height else None), pending
