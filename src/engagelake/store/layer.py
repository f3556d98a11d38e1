"""The in-memory layer: batches answered, logged (`store/wal.py`), and not yet in the tables.

A Delta commit costs a small batch most of its time (about 60 ms of 170 for one request, with
the run merges its files bring), whatever it holds. So a workspace that keeps a layer
(`Workspace.open(layer=True)`, `engagelake serve`) answers a batch once its record is synced
to the log, and stages its rows here, one stage a batch (`store/staging.py`): later batches and
reads of the same workspace read through the layer (`StagedSource`), as a big batch's later
passes read its earlier ones. A flush writes every batch of the layer as one commit, a ledger
row each (`DeltaStore.commit_layer`), then removes the log segment and the stages.

The layer's owner holds the store's writer lock from its first batch to the flush
(`DeltaStore.hold`): no other writer commits over batches it answered, and another process's
writer waits at most until the next flush (`docs/decisions.md`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from engagelake.store.layout import StoredBatch
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
    """The batches of one workspace not yet in the tables, for the store at `root`."""

    def __init__(self, root: Path, *, seconds: float = FLUSH_SECONDS, rows: int = FLUSH_ROWS,
                 size: int = FLUSH_BYTES):
        self.root = root
        self.seconds, self.max_rows, self.max_bytes = seconds, rows, size
        self.records: list[Record] = []  # what the ledger keeps of each (their rows are staged)
        self.stages: Stages | None = None
        self.segment: Segment | None = None
        self.rows = 0
        self.bytes = 0
        self.started = 0.0  # when the oldest batch was answered (monotonic)

    def __len__(self) -> int:
        return len(self.records)

    def add(self, record: Record, floor: int) -> Segment:
        """Log `record` (synced when this returns), then stage it. `floor`: the ledger's batch,
        for the first record's new segment (the writer lock is held since it was read)."""
        if self.segment is None:
            self.segment = Segment(self.root / WAL, floor)
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

    def due(self) -> bool:
        """Whether the layer should be flushed now."""
        return bool(self.records) and (self.rows >= self.max_rows or self.bytes >= self.max_bytes
                                       or time.monotonic() - self.started >= self.seconds)

    def source(self, base: RowSource) -> RowSource:
        """`base` (the store's snapshot) with the layer's rows over it."""
        return base if self.stages is None else StagedSource(base, self.stages)

    def counters(self) -> tuple[int, int] | None:
        """The store's counters after the layer's last batch (None: no batch)."""
        if not self.records:
            return None
        return self.records[-1].next_profile_n, self.records[-1].next_update_seq

    def find(self, key: str) -> StoredBatch | None:
        """The layer's batch with this idempotency key, as the ledger will hold it."""
        for record in reversed(self.records):
            if record.key == key:
                return StoredBatch(record.responses, record.digest, record.answered_at)
        return None

    def clear(self) -> None:
        """The layer was flushed (or is dropped): its log segment and its stages go."""
        if self.segment is not None:
            self.segment.remove()
        if self.stages is not None:
            self.stages.remove()
        self.records, self.stages, self.segment = [], None, None
        self.rows = self.bytes = 0

    def close(self) -> None:
        """Let go of the layer without flushing it (its log stays for the next writer)."""
        if self.segment is not None:
            self.segment.close()
        if self.stages is not None:
            self.stages.remove()
        self.records, self.stages, self.segment = [], None, None
        self.rows = self.bytes = 0
