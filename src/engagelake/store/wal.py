"""The write-ahead log of a local store: what makes a batch held in memory (`store/layer.py`)
durable before it is answered.

A batch's record holds its changes after the rules (the rows it writes, as Arrow IPC), the
index entries it read, the store's counters after it, and what the ledger keeps of it (key,
digest, responses, users, the time it was answered). Replay writes those rows again: it runs no
rule, so it gives the same rows by construction, whatever the clock or the code says now.

One segment file, `_wal/<floor>-<before>-<id>.log`, holds the records of one layer: from its
first batch to the flush that writes them all as one commit. The layers' owner holds the writer
lock from the first layer's start to the last one's flush, so the ledger's content batches after
`floor` (its batch when the lock was taken) are that owner's flushes, and `before` says how many
batches the layers before this one held: a segment is written already (its file outlived its
flush by a crash) when the ledger holds `before` + its records such batches after `floor`, and
is replayed by the next writer when it holds `before` or fewer (the earlier segments replayed
first). Appending a record is one `write` and one `fdatasync`; the segment's creation syncs its
folder too. A torn record at the end (a crash inside the write, before its sync, so never
answered) ends the segment.
"""

from __future__ import annotations

import io
import os
import struct
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from engagelake.errors import StoreDamaged
from engagelake.store import appends

WAL = "_wal"  # the log's folder in a store
MAGIC = b"engagelake-wal-1\n"
_FRAME = struct.Struct("<II")  # a record's length and CRC-32


@dataclass
class Record:
    """One batch as the log holds it (and the layer, and the ledger after a flush)."""

    changes: dict[str, pl.DataFrame]  # per table: its rows after the rules, `_deleted` (and `SET`) included
    pairs: dict[str, pl.DataFrame]  # per index: the (value, key) pairs the store holds already
    next_profile_n: int
    next_update_seq: int
    answered_at: datetime
    key: str | None = None
    digest: str | None = None
    responses: list[Any] = field(default_factory=list)  # [[status, body], ...]: kept for a keyed batch
    subjects: list[str] | None = None

    def rows(self) -> int:
        return sum(frame.height for frame in self.changes.values())

    def encode(self) -> bytes:
        frames = [("change", name, frame) for name, frame in self.changes.items()]
        frames += [("pairs", name, frame) for name, frame in self.pairs.items()]
        blobs = []
        for _, _, frame in frames:
            out = io.BytesIO()
            frame.write_ipc(out, compression="uncompressed")
            blobs.append(out.getvalue())
        meta = orjson.dumps({
            "frames": [[kind, name, len(blob)] for (kind, name, _), blob in zip(frames, blobs, strict=True)],
            "next_profile_n": self.next_profile_n, "next_update_seq": self.next_update_seq,
            "answered_at": self.answered_at.isoformat(), "key": self.key, "digest": self.digest,
            "responses": self.responses if self.key is not None else [], "subjects": self.subjects,
        })
        return b"".join([struct.pack("<I", len(meta)), meta, *blobs])

    @classmethod
    def decode(cls, payload: bytes) -> Record:
        (size,) = struct.unpack_from("<I", payload)
        meta = orjson.loads(payload[4:4 + size])
        at = 4 + size
        parts: dict[str, dict[str, pl.DataFrame]] = {"change": {}, "pairs": {}}
        for kind, name, length in meta["frames"]:
            parts[kind][name] = pl.read_ipc(io.BytesIO(payload[at:at + length]))
            at += length
        return cls(parts["change"], parts["pairs"], meta["next_profile_n"], meta["next_update_seq"],
                   datetime.fromisoformat(meta["answered_at"]), meta["key"], meta["digest"], meta["responses"],
                   meta["subjects"])


class Segment:
    """The open segment of a live layer: records are appended and synced one by one."""

    def __init__(self, folder: Path, floor: int, before: int):
        made = not folder.is_dir()
        folder.mkdir(exist_ok=True)
        self.floor, self.before = floor, before
        self.path = folder / f"{floor:012d}-{before:09d}-{uuid.uuid4().hex[:12]}.log"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        self.records = 0
        self._write(MAGIC + orjson.dumps({"floor": floor, "before": before}) + b"\n")
        if appends.syncing():  # the segment's name (and the log's folder) must be durable too
            appends.sync_folder(str(folder))
            if made:
                appends.sync_folder(str(folder.parent))

    def append(self, record: Record) -> None:
        """Write `record` and sync it: it is durable when this returns."""
        payload = record.encode()
        self._write(_FRAME.pack(len(payload), zlib.crc32(payload)) + payload)
        self.records += 1

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        if appends.syncing():
            os.fdatasync(self.fd)

    def remove(self) -> None:
        """The segment's records are in the tables: the file goes (a crash before this leaves
        it to `leftovers`, which finds it written)."""
        self.close()
        self.path.unlink(missing_ok=True)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def segments(root: Path, *, but: frozenset[Path] | set[Path] = frozenset()) -> list[Path]:
    """The segment files of the store at `root`, oldest first (by floor, then `before`), but
    those of `but` (live ones)."""
    folder = root / WAL
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix == ".log" and p not in but)


@dataclass(frozen=True)
class Log:
    """A segment as read back: its chain (`floor`, `before`) and its whole records, in order."""

    floor: int
    before: int
    records: list[Record]


def read(path: Path) -> Log:
    """A segment's chain and its whole records (a torn one at the end is dropped)."""
    data = path.read_bytes()
    if not data.startswith(MAGIC):
        if len(data) < len(MAGIC) and MAGIC.startswith(data):
            return Log(-1, 0, [])  # its header was never synced: no record either
        raise StoreDamaged(f"{path} is not a write-ahead log segment of engagelake: move it out of the store's "
                           f"{WAL} folder")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        return Log(-1, 0, [])
    header = orjson.loads(data[len(MAGIC):end])
    return Log(int(header["floor"]), int(header.get("before", 0)), list(_records(data, end + 1, path)))


def _records(data: bytes, at: int, path: Path) -> Iterator[Record]:
    while at + _FRAME.size <= len(data):
        length, crc = _FRAME.unpack_from(data, at)
        payload = data[at + _FRAME.size:at + _FRAME.size + length]
        # torn: written, never synced, never answered (a record is never empty: zeros that a
        # file system left at the end of a grown file read as an empty frame whose CRC matches)
        if length == 0 or len(payload) < length or zlib.crc32(payload) != crc:
            return
        try:
            yield Record.decode(payload)
        except Exception as error:  # noqa: BLE001 - a whole record that cannot be read is damage
            raise StoreDamaged(f"record {at} of the write-ahead log segment {path} cannot be read "
                               f"({type(error).__name__}: {error}); restore the segment from a backup") from error
        at += _FRAME.size + length
