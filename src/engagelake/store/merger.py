"""Run merges after a commit: a table holding too many sorted runs has its newest merged into
one (`store/merging.py` says which and how), in a thread of its own, published under the
writer lock by one log entry a table and a ledger row of kind "merge".
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import Any

from engagelake.store import appends, layout, merging, objects, records
from engagelake.store.footers import index_path
from engagelake.store.layout import (
    LEDGER,
    MERGE_ENV,
    MERGING,
    Head,
    OnPlace,
    Place,
    Turns,
    arrow_schema,
    files_source,
    stored_schema,
)
from engagelake.store.ledger import Ledger
from engagelake.store.runs import SORT_BY, sort_order
from engagelake.store.versions import TableVersions
from engagelake.store.writes import TableWriter
from engagelake.tables.partial import PARTIAL
from engagelake.tables.schema import KEYS


class RunMerger(OnPlace):
    """A store's run merges: which tables a commit left due, the merge thread, and the passes."""

    def __init__(self, place: Place, versions: TableVersions, writer: TableWriter, ledger: Ledger, turns: Turns):
        self.place, self.versions, self.writer, self.ledger, self.turns = place, versions, writer, ledger, turns
        self.trigger = int(os.environ.get(MERGE_ENV) or merging.MERGE_TRIGGER)
        # merge runs after each commit in a thread of their own (off the batch's latency); False
        # merges before `commit` returns (deterministic layouts for tests and scripts)
        self.background = True
        self.merges: list[tuple[str, int, float]] = []  # run merges: (table, runs merged, seconds)
        self.errors: list[BaseException] = []  # a failed merge pass loses nothing (see merge_runs)
        # the merge passes' thread, made at the first pass and ended with the store (an executor
        # that is no longer referenced ends its thread), and the pass it runs
        self._worker: ThreadPoolExecutor | None = None
        self._pass: Future[None] | None = None
        self._due: set[str] = set()  # tables the last commit left with runs to merge
        # the tables the commit under way leaves so: due only once its ledger row is written (a
        # merge pass that took them earlier would read a head without the batch's runs, find
        # nothing to merge, and leave them unmerged until the next commit)
        self._due_pending: set[str] = set()
        self._due_lock = threading.Lock()  # `_due` and `_merging`, between a batch and the merge thread
        self._merging = False  # a merge pass is running (`start`)

    def begin_commit(self) -> None:
        """A commit starts: no table is due for it yet."""
        self._due_pending = set()

    def note_written(self, versions: dict[str, int], names: list[str]) -> None:
        """The commit under way wrote `names` at `versions`: those holding runs to merge are due
        once its ledger row is written (`after_commit`)."""
        for name in names:
            if name in SORT_BY and self.plan(self.versions.runs(name, versions[name])):
                self._due_pending.add(name)

    def after_commit(self) -> None:
        """The commit's ledger row landed: merge the tables it left due."""
        with self._due_lock:
            self._due |= self._due_pending
        if self._due:
            try:
                self.start()
            except Exception as error:  # noqa: BLE001 - the batch is committed: raising would say it was not
                self.errors.append(error)

    def start(self) -> None:
        """Merge the tables due, in a thread (one merge pass at a time: while one runs, it takes
        the tables a commit made due meanwhile when its pass ends)."""
        with self._due_lock:
            if self._merging:
                return
            due, self._due = [n for n in SORT_BY if n in self._due], set()
            self._merging = bool(due)
        if not due:
            return
        if not self.background:
            self.passes(due)
            return
        if self._worker is None:  # one thread per store, kept: it keeps its DuckDB connection between merges
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engagelake-merge-runs")
        # a process that exits waits for the pass (the executor's threads are joined at exit)
        self._pass = self._worker.submit(self.passes, due)

    def passes(self, due: list[str]) -> None:
        """Merge passes until no table is due. The batch is committed: a failed merge must not
        look like a failed batch (the store is intact; the next writer rolls it back)."""
        while True:
            try:
                self.merge_runs(due)
            except Exception as error:  # noqa: BLE001 - see above
                self.errors.append(error)
            with self._due_lock:
                due, self._due = [n for n in SORT_BY if n in self._due], set()
                if not due:
                    self._merging = False
                    return

    def plan(self, runs: list[merging.Run]) -> list[merging.Run]:
        """The newest runs to merge into one (none, or at least two)."""
        older = merging.plan(runs[1:], runs[0].rows, trigger=self.trigger) if runs else []
        return runs[: 1 + len(older)] if older else []

    def wait(self) -> None:
        """Wait for this store's merge pass, if one is running (the next commit, compaction,
        `Workspace.close` and the process's exit do)."""
        running, self._pass = self._pass, None
        if running is not None:
            running.result()  # `passes` keeps its errors (`errors`): nothing is raised here

    def merge_runs(self, tables: list[str] | None = None) -> list[str]:
        """One merge pass: each sorted table (of `tables`, default all) holding more runs than
        the trigger merges its newest runs (`merging.plan`) into one, and one ledger row of
        kind "merge" publishes them all. Returns the tables merged.

        On a local store the merged files are written without the writer lock (batches commit
        meanwhile: a merge no longer stands in their way). Then, under the lock, each table
        whose merged runs are all still there takes one log entry that removes their files and
        adds the merged ones; a table whose runs went meanwhile (another writer's merge, a
        compaction) drops its merged files. Runs that batches appended since are newer and stay
        as they are, so the merged run replaces exactly what it read.

        A merge changes no content, so a crash midway loses nothing: the tables are ahead of
        the ledger, and the next writer rolls them back to the versions it names; merged files
        never published are left in `_merging/`, which the next compaction removes."""
        if not self.local:
            return self.merge_runs_locked(tables)
        if self.place.compacting():  # a dead compaction: the next batch or reader rolls it forward
            return []
        head = self.ledger.read_head(note=False)
        planned: dict[str, tuple[list[merging.Run], list[tuple[dict[str, Any], int]]]] = {}
        folder = Path(self.uri) / MERGING / uuid.uuid4().hex
        try:
            for name in SORT_BY if tables is None else tables:
                runs = self.versions.runs(name, head.versions.get(name))
                if chosen := self.plan(runs):
                    folder.mkdir(parents=True, exist_ok=True)
                    planned[name] = (chosen, self.merged_files(name, chosen, bottom=len(chosen) == len(runs),
                                                                into=str(folder)))
            merged, before, versions = self.publish(planned, str(folder)) if planned else ([], {}, {})
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # the merged files of tables not published
        for name in merged:
            old = set(self.versions.files(name, before.get(name)))
            new = set(self.versions.files(name, versions[name]))
            self.index_footers(name, [f for f in new if f not in old])
            if name in records.TABLES:  # readers of an older head read the replaced files as Parquet
                for gone in old - new:
                    records.remove(index_path(self.uri, gone))
        return merged

    def publish(self, planned: dict[str, tuple[list[merging.Run], list[tuple[dict[str, Any], int]]]],
                        folder: str) -> tuple[list[str], dict[str, int], dict[str, int]]:
        """Under the writer lock, swap in each planned table's merged files where its runs are
        all still there, then write the ledger row; returns the tables merged and the table
        versions before and after."""
        with self.turns.writer_lock():
            if self.place.compacting():
                return [], {}, {}
            head = self.ledger.read_head(note=False)
            # the tables it merges must hold no dead writer's rows; the others keep the ledger's
            # versions here, and the next writer rolls them back
            self.turns.recover(head, list(planned))
            versions = dict(head.versions)
            merged = []
            for name, (runs, written) in planned.items():
                version = versions.get(name)
                with self.versions.lock:
                    actions = self.versions.actions_at(name, version) if version is not None else None
                present = {} if actions is None else dict(zip(
                    actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist(), strict=True))
                root = self._path(name).rstrip("/") + "/"
                gone = [f.removeprefix(root) for run in runs for f in run.files]
                if version is None or actions is None or not all(path in present for path in gone):
                    continue  # merged meanwhile by another writer, or compacted
                adds = [add for add, _ in written]
                appends.move_in(self._path(name), folder, adds)
                # after the newest version: a rollback (`DeltaStore.recover`) adds versions after the ledger's
                newest, columns = self.writer.newest(name)
                versions[name] = appends.commit(self._path(name), newest + 1, adds, sum(n for _, n in written),
                                                [(path, present[path]) for path in gone])
                self.writer.keep_newest(name, versions[name], columns)
                self.versions.note_merge(name, version, versions[name], actions, gone, adds)
                merged.append(name)
                layout.failpoint(f"merge:{name}")
            self.ledger_row(head, versions, merged)
        return merged, dict(head.versions), versions

    def ledger_row(self, head: Head, versions: dict[str, int], merged: list[str], *,
                          after: int | None = None) -> None:
        """The ledger row of kind "merge" that publishes the tables `merged` (none: no row)."""
        if merged:
            layout.failpoint("before_merge_ledger")
            self.ledger.append(head.batch_no + 1, None, versions, head.next_profile_n, head.next_update_seq,
                                head.seed, [], kind="merge", after=after)

    def merged_files(self, name: str, runs: list[merging.Run], *, bottom: bool, into: str | None = None,
                      sizes: list[int] | None = None) -> list[tuple[dict[str, Any], int]]:
        """The newest `runs` of `name` merged into one run, written as files in `into` (None:
        in the table's folder); returns their add actions and row counts. `sizes`: of the runs'
        files, in order, when known."""
        started = time.perf_counter()
        files = [f for run in runs for f in run.files]
        order = sort_order(name, KEYS[name])
        assert order is not None
        with merging.kept_connection(self.turns.memory_limit) as con:
            source = files_source(con, name, files, arrow_schema(name), partial=name in PARTIAL, local=self.local,
                                   sizes=sizes)
            sql = merging.merge_sql(name, list(stored_schema(name)), KEYS[name], order, source, since=runs[-1].first,
                                    bottom=bottom, fold=any(run.partial for run in runs))
            written = appends.write_files(self._path(name), merging.stream(con, sql, arrow_schema(name)),
                                          arrow_schema(name), layout.file_options(name), file_bytes=layout.MERGED_FILE_BYTES,
                                          into=into)
        self.merges.append((name, len(runs), time.perf_counter() - started))
        return written

    def merge_runs_locked(self, tables: list[str] | None) -> list[str]:
        """`merge_runs` on object storage: the whole pass under the writer lock, each table
        rewritten by delta-rs."""
        with self.turns.writer_lock():
            if self.place.compacting():
                return []
            ledger = self.writer.latest(LEDGER)
            head = self.ledger.read_head(ledger, note=False)
            self.turns.recover(head, list(SORT_BY) if tables is None else tables)
            versions = dict(head.versions)
            merged = []
            for name in SORT_BY if tables is None else tables:
                runs = self.versions.runs(name, versions.get(name))
                if chosen := self.plan(runs):
                    versions[name] = self.merge(name, chosen, bottom=len(chosen) == len(runs), named=versions.get(name))
                    merged.append(name)
                    layout.failpoint(f"merge:{name}")
            self.ledger_row(head, versions, merged, after=ledger.version())
        return merged

    def merge(self, name: str, runs: list[merging.Run], *, bottom: bool, named: int | None) -> int:
        """Write the newest `runs` of `name` as one run that replaces them in a single Delta
        commit (see `store/merging.py`); returns the table's new version."""
        if (version := self.merge_remote(name, runs, bottom=bottom, named=named)) is not None:
            return version
        started = time.perf_counter()
        since = runs[-1].first
        files = [f for run in runs for f in run.files]
        order = sort_order(name, KEYS[name])
        assert order is not None
        schema = arrow_schema(name)
        with merging.kept_connection(self.turns.memory_limit) as con:
            # DuckDB's own S3 reader would download its extension (`files_source`)
            source = files_source(con, name, files, schema, partial=name in PARTIAL, local=self.local)
            sql = merging.merge_sql(name, list(stored_schema(name)), KEYS[name], order, source, since=since,
                                    bottom=bottom, fold=any(run.partial for run in runs))
            table = self.writer.at_named(name, named)
            objects.write_delta(table, merging.stream(con, sql, schema), mode="overwrite",
                                predicate=f"_batch >= {since}", writer_properties=layout.writer(name))
        self.writer.keep_table(name, table)  # the next append need not load the log again (`_latest`)
        self.writer.forget_newest(name)
        with self.versions.lock:  # nor need the appends and reads after it (`_note_append`)
            self.versions.note_files(name, table.version(), table)
            self.versions.note_actions(name, table.version(), table)
        self.merges.append((name, len(runs), time.perf_counter() - started))
        return table.version()

    def merge_remote(self, name: str, runs: list[merging.Run], *, bottom: bool, named: int | None) -> int | None:
        """A merge on object storage as on a folder: the merged files written in the table,
        then a log entry of our own that removes the runs' files and adds them, put only where
        none is. delta-rs' predicate overwrite made about 55 requests a table for a small one
        (the log loaded, every file of the runs read again to find the predicate's rows); this
        makes the merge's reads, a PUT a file and one for the entry. None for a table gaining
        columns (delta-rs then), or on a folder."""
        if self.local or named is None:
            return None
        version, columns = self.writer.remote_base(name, named)
        if not set(arrow_schema(name).names) <= columns:
            return None
        with self.versions.lock:
            actions = self.versions.actions_at(name, version)
        present = dict(zip(actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist(), strict=True))
        root = self._path(name).rstrip("/") + "/"
        gone = [f.removeprefix(root) for run in runs for f in run.files]
        assert all(path in present for path in gone), "the runs are files of the version the ledger names"
        written = self.merged_files(name, runs, bottom=bottom, sizes=[present[path] for path in gone])
        adds = [add for add, _ in written]
        try:
            mine = appends.commit(self._path(name), version + 1, adds, sum(n for _, n in written),
                                  [(path, present[path]) for path in gone])
        except BaseException:
            self.writer.forget_newest(name)
            for add in adds:
                with suppress(Exception):  # the commit's error is the one to tell
                    objects.remove(objects.join(self._path(name), add["path"]))
            raise
        self.writer.keep_newest(name, mine, columns)
        self.versions.note_merge(name, version, mine, actions, gone, adds)
        return mine

    def index_footers(self, name: str, files: list[str] | None = None) -> int:
        """Write the footer indexes of `files` of a sorted table (default: its current files)
        that have none (`store/footers.py`): a fresh process then probes them without parsing
        their footers. Returns how many it wrote."""
        if not self.local or name not in SORT_BY:
            return 0
        if files is None:
            files = self.versions.files(name, self.ledger.read_head(note=False).versions.get(name))
        try:
            return self.versions.footers.index(files, SORT_BY[name])
        except OSError:  # a file a compaction removed meanwhile, or a read-only store
            return 0
