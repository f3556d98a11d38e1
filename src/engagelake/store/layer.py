"""The in-memory layer: batches answered, logged (`store/wal.py`), and not yet in the tables.

A Delta commit costs a small batch most of its time (about 60 ms of 170 for one request, with
the run merges its files bring), whatever it holds. So a workspace that keeps a layer
(`Workspace.open(layer=True)`, `engagelake serve`) answers a batch once its record is synced
to the log, and stages its rows here, one stage a batch, in memory (`store/staging.py`): later
batches and reads of the same workspace read through the layer (`StagedSource`), as a big
batch's later passes read its earlier ones. A flush writes every batch of a layer as one commit,
a ledger row each (`DeltaStore.commit_layer`), then removes its log segment and its stages.

A flush does not stall the batches: the layer due is frozen, a new one takes the next batches,
and a thread of its own commits the frozen one while batches go on over it (they read the
tables as they were before its commit, the frozen layer, then the new one). Once its commit
landed, the next batch (or the flusher) lets it go, under the workspace's turn.

The layers' owner holds the store's writer lock from its first batch until no layer holds one
(`DeltaStore.hold`): no other writer commits over batches it answered. A writer of another
process that waits for the lock marks it (`layout.wanted`): the owner then flushes everything,
lets go, and waits its turn (`docs/decisions.md`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from engagelake.store import layout
from engagelake.store.delta import DeltaStore
from engagelake.store.layout import Head, StoredBatch
from engagelake.store.staging import StagedSource, Stages
from engagelake.store.wal import WAL, Record, Segment
from engagelake.tables.changes import Changes
from engagelake.tables.source import RowSource

# a layer is flushed once its oldest batch is this old, holds this many rows, or its stages
# this many bytes (each a `Workspace.open` setting)
FLUSH_SECONDS = 1.0
FLUSH_ROWS = 250_000
FLUSH_BYTES = 256 << 20


class Layer:
    """One generation of the layer: its batches, their stages and their log segment."""

    def __init__(self, root: Path, floor: int, before: int):
        self.root = root
        # the log's chain: the ledger's batch when the lock was taken, and the batches of the
        # layers before this one since then (`store/wal.py`)
        self.floor, self.before = floor, before
        self.records: list[Record] = []  # what the ledger keeps of each (their rows are staged)
        self.stages: Stages | None = None
        self.segment: Segment | None = None
        self.rows = 0
        self.bytes = 0
        self.started = 0.0  # when the oldest batch was answered (monotonic)
        self.committed: Future[None] = Future()  # a frozen layer's commit

    def __len__(self) -> int:
        return len(self.records)

    def add(self, record: Record) -> Segment:
        """Log `record` (synced when this returns), then stage it."""
        if self.segment is None:
            self.segment = Segment(self.root / WAL, self.floor, self.before)
            self.stages = Stages(in_memory=True)
            self.started = time.monotonic()
        self.segment.append(record)
        assert self.stages is not None
        n = self.stages.count
        self.stages.add(Changes(parts={name: [frame] for name, frame in record.changes.items()}), record.pairs)
        self.bytes += self.stages.size_of(n)
        self.rows += record.rows()
        self.records.append(dataclasses.replace(record, changes={}, pairs={}))
        return self.segment

    def due(self, seconds: float, rows: int, size: int) -> bool:
        return bool(self.records) and (self.rows >= rows or self.bytes >= size
                                       or time.monotonic() - self.started >= seconds)

    def source(self, base: RowSource) -> RowSource:
        return base if self.stages is None else StagedSource(base, self.stages)

    def find(self, key: str) -> StoredBatch | None:
        for record in reversed(self.records):
            if record.key == key:
                return StoredBatch(record.responses, record.digest, record.answered_at)
        return None

    def clear(self, *, keep_log: bool = False) -> None:
        """The layer was written (or is let go: `keep_log`, its segment left for the next writer)."""
        if self.segment is not None:
            self.segment.close() if keep_log else self.segment.remove()
        if self.stages is not None:
            self.stages.remove()
        self.records, self.stages, self.segment = [], None, None
        self.rows = self.bytes = 0


class Layers:
    """A workspace's layers over `store`: the one taking batches, the one being written, the
    flusher thread. `turn` is the workspace's: a batch or a change of layers at a time."""

    def __init__(self, store: DeltaStore, turn: threading.RLock, *, seconds: float = FLUSH_SECONDS,
                 rows: int = FLUSH_ROWS, size: int = FLUSH_BYTES):
        self.store, self.turn = store, turn
        self.root = Path(store.uri)
        self.seconds, self.max_rows, self.max_bytes = seconds, rows, size
        self.current: Layer | None = None
        self.frozen: Layer | None = None
        self.pinned: tuple[RowSource, Head] | None = None  # the tables under the frozen layer
        self.errors: list[BaseException] = []  # flushes that failed (their batches stay logged)
        self._flusher: threading.Thread | None = None
        self._closing = threading.Event()

    def __len__(self) -> int:
        return sum(len(layer) for layer in (self.frozen, self.current) if layer is not None)

    # --- what a batch reads and writes -----------------------------------------------------------
    def hold(self, retry_for: float) -> None:
        """Before a batch: the writer lock (kept until no layer holds a batch), a writer of
        another process that waited for it going first (`layout.wanted`)."""
        if self.store.held:
            return
        deadline = time.monotonic() + retry_for
        while layout.wanted(self.root) and time.monotonic() < deadline:
            time.sleep(0.005)
        self.store.hold(max(deadline - time.monotonic(), 0.0))

    def read(self) -> tuple[RowSource, Head, tuple[int, int] | None]:
        """The source a batch reads (the tables, then the frozen layer, then the current one),
        the head under them, and the counters after the layers' last batch (None: no batch)."""
        self._settle(release=False)
        if self.pinned is not None:
            source, head = self.pinned
        else:
            if not self.store.held:  # (while held, nobody else commits)
                self.store.refresh()
            source, head = self.store.snapshot(), self.store.head
        counters = None
        for layer in (self.frozen, self.current):
            if layer is not None and layer.records:
                source = layer.source(source)
                counters = (layer.records[-1].next_profile_n, layer.records[-1].next_update_seq)
        return source, head, counters

    def add(self, record: Record, head: Head) -> None:
        """A batch's record: logged and synced (it may be answered once this returns), staged;
        then a flush that is due is started. A flush that fails here fails no batch (its
        batches are logged): it is kept in `errors`."""
        if self.current is None:
            self.current = Layer(self.root, head.batch_no, 0)
        self.current.add(record)
        self.store.wal_live = {layer.segment.path for layer in (self.frozen, self.current)
                               if layer is not None and layer.segment is not None}
        try:
            self._flush_when_due()
        except Exception as error:  # noqa: BLE001 - the batch is logged: raising would get it applied twice
            self.errors.append(error)

    def find(self, key: str) -> StoredBatch | None:
        for layer in (self.current, self.frozen):
            if layer is not None and (found := layer.find(key)) is not None:
                return found
        return None

    # --- flushes ---------------------------------------------------------------------------------
    def flush(self) -> int:
        """Write every layer's batches to the tables and let go of the writer lock; returns
        the batches written."""
        with self.turn:
            written = 0
            if self.frozen is not None:
                written += len(self.frozen)
                self.frozen.committed.result()  # raises its commit's error: the batches stay logged
                self._settle()
            if self.current is not None and self.current.records:
                written += len(self.current)
                frozen = self._freeze()
                self._commit(frozen)
                frozen.committed.result()
                self._settle()
            return written

    def _flush_when_due(self) -> None:
        """Under the turn: start the flush of a current layer that is due, in a thread; keep the
        flusher going while a layer holds batches."""
        self._settle()
        current = self.current
        if current is not None and current.records:
            if layout.wanted(self.root):  # another process's writer waits: everything goes, then the lock
                self.flush()
                return
            if self.frozen is None and current.due(self.seconds, self.max_rows, self.max_bytes):
                frozen = self._freeze()
                threading.Thread(target=self._commit, args=(frozen,), name="engagelake-flush", daemon=True).start()
        if self.frozen is None and (self.current is None or not self.current.records):
            return
        if self._flusher is None or not self._flusher.is_alive():
            self._flusher = threading.Thread(target=self._flush_in_time, name="engagelake-flusher", daemon=True)
            self._flusher.start()

    def _freeze(self) -> Layer:
        """Under the turn: the current layer becomes the frozen one, its successor takes the next
        batches over the tables as they are now."""
        frozen, current = self.frozen, self.current
        assert frozen is None and current is not None
        self.pinned = (self.store.snapshot(), self.store.head)
        self.frozen = current
        self.current = Layer(self.root, current.floor, current.before + len(current))
        return current

    def _commit(self, frozen: Layer) -> None:
        """Write the frozen layer (outside the turn: batches go on). Its outcome is in
        `frozen.committed`; `_settle` acts on it."""
        try:
            assert frozen.stages is not None
            self.store.commit_layer(frozen.records, frozen.stages)
            layout.failpoint("layer:flushed")
        except BaseException as error:
            frozen.committed.set_exception(error)
            return
        frozen.committed.set_result(None)

    def _settle(self, *, release: bool = True) -> None:
        """Under the turn: let go of a frozen layer whose commit landed (the tables hold it now),
        and (`release`) of the writer lock when no layer holds a batch. A failed commit's layer
        stays frozen, and is committed again here, until it lands."""
        with self.turn:
            frozen = self.frozen
            if frozen is not None and frozen.committed.done():
                if (error := frozen.committed.exception()) is not None:
                    self.errors.append(error)
                    frozen.committed = Future()
                    self._commit(frozen)  # (the lock is held: its retry is the next writer's only)
                    if not frozen.committed.done() or frozen.committed.exception() is not None:
                        return
                frozen.clear()
                self.frozen, self.pinned = None, None
            if (release and self.frozen is None and (self.current is None or not self.current.records)
                    and self.store.held):
                self.current = None
                self.store.wal_live = set()
                self.store.release()

    def _flush_in_time(self) -> None:
        """The flusher: start a flush once the current layer is due, let go of a written one,
        until no layer holds a batch or the workspace closes."""
        while not self._closing.wait(min(self.seconds / 4, 0.25)):
            with self.turn:
                try:
                    self._flush_when_due()
                except Exception as error:  # noqa: BLE001 - the batches are logged: the next flush or writer writes them
                    self.errors.append(error)
                if self.frozen is None and (self.current is None or not self.current.records):
                    return

    def close(self) -> None:
        """Flush every layer (the workspace's `close`)."""
        self._closing.set()
        if self._flusher is not None:
            self._flusher.join()
            self._flusher = None
        self._closing.clear()
        self.flush()

    def drop(self) -> None:
        """Let go of the layers and the lock without writing them, as a killed process does: the
        log stays for the next writer (tests of recovery)."""
        with self.turn:
            if self.frozen is not None:  # a commit under way ends first (a killed process's ends with it)
                self.frozen.committed.exception()
            for layer in (self.frozen, self.current):
                if layer is not None:
                    layer.clear(keep_log=True)
            self.frozen = self.current = None
            self.pinned = None
            self.store.wal_live = set()
            self.store.release()
