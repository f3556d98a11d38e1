"""The store: Delta Lake tables under one URI, and the batch commit protocol.

Every table is an append-only Delta log: keyed tables get one row per changed key per batch
(`_batch`, `_deleted` tombstones); the current view is the newest row per key. A batch never
rewrites existing files, so it costs what it writes, whatever the size of the store.

Atomicity across tables: the `_ledger` table is the commit point. A batch appends to each table
(one Delta commit each), then appends one ledger row naming every table's version. Readers load
each table at the version the last ledger row names, so they never see half a batch and never
change anything. Writers commit one at a time under a lock file; a writer holding the lock that
finds a table ahead of the ledger (left by a writer that died between the two steps) restores it
to the ledger's version before appending, so the dead batch's rows are never published; the
batch then simply runs again.

Opening never creates a store where one is (`store_state`): a missing path or an empty folder
gets a new store (unless `create=False`); a folder holding any table, Delta log or other file
but no ledger is refused. Damage (a log entry or data file missing or unreadable) raises
`StoreDamaged` naming the file; `store/check.py` is the `engagelake check` behind it.

`DeltaStore` is the coordinator: it opens or creates a store and runs a batch's commit, and
hands the rest to collaborators of their own rooms, each given only what it needs:
`TableVersions` (store/versions.py: what each table version holds, cached), `TableWriter`
(store/writes.py: appends), `Ledger` (store/ledger.py: the head and the ledger's rows),
`RunMerger` (store/merger.py: run merges after a commit) and `Compactor` (store/compactor.py).
Names and markers shared by them are in store/layout.py.
"""

from __future__ import annotations

import errno
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import polars as pl

from engagelake.errors import (
    NotAStore,
    StaleStoreError,
    StoreDamaged,
    StoreError,
    StoreReadOnly,
    TurnEndedError,
)
from engagelake.store import compaction, layout, merging, objects, wal
from engagelake.store.compaction import Part, Plan, Written
from engagelake.store.compactor import Compaction, Compactor
from engagelake.store.layout import (
    CREATING,
    LEDGER,
    BatchRow,
    Head,
    Place,
    StoredBatch,
    arrow_schema,
    store_state,
)
from engagelake.store.ledger import Ledger
from engagelake.store.merger import RunMerger
from engagelake.store.runs import footer_budget
from engagelake.store.snapshot import Snapshot
from engagelake.store.versions import TableVersions
from engagelake.store.writes import TableWriter, TableWrites, batch_rows, columns
from engagelake.tables.changes import Changes
from engagelake.tables.schema import INDEXES, SCHEMAS, STORED, TABLES

if TYPE_CHECKING:
    from engagelake.store.staging import Stages


class DeltaStore:
    """A store's coordinator: opening and creating it, the writer's turn, a batch's commit, and
    its collaborators (`versions`, `writer`, `ledger`, `merger`, `compactor`)."""

    def __init__(self, uri: str | Path, *, seed: str | None = None, memory_limit: str | None = None,
                 create: bool = True, mode: int | str | None = None):
        """Open the store at `uri`; where `store_state` finds none (a new path or an empty
        folder) create one, or with `create=False` raise NotAStore. A new local store's folder
        gets `mode` (`layout.store_mode`: 0700 unless set); an existing store's is left as it is."""
        self.uri = str(uri)
        self._mode = mode
        self.place = Place.of(self.uri)
        self.local = self.place.local
        self._lease = self.place.lease  # on object storage, writers take turns through a lease
        self.versions = TableVersions(self.place, lambda: self.ledger.head)
        self.footers = self.versions.footers
        self.column_scans = self.versions.column_scans  # probes that read a whole column (tests)
        self.writer = TableWriter(self.place, self.versions, lambda: self.ledger.head)
        self.ledger = Ledger(self.place, self.writer)
        self.merger = RunMerger(self.place, self.versions, self.writer, self.ledger, self)
        self.compactor = Compactor(self.place, self.versions, self.writer, self.ledger, self.merger, self)
        self.memory_limit = memory_limit
        if store_state(self.uri) == "new":
            if not create:
                raise NotAStore(f"no store at {self.uri}: pass the folder of a store (`Workspace.create` or "
                                "`engagelake demo`/`apply` make one)")
            if self._lease is None:
                self._create(seed or uuid.uuid4().hex)
            else:  # writers that open one new store at once: the first creates it, under the lease
                with self._lease.held(None):
                    if store_state(self.uri) == "new":
                        self._create(seed or uuid.uuid4().hex)
        elif objects.exists(self.place.path(CREATING)):
            self._end_creation()  # the ledger landed: the store is whole
        try:
            self.ledger.head = self.ledger.read_head()
        except StoreError:
            raise
        except Exception as error:  # noqa: BLE001 - deltalake's own errors: translated or re-raised
            raise self.damaged(error) from error
        self._exclusive_owner: int | None = None  # the thread inside `exclusive`
        # the writer lock kept across batches by the owner of an in-memory layer (`hold`): its
        # batches and flushes, and this store's merges, take turns on `_held_turn` instead
        self._held: ExitStack | None = None
        self._held_turn = threading.RLock()
        self.wal_live: set[Path] = set()  # the segments of this process's live layers
        self.replayed = 0  # batches of dead writers' logs this store wrote (`replay_logs`)
        if self.local and wal.segments(Path(self.uri)):
            self._replay_at_open()
        # failures after a batch's ledger row landed: the batch is committed all the same
        self.commit_errors: list[BaseException] = []

    # --- the store's state and settings ----------------------------------------------------------
    @property
    def head(self) -> Head:
        """The last committed batch this store has read: what its snapshots see."""
        return self.ledger.head

    @head.setter
    def head(self, head: Head) -> None:
        self.ledger.head = head

    @property
    def memory_limit(self) -> str | None:
        """The store's memory budget ("2GB"): DuckDB's for merges and compaction (it spills
        beyond), and half of it for the parsed footers probes keep."""
        return self._memory_limit

    @memory_limit.setter
    def memory_limit(self, limit: str | None) -> None:
        self._memory_limit = limit
        self.footers.budget = footer_budget(limit)

    @property
    def response_retention(self) -> timedelta:
        """How long a keyed batch's responses are kept (a workspace setting, `Workspace.open`)."""
        return self.compactor.retention

    @response_retention.setter
    def response_retention(self, retention: timedelta) -> None:
        self.compactor.retention = retention

    @property
    def merge_trigger(self) -> int:
        """Runs a table may hold besides its newest before a commit merges it (`merging.plan`)."""
        return self.merger.trigger

    @merge_trigger.setter
    def merge_trigger(self, trigger: int) -> None:
        self.merger.trigger = trigger

    @property
    def background_merges(self) -> bool:
        """Whether run merges follow a commit in a thread (False: before `commit` returns)."""
        return self.merger.background

    @background_merges.setter
    def background_merges(self, background: bool) -> None:
        self.merger.background = background

    @property
    def merges(self) -> list[tuple[str, int, float]]:
        """The run merges made: (table, runs merged, seconds)."""
        return self.merger.merges

    @property
    def merge_errors(self) -> list[BaseException]:
        """Merge passes that failed (the batches are committed; the store is intact)."""
        return self.merger.errors

    def _create(self, seed: str) -> None:
        """Every table empty, then the ledger; a marker file says a creation is under way, so
        that a creation that died before its ledger is done again, not taken for damage."""
        if self.local:
            root = Path(self.uri)
            if not root.parent.is_dir():  # a mistyped path must not grow a tree of folders and a store
                raise StoreError(f"cannot create a store at {self.uri}: its parent folder {root.parent} does not "
                                 "exist; create it first, or pass the path of an existing store")
            mode = layout.store_mode(self._mode)
            existed = root.is_dir()
            try:
                root.mkdir(mode=mode, exist_ok=True)
                try:  # exactly `mode`, whatever the umask, and for an empty folder made before
                    os.chmod(root, mode)
                except PermissionError:
                    if not existed:
                        raise
                (root / CREATING).touch()
            except OSError as error:
                raise StoreError(f"cannot create a store at {self.uri}: {error.strerror}") from error
        else:  # (created under the lease: `__init__`)
            objects.touch(self.place.path(CREATING))
        versions = {name: self.writer.create_table(name) for name in STORED}
        layout.failpoint("create:before_ledger")
        self.ledger.append(0, None, versions, 0, 0, seed, [], kind="batch", create=True)
        self._end_creation()

    def _end_creation(self) -> None:
        with suppress(OSError):  # read-only: the next writer removes it
            objects.remove(self.place.path(CREATING))

    def damaged(self, error: BaseException) -> BaseException:
        """The error to raise for `error`, raised by a read or write below: StoreReadOnly for a
        write the file system refused, StoreDamaged naming the first problems `engagelake check`
        finds, else `error` itself."""
        if isinstance(error, OSError) and error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            where = error.filename or self.uri
            return StoreReadOnly(f"the store at {self.uri} cannot be written ({error.strerror}: {where}): it can be "
                                 "read, not written")
        if not self.local:
            return error
        from engagelake.store import check  # only on this error path

        report = check.check_store(self.uri)
        if report.healthy and _decoding(error):  # a page damaged under a sound footer: found by decoding
            report = check.check_store(self.uri, deep=True)
        if report.healthy:
            return error
        hint = (f"run `engagelake repair --store {self.uri}`" if not report.unrepairable()
                else "restore the files named from a backup")
        deep = " --deep" if report.deep else ""
        return StoreDamaged(f"the store at {self.uri} is damaged ({len(report.problems)} problem(s)); {hint}; "
                            f"`engagelake check{deep} --store {self.uri}` lists every problem:\n{check.describe(report)}")

    # --- the writer's turn ------------------------------------------------------------------------
    @contextmanager
    def writer_lock(self) -> Iterator[None]:
        """One writer at a time: an advisory lock file in a local folder, a lease on object
        storage (`store/lease.py`). A thread inside `exclusive` holds it already."""
        if self._exclusive_owner == threading.get_ident():
            yield
            return
        if self._held is not None:
            with self._held_turn:
                yield
            return
        if self._lease is not None:
            with self._lease.held(None):  # a dead holder's lease ends on its own
                yield
            return
        with layout.writer_lock(Path(self.uri)):
            yield

    @contextmanager
    def exclusive(self, timeout: float) -> Iterator[None]:
        """Hold the writer lock for a whole batch, its reads and its commit, so that no other
        writer commits in between: a batch that another writer overtook runs again inside,
        and cannot be overtaken twice. Waits up to `timeout` seconds for the lock (polling,
        with jitter), then raises `StoreError`. On object storage the lock is the store's lease."""
        # a run merge takes the lock too: joining one while holding the lock would never end
        self.merger.wait()
        if self._held is not None:
            with self._held_turn:
                yield
            return
        with self._lease.held(timeout) if self._lease is not None else layout.writer_lock(Path(self.uri), timeout):
            self._exclusive_owner = threading.get_ident()
            try:
                yield
            finally:
                self._exclusive_owner = None

    def exclusive_here(self) -> bool:
        """Whether this thread is inside `exclusive`."""
        return self._exclusive_owner == threading.get_ident()

    @property
    def held(self) -> bool:
        """Whether this store keeps the writer lock across batches (`hold`)."""
        return self._held is not None

    def hold(self, timeout: float) -> None:
        """Take the writer lock and keep it until `release`: an in-memory layer's owner holds it
        from its first batch to the flush, so that no other writer commits over batches it has
        answered and not yet written (`store/layer.py`). Dead writers' logs are replayed first.
        Waits up to `timeout` seconds, as `exclusive` does. A folder's lock only."""
        assert self.local, "an in-memory layer is kept over a local folder only"
        if self._held is not None:
            return
        # (a run merge under way publishes through `_held_turn` once the lock is held here)
        stack = ExitStack()
        stack.enter_context(layout.writer_lock(Path(self.uri), timeout))
        self._held = stack
        try:
            with self._held_turn:
                self.refresh()
                self.recover()
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Give the writer lock back (`hold`)."""
        stack, self._held = self._held, None
        if stack is not None:
            with self._held_turn:
                stack.close()

    def _replay_at_open(self) -> None:
        """A dead writer's log is replayed by whoever opens the store and can take the lock at
        once; a live layer's owner holds it (and a read-only store is left as it is)."""
        with ExitStack() as lock:
            try:
                lock.enter_context(layout.writer_lock(Path(self.uri), 0.0, mark=False))
            except (StoreError, OSError):  # held by a live writer, or not ours to write
                return
            self.ledger.head = self.ledger.read_head()
            self.recover()  # a log that cannot be read raises here: damage is told, not skipped

    def refresh(self) -> bool:
        """True when another writer committed since we last looked (then the head is re-read).
        A cheap check: only the ledger's new log entries are read (`Ledger.refresh`)."""
        return self.ledger.refresh()

    def recover(self, head: Head | None = None, tables: list[str] | None = None) -> None:
        """Roll back tables (of `tables`, default all) that hold writes of a batch (or a merge)
        that never reached the ledger (a dead writer's); only called under the writer lock, so
        no live writer is mid-commit. A dead compaction is rolled forward instead (it changed
        no content; its old files are gone)."""
        head = head or self.head
        if self._lease is not None and self._lease.clean_before:
            return  # the writer before this lease finished cleanly: nothing to roll back
        if self.place.compacting():
            # an index the head does not name yet may be half built: it stays unpublished (and
            # probes scan its column) until the next compaction builds it whole
            unbuilt = {index for index in INDEXES if index not in self.head.versions}
            self.compactor.finish_compaction(self.head.batch_no + 1, [n for n in STORED if n not in unbuilt])
            objects.remove(self.compactor.marker())
            return
        for name in STORED if tables is None else tables:
            # a table the ledger does not name yet was created (and maybe written) by a dead writer
            version = head.versions.get(name, 0)
            if self.local and name in head.versions and not self.place.log_entry(name, version + 1).exists():
                continue  # no commit after the ledger's version: nothing to roll back (loading
                # each of the 34 tables cost a small batch's commit 140 ms)
            if not objects.is_delta_table(self.place.path(name)):
                continue
            table = objects.delta_table(self.place.path(name))
            if table.version() > version:
                self.refuse_lost_batch(head)
                table.restore(version)
                # the version this process wrote last is no longer the table's newest: an
                # append or a merge on it would put the entry the restore took
                self.writer.forget(name)
        if tables is None and self.local:
            self.replay_logs()

    def replay_logs(self) -> int:
        """Write the batches of dead writers' logs that the tables do not hold (under the
        writer lock, after the roll-back of their half-written tables), each log as one commit,
        and remove the logs; returns the batches written. A log after whose floor the ledger
        holds enough content batches was written already (`store/wal.py`)."""
        from engagelake.store.staging import Stages  # only when a log is left

        written = 0
        for path in wal.segments(Path(self.uri), but=self.wal_live):
            log = wal.read(path)
            records = log.records
            landed = self.ledger.batches_after(log.floor) if records else 0
            if records and log.before < landed < log.before + len(records):
                raise StoreDamaged(f"the write-ahead log segment {path} holds {len(records)} batches of which the "
                                   f"ledger holds only some ({landed - log.before}): a flush writes all or none")
            if records and landed <= log.before:
                stages = Stages()
                try:
                    for record in records:
                        stages.add(Changes(parts={name: [frame] for name, frame in record.changes.items()}),
                                   record.pairs)
                    self.write_records(records, stages)
                finally:
                    stages.remove()
                written += len(records)
            path.unlink(missing_ok=True)
        self.replayed += written
        return written


    def refuse_lost_batch(self, head: Head) -> None:
        """Before a rollback: raise StoreDamaged when a ledger row file of a later batch is in no
        ledger log entry (the entry was lost: rolling back would drop a committed batch). The
        writer lock is held, so no live writer is between its row file and its log entry."""
        if not self.local:
            return
        from engagelake.store import check  # only when a table is ahead of the ledger

        if lost := check.lost_ledger_rows(Path(self.uri), objects.delta_table(self.place.path(LEDGER)), head.batch_no):
            path, batch = lost[0]
            raise StoreDamaged(
                f"the store at {self.uri} holds the ledger row of batch {batch} ({path}) but no ledger log entry "
                f"for it: the ledger's newest log entry was deleted or lost, and rolling the tables back would drop "
                f"the batch. Restore the entry from a backup, or see `engagelake check --store {self.uri}` and "
                f"`engagelake repair --store {self.uri}` (which discards batch {batch})")

    # --- reads ------------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The committed tables at the current head, read on demand (nothing is read here)."""
        self.compactor.settle()
        return Snapshot(self.versions, self.head)

    def snapshot_at(self, batch_no: int) -> Snapshot:
        """The committed tables as batch `batch_no` left them (a ledger row: a batch, a merge or
        a compaction), for readers in several processes that must see one cut. Their files
        stay until a compaction after it deletes them; a read then fails."""
        self.refresh()
        if batch_no == self.head.batch_no:
            return self.snapshot()
        r = self.ledger.row(("batch_no", batch_no), ["versions", "next_profile_n", "next_update_seq", "seed"])
        if r is None:
            raise StoreError(f"the store at {self.uri} holds no batch {batch_no} (its newest is "
                             f"{self.head.batch_no})")
        self.compactor.settle()
        return Snapshot(self.versions, Head(batch_no, orjson.loads(r["versions"]), r["next_profile_n"],
                                            r["next_update_seq"], r["seed"], content_batch=batch_no))

    def find_batch(self, key: str) -> StoredBatch | None:
        """The committed batch with this idempotency key, if any (`Ledger.find_batch`)."""
        return self.ledger.find_batch(key)

    # --- a batch's commit -------------------------------------------------------------------------
    def commit(self, changes: Changes, *, key: str | None, responses: list[Any], next_profile_n: int,
               next_update_seq: int, index_entries_stored: dict[str, pl.DataFrame] | None = None,
               staged: Stages | None = None, digest: str | None = None,
               subjects: pl.Series | None = None, read_at: int | None = None) -> None:
        """Write one batch: every table's rows, then the ledger row that makes them visible.
        Raises StaleStoreError when another writer committed a batch since this one read the
        store (merges and compactions since then change no content: the batch still holds).
        Tables that now hold too many runs are merged afterwards (`merge_runs`).
        `index_entries_stored` names index entries the store holds already (those of stored
        rows the batch read): they are not written again. `staged` holds the batch's staged
        changes besides `changes`: its sorted tables stream from the stage files into their
        runs, the others come through `changes` (`Stages.changes`). `digest`: of the batch's
        requests, stored beside its key; `subjects`: the users the batch read or wrote, stored
        with a keyed batch's responses; `read_at`: the content batch of the head the batch read
        (default: the current head's), so that nothing that moves the head meanwhile can hide a
        batch it never read. A run merge may be under way meanwhile: it takes the writer lock
        only to publish its merged runs (`merge_runs`)."""
        base = self.head.content_batch if read_at is None else read_at
        self.merger.begin_commit()
        with self.writer_lock():
            self.refresh()  # the ledger is read again only if an entry came since we looked
            if self.head.content_batch != base:  # (before anything is written: `lease.held` relies on it)
                raise StaleStoreError(f"the store at {self.uri} changed since this batch read it")
            self.recover()
            if self.head.content_batch != base:  # a dead writer's log was replayed: read it first
                raise StaleStoreError(f"the store at {self.uri} wrote a dead writer's logged batches")
            row = BatchRow(key, responses, digest, None if subjects is None else subjects.to_list())
            self.write_batch(changes, [row], next_profile_n=next_profile_n, next_update_seq=next_update_seq,
                             index_entries_stored=index_entries_stored or {}, staged=staged)
        self.merger.after_commit()

    def commit_layer(self, records: list[wal.Record], stages: Stages) -> None:
        """Write an in-memory layer's batches (`store/layer.py`), answered already, as one
        commit: their staged rows, then one ledger row each. The layer's owner holds the lock
        (`hold`), so nothing can have overtaken them."""
        self.merger.begin_commit()
        with self.writer_lock():
            self.recover()  # a flush that failed half-way left tables ahead of the ledger
            self.write_records(records, stages)
        self.merger.after_commit()

    def write_records(self, records: list[wal.Record], stages: Stages) -> None:
        """`write_batch` of logged batches, staged in `stages` one stage each."""
        rows = [BatchRow(r.key, r.responses, r.digest, r.subjects, r.answered_at) for r in records]
        self.write_batch(stages.changes(), rows, next_profile_n=records[-1].next_profile_n,
                         next_update_seq=records[-1].next_update_seq, staged=stages,
                         index_entries_stored={index: pl.concat(frames)
                                               for index, frames in stages.index_entries_stored().items()})

    def write_batch(self, changes: Changes, rows: list[BatchRow], *, next_profile_n: int, next_update_seq: int,
                    index_entries_stored: dict[str, pl.DataFrame], staged: Stages | None) -> None:
        """Write the rows of one batch, or of several logged ones (`rows`: what the ledger keeps
        of each), stamped with the last one's number, then their ledger rows."""
        batch_no = self.head.batch_no + len(rows)
        versions = dict(self.head.versions)
        streamed = staged.streamed() if staged is not None else set()
        self.writer.runs_to_index = []  # none left from a write that failed
        layout.failpoint("before_tables")
        entries: dict[str, pl.DataFrame] = {}  # per index: the new (value, key) pairs
        writes = TableWrites(self.writer, versions)
        try:
            for name in TABLES:  # a fixed table order: the commit's failpoints depend on it
                upserted: Callable[[list[str]], pl.DataFrame | None]
                if name in streamed:  # streamed from the stages: never whole in memory
                    assert staged is not None
                    writes.write(name, partial(staged.stream, name, batch_no, arrow_schema(name)))
                    upserted = partial(staged.upserted, name)
                elif (merged := changes.merged_table(name)) is not None:
                    ups, dels = merged
                    writes.write(name, partial(batch_rows, name, ups, dels, batch_no))
                    upserted = partial(columns, ups)
                else:
                    continue
                for index, (table, column) in INDEXES.items():
                    # an index exists from the store's creation (or a compaction) on: older stores
                    # scan the column until compaction builds it
                    if table == name and index in versions and (found := upserted(list(SCHEMAS[index]))) is not None:
                        new = found.filter(pl.col(column).is_not_null()).unique()
                        held = index_entries_stored.get(index)
                        if held is not None and held.height:  # a row rewritten with the same value
                            new = new.join(held, on=list(SCHEMAS[index]), how="anti")
                        entries[index] = new
        except BaseException:
            writes.abandon()  # no table is still being appended when the batch's error goes up
            raise
        writes.wait()
        for index in INDEXES:  # written after every table, in a fixed order
            if index in entries and entries[index].height:
                self.writer.write_rows(index, entries[index].with_columns(
                    _batch=pl.lit(batch_no, pl.Int64), _deleted=pl.lit(False)), versions)
        self.merger.note_written(versions, [name for name in versions if versions[name] != self.head.versions.get(name)])
        self.writer.index_runs()
        layout.failpoint("before_ledger")
        try:
            mine = self.ledger.append_rows(self.head.batch_no + 1, rows, versions, next_profile_n, next_update_seq,
                                           self.head.seed, kind="batch", after=self.ledger.version)
        except TurnEndedError:
            raise  # nothing written: a row of this number is another writer's
        except Exception as error:
            # delta-rs may raise after its commit (a checkpoint it writes after the log entry):
            # a batch whose ledger row landed is committed, and saying otherwise would get it
            # applied twice by a caller that retries (the lease is still this writer's: the row
            # of this number is its own)
            if not self.ledger.landed(batch_no):
                raise
            self.commit_errors.append(error)
        else:  # the ledger's version is our own: the next `refresh` looks for the one after it
            assert mine is not None
            self.ledger.version = mine
        layout.failpoint("after_ledger")
        self.head = Head(batch_no, versions, next_profile_n, next_update_seq, self.head.seed, content_batch=batch_no)

    # --- what the collaborators answer ------------------------------------------------------------
    def files(self, name: str, version: int | None) -> list[str]:
        """The data files of one table version (`TableVersions.files`)."""
        return self.versions.files(name, version)

    def file_ranges(self, name: str, version: int, column: str) -> dict[str, tuple[str | None, str | None]]:
        """Each data file's range of `column` at one table version (`TableVersions.file_ranges`)."""
        return self.versions.file_ranges(name, version, column)

    def stored_rows(self, name: str, version: int) -> int:
        """The rows of a table version's files (`TableVersions.stored_rows`)."""
        return self.versions.stored_rows(name, version)

    def holds_partial_rows(self, name: str, version: int | None) -> bool:
        """Whether a file of `name` at `version` may hold partial rows."""
        return self.versions.holds_partial_rows(name, version)

    def runs(self, name: str, version: int | None) -> list[merging.Run]:
        """The sorted runs of one table version, newest first (`TableVersions.runs`)."""
        return self.versions.runs(name, version)

    def merge_runs(self, tables: list[str] | None = None) -> list[str]:
        """One merge pass (`RunMerger.merge_runs`); returns the tables merged."""
        return self.merger.merge_runs(tables)

    def wait_for_merges(self) -> None:
        """Wait for this store's merge pass, if one is running (the next commit, compaction,
        `Workspace.close` and the process's exit do)."""
        self.merger.wait()

    def index_footers(self, name: str, files: list[str] | None = None) -> int:
        """Write the footer indexes of a sorted table's files that have none (`RunMerger.index_footers`)."""
        return self.merger.index_footers(name, files)

    def compact(self, *, on_table: Callable[[str, int, int], None] | None = None) -> dict[str, int]:
        """Rewrite every table as its current rows (`Compactor.compact`); returns the rows kept."""
        return self.compactor.compact(on_table=on_table)

    @contextmanager
    def compaction(self, parts: int = 1, min_part_rows: int = compaction.MIN_PART_ROWS) -> Iterator[Compaction]:
        """A compaction in parts (`Compactor.compaction`)."""
        with self.compactor.compaction(parts, min_part_rows) as job:
            yield job

    def compact_part(self, plan: Plan, part: Part) -> Written:
        """Write `part` of the compaction `plan` as files of its table, not committed."""
        return self.compactor.compact_part(plan, part)


def _decoding(error: BaseException) -> bool:
    """Whether `error` is a reader's failure to decode data (Polars', Arrow's or DuckDB's), not a
    refused or missing file."""
    if isinstance(error, OSError) and not type(error).__module__.startswith("pyarrow"):
        return False
    text = str(error).lower()
    kind = type(error)
    return isinstance(error, pl.exceptions.ComputeError) or "parquet" in text or "thrift" in text \
        or kind.__module__.startswith("pyarrow") or (kind.__name__ == "Error" and "duckdb" in kind.__module__)
