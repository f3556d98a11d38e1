"""What each table version holds: its data files, their add actions (with statistics), its
sorted runs and each file's key range, read from the Delta log once per version and kept
(a version never changes), and the footers that probes parse.

One `TableVersions` serves a store (`DeltaStore.versions`): snapshots read through it, and the
writers note in it what they append, merge or compact, so that the next reads need not load a
table's log again.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from engagelake.store import appends, checkpoints, merging, objects
from engagelake.store.layout import Head, OnPlace, Place, file_name
from engagelake.store.runs import SORT_BY, FooterCache
from engagelake.tables.partial import PARTIAL
from engagelake.tables.schema import STORED

KEPT_VERSIONS = 2  # versions a table's files, actions and runs are cached for (the newest)


class TableVersions(OnPlace):
    """The files, actions and runs of table versions, cached (the caches are filled by probes
    that may run side by side: `State.prefetch`; `lock` guards them)."""

    def __init__(self, place: Place, head: Callable[[], Head]):
        self.place = place
        self._head = head  # the store's current head: its versions stay cached (`_bounded`)
        self.footers = FooterCache(root=place.uri if place.local else None)
        self.lock = threading.RLock()
        self._files: dict[tuple[str, int], list[str]] = {}  # data files per table version
        self._tables: dict[tuple[str, int], DeltaTable] = {}  # their loaded logs (a folder's)
        self._cursors: dict[str, DeltaTable] = {}  # one loaded log per table (object storage)
        self._actions: dict[tuple[str, int], pa.Table] = {}  # their add actions, with file statistics
        self._runs: dict[tuple[str, int], list[merging.Run]] = {}  # their runs, from the actions (`runs`)
        # per table version and column: each data file's (min, max) from the Delta log's statistics
        self._ranges: dict[tuple[str, int, str], dict[str, tuple[str | None, str | None]]] = {}
        self.logs: dict[str, checkpoints.Files] = {}  # on object storage, per table: the files of the version read last
        self.column_scans: list[tuple[str, str]] = []  # probes that read a whole column (tests)

    def files(self, name: str, version: int | None) -> list[str]:
        """The data files of one table version (cached: a version never changes)."""
        if version is None:
            return []
        with self.lock:
            files = self._files.get((name, version))
            if files is None and version == 0 and self.as_created(name) is not None:
                files = self._files[(name, version)]
            if files is None and (read := self.remote_files(name, version)) is not None:
                files = self.keep_files(name, version, [objects.join(self._path(name), p) for p in read.adds])
            if files is None:
                files = self.note_files(name, version, self._table_at(name, version))
            return files

    def as_created(self, name: str) -> frozenset[str] | None:
        """The columns of a local table whose first version added no file (as a store creates
        every table), noting that version's files and add actions (none), so that neither
        that version nor those this process appends after it load the log; None otherwise."""
        columns = appends.created_empty(self._path(name)) if self.local else None
        if columns is not None:
            with self.lock:
                self.keep_files(name, 0, [])
                if name in SORT_BY:
                    self.keep_actions(name, 0, appends.NO_ACTIONS)
        return columns

    def note_files(self, name: str, version: int, table: DeltaTable) -> list[str]:
        """Cache the data files of `table`, loaded at `version` (the cache lock is held)."""
        files = table.file_uris()
        if self.local:  # delta-rs gives file URIs percent-encoded; readers want the path
            files = [unquote(uri) for uri in files]
        return self.keep_files(name, version, files)

    def keep_files(self, name: str, version: int, files: list[str]) -> list[str]:
        _bounded(self._files, self._head())
        self._files[(name, version)] = files
        return files

    def _table_at(self, name: str, version: int) -> DeltaTable:
        """The table's log loaded at `version` (cached; the cache lock is held). On object
        storage one loaded log per table moves forward to the versions asked (reading only the
        entries since), and the callers keep what they take from it."""
        if not self.local:
            cursor = self._cursors.get(name)
            if cursor is None or cursor.version() > version:
                cursor = self._cursors[name] = objects.delta_table(self._path(name), version)
            elif cursor.version() < version:
                cursor.load_as_version(version)
            return cursor
        table = self._tables.get((name, version))
        if table is None:
            if len(self._tables) > 4 * len(STORED):
                self._tables.clear()
            table = self._tables[(name, version)] = objects.delta_table(self._path(name), version)
        return table

    def actions_at(self, name: str, version: int) -> pa.Table:
        """The add actions (one per file, with statistics) of a table version (cached; the
        cache lock is held)."""
        actions = self._actions.get((name, version))
        if actions is None and (read := self.remote_files(name, version)) is not None:
            actions = self.keep_actions(name, version, appends.actions_of(list(read.adds.values())))
        if actions is None:
            actions = self.note_actions(name, version, self._table_at(name, version))
        return actions

    def remote_files(self, name: str, version: int) -> checkpoints.Files | None:
        """On object storage, the files of a table version as engagelake reads its log
        (`checkpoints.files_at`: a fresh process's read of a table is 2 requests and one an
        entry since the last checkpoint, where delta-rs made 13 and two an entry), moving
        forward from the version read last; None on a folder, or where it cannot tell (the
        cache lock is held)."""
        if self.local:
            return None
        known = self.logs.get(name)
        try:
            read = checkpoints.files_at(self._path(name), version, known)
            if read is None and known is not None and known.version <= version:
                # the entries after the version read last may be gone (a compaction cleans the
                # log up before its checkpoint): from the last checkpoint, then
                read = checkpoints.files_at(self._path(name), version)
        except Exception:  # noqa: BLE001 - a log this cannot read: delta-rs reads it, or says why not
            read = None
        if read is not None and (known is None or read.version >= known.version):
            self.logs[name] = read
        return read

    def note_actions(self, name: str, version: int, table: DeltaTable) -> pa.Table:
        return self.keep_actions(name, version, pa.table(table.get_add_actions(flatten=True)))

    def keep_actions(self, name: str, version: int, actions: pa.Table) -> pa.Table:
        _bounded(self._actions, self._head())
        self._actions[(name, version)] = actions
        return actions

    def file_ranges(self, name: str, version: int, column: str) -> dict[str, tuple[str | None, str | None]]:
        """Each data file's (as `files` names it) minimum and maximum of `column` at one table
        version, from the statistics of its add action (cached: a version never changes)."""
        with self.lock:
            return self._file_ranges(name, version, column)

    def _file_ranges(self, name: str, version: int, column: str) -> dict[str, tuple[str | None, str | None]]:
        ranges = self._ranges.get((name, version, column))
        if ranges is None:
            if len(self._ranges) > 4 * len(STORED):
                self._ranges.clear()
            uris = self.files(name, version)
            actions = self.actions_at(name, version)
            low, high = f"min.{column}", f"max.{column}"
            by_name = {}
            if low in actions.column_names and high in actions.column_names:
                by_name = {file_name(path): (lo, hi) for path, lo, hi in zip(  # one per file
                    actions.column("path").to_pylist(), actions.column(low).to_pylist(),
                    actions.column(high).to_pylist(), strict=True)}
            # file URIs are absolute and percent-encoded, add-action paths relative: match by name
            ranges = {uri: by_name.get(file_name(uri), (None, None)) for uri in uris}
            self._ranges[(name, version, column)] = ranges
        return ranges

    def stored_rows(self, name: str, version: int) -> int:
        """The rows of a table version's files, every version of a key counted, from their add
        actions' statistics (a file without them counts none): no file is opened."""
        with self.lock:
            actions = self.actions_at(name, version)
        if "num_records" not in actions.column_names:
            return 0
        return int(pc.sum(actions.column("num_records")).as_py() or 0)

    def holds_partial_rows(self, name: str, version: int | None) -> bool:
        """Whether a file of `name` at `version` may hold partial rows (by its statistics)."""
        if name not in PARTIAL or version is None or not self.files(name, version):
            return False
        with self.lock:
            actions = self.actions_at(name, version)
        return bool(merging.partial_files(pl.DataFrame(actions)).any())

    def runs(self, name: str, version: int | None) -> list[merging.Run]:
        """The sorted runs of one table version, newest first (only a writer needs them: read
        from the add actions' statistics here, not on every snapshot read)."""
        if version is None:
            return []
        with self.lock:
            runs = self._runs.get((name, version))
            if runs is None:  # a commit asks for each table it wrote (3.6 ms a time under cProfile)
                runs = self.keep_runs(name, version, merging.runs_of(
                    pl.DataFrame(self.actions_at(name, version)), self._path(name)))
            return runs

    def keep_runs(self, name: str, version: int, runs: list[merging.Run]) -> list[merging.Run]:
        _bounded(self._runs, self._head())
        self._runs[(name, version)] = runs
        return runs

    def note_append(self, name: str, version: int, add: dict[str, Any] | None) -> None:
        """Note the files and add actions of a version this process appended `add` to (the
        cache lock is held), from those of the version before, when they are known."""
        files = self._files.get((name, version - 1))
        if files is not None:
            new = [] if add is None else [os.path.abspath(os.path.join(self._path(name), add["path"])) if self.local
                                          else objects.join(self._path(name), add["path"])]
            self.keep_files(name, version, [*files, *new])
        actions = self._actions.get((name, version - 1))
        if name in SORT_BY and actions is not None:
            self.keep_actions(name, version, actions if add is None else appends.with_action(actions, add))
        runs = self._runs.get((name, version - 1))
        if name in SORT_BY and add is not None and runs is not None:
            # the new file is a run of its own, newer than every other: the runs need not be
            # drawn from every file's statistics again (3 ms a table in a small batch's commit)
            run = merging.run_of_add(add, self._path(name))
            if run is not None and (not runs or run.first > runs[0].last):
                self.keep_runs(name, version, [run, *runs])

    def note_merge(self, name: str, before: int, version: int, actions: pa.Table, gone: list[str],
                    adds: list[dict[str, Any]]) -> None:
        """Note the files and statistics of `version`, which replaced the files `gone` (paths in
        the table) of version `before` (whose add actions are `actions`) by `adds`: the next
        reads need not load the log."""
        with self.lock:
            removed = set(gone)
            self.keep_files(name, version, [
                *(f for f in self.files(name, before) if file_name(f) not in removed),
                *(os.path.abspath(os.path.join(self._path(name), add["path"])) if self.local
                  else objects.join(self._path(name), add["path"]) for add in adds)])
            kept = actions.filter(pc.invert(pc.is_in(actions.column("path"), pa.array(gone))))
            for add in adds:
                kept = appends.with_action(kept, add)
            self.keep_actions(name, version, kept)


def _bounded(cache: dict[tuple[str, int], Any], head: Head) -> None:
    """Before a cache of table versions takes one more: past 4 versions a table on average,
    keep only each table's newest `KEPT_VERSIONS` and the version `head` names. A cache
    cleared whole made the next reads load every table's log again: on object storage about
    40 requests a table, a call in 20."""
    if len(cache) <= 4 * len(STORED):
        return
    newest: dict[str, list[int]] = {}
    for name, version in cache:
        newest.setdefault(name, []).append(version)
    keep = {(name, v) for name, versions in newest.items() for v in sorted(versions)[-KEPT_VERSIONS:]}
    keep |= set(head.versions.items())
    for key in [key for key in cache if key not in keep]:
        del cache[key]
