"""The writer lock of a store on object storage: a lease, taken by committing a Delta table's
next version.

A local store's writers take turns through a lock file (`delta.writer_lock`). Object storage
has no such file, and without turns two writers interleave their table versions: on a moto S3
store, 3 processes of 5 track calls each answered 12 of them 201 and kept 5 (`docs/object-
storage.md`). What object storage does have, and delta-rs uses for every commit, is an atomic
create-if-absent of a log entry (S3's conditional put). So a writer takes the lease by
committing version `v + 1` of the table `_writer_lease` (an empty commit whose metadata names
the holder and when its lease ends) on the version `v` it read, with no retry: of two writers
that read `v`, one commits and the other's commit fails. A holder renews its lease while it
holds it, and gives it back with a commit of its own. A dead writer's lease ends after
`LEASE_S`; the next writer then takes it, and rolls back what the dead one left (`DeltaStore.recover`).

A writer that has lost its lease (it did not renew in time: a process paused for longer than
the lease) must not publish: `check` raises before the ledger row is written.

The lease reads and writes its table's log itself: a listing of the entries after the newest
version it knows, that entry read, and a commit as one conditional put of the next entry
(`objects.put_new`). Through delta-rs a lease commit made about nine requests (its log loaded
again, listed before and after the commit, the entry read back twice); now two or three, so a
writer's turn (taken, given back) makes about five instead of twenty.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pyarrow as pa
from deltalake.exceptions import DeltaError

from engagelake.errors import StaleStoreError, StoreError, TurnEndedError
from engagelake.store import checkpoints, objects
from engagelake.version import __version__

LEASE = "_writer_lease"  # the table, beside the store's tables
# how long a lease lasts unless renewed: a writer that died holding it delays the next one by
# as much (`ENGAGELAKE_LEASE_S`; shorter fails over sooner, but a holder must renew in time)
LEASE_S = float(os.environ.get("ENGAGELAKE_LEASE_S") or 60.0)
RENEW_EVERY_S = LEASE_S / 4  # a holder renews this often
_SCHEMA = pa.schema([("holder", pa.string())])  # never holds a row: the commits' metadata says it all
CHECKPOINT_EVERY = 100  # lease versions between checkpoints (a fresh process lists the entries since)
_JITTER = random.Random()


class Lease:
    """One writer's turn at a store on object storage (`acquire`, then `release`)."""

    def __init__(self, store_uri: str):
        self.store = store_uri.rstrip("/")
        self.uri = f"{self.store}/{LEASE}"
        self.holder = uuid.uuid4().hex  # this writer, in the commits' metadata
        self._version: int | None = None  # the lease table's newest version this lease read or wrote
        self._last: dict[str, Any] | None = None  # ... and the state it says ({}: none)
        self._held = False
        self._lost: str | None = None  # why the lease was lost while held
        self.clean_before = False  # the last holder gave the lease back cleanly (see `acquire`)
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._lock = threading.Lock()  # one commit of ours at a time (the renewer's, or ours)
        self._turn = threading.Lock()  # one thread of this process holds the lease at a time

    @contextmanager
    def held(self, timeout: float | None) -> Iterator[None]:
        """The lease for the block; given back as clean unless the block raised (it may have
        written table versions that no ledger row names). Threads of this process take turns
        first (a batch's commit and a run merge after the last one)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._turn.acquire(timeout=-1 if timeout is None else timeout):
            raise self._busy(timeout)
        try:
            self.acquire(None if deadline is None else max(deadline - time.monotonic(), 0.0))
            try:
                yield
            except StaleStoreError:  # raised before a commit writes anything
                self.release(clean=True)
                raise
            except BaseException:
                self.release(clean=False)
                raise
            self.release(clean=True)
        finally:
            self._turn.release()

    def acquire(self, timeout: float | None) -> None:
        """Wait for the lease (polling, with jitter) and take it; after `timeout` seconds
        (None: no end) raise StoreError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self._read()
            if _mine(state, self.holder):  # an acquire of ours that landed though its put reported an error
                self.clean_before = False  # what came before it is not known: roll back what may be left
                break
            if state is None or state["op"] == "release" or float(state["until"]) <= time.time():
                if self._commit("acquire"):
                    # the writer before gave the lease back after a block that raised nothing:
                    # no table holds a version the ledger does not name (`DeltaStore.recover`)
                    self.clean_before = state is not None and state["op"] == "release" and state.get("clean") == "1"
                    break
            if deadline is not None and time.monotonic() >= deadline:
                raise self._busy(timeout)
            time.sleep(_JITTER.uniform(0.02, 0.1))
        self._held, self._lost = True, None
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew, name="engagelake-lease", daemon=True)
        self._renewer.start()

    def _busy(self, timeout: float | None) -> StoreError:
        return StoreError(f"another writer held the store at {self.store} for more than {timeout or 0:.0f} s; "
                          "retry later, or open the workspace with a longer retry_for")

    def check(self) -> None:
        """Raise TurnEndedError if the lease was lost while held: the caller must not publish."""
        if self._lost is not None:
            raise TurnEndedError(f"this writer lost its turn at the store ({self._lost}); the batch was not committed")

    def release(self, *, clean: bool = False) -> None:
        if not self._held:
            return
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        self._held = False
        if self._lost is None and _mine(self._read(), self.holder):
            self._commit("release", clean=clean)  # if it fails, the lease ends on its own

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_EVERY_S):
            try:
                renewed = _mine(self._read(), self.holder) and self._commit("renew")
            except Exception as error:  # noqa: BLE001 - the store unreachable: the lease may end
                self._lost = f"its lease could not be renewed: {type(error).__name__}: {error}"
                return
            if not renewed:
                self._lost = "its lease was taken by another writer after it ended"
                return

    def tidy(self) -> None:
        """A checkpoint of the lease's table, then its expired log entries deleted (those
        before the checkpoint and older than the table's log retention): commits do not
        clean up (`objects.COMMIT_HOOKS`), so a compaction does, and the lease's log, which
        every writer's turn adds two entries to, stays bounded."""
        with self._lock:
            table = objects.delta_table(self.uri)
            table.create_checkpoint()
            table.cleanup_metadata()

    def _read(self) -> dict[str, Any] | None:
        """The state the lease table's newest version says (its commit's metadata; None: no
        lease was ever taken), from a listing of the entries after the newest version this
        lease knows (after the last checkpoint, the first time) and that entry: one or two
        requests, where a delta-rs load and `history` took four or five. The table is created
        with the first lease."""
        with self._lock:
            while True:
                after = self._version if self._version is not None else _checkpointed(self.uri)
                versions = objects.entries_after(self.uri, after)
                if after is None and not versions:
                    self._create()
                    continue
                newest = max(versions, default=after)
                assert newest is not None
                if newest != self._version or self._last is None:
                    text = objects.read_whole(f"{self.uri}/_delta_log/{newest:020d}.json")
                    if text is None:  # cleaned up between the listing and the read: list again
                        self._version = self._last = None
                        continue
                    self._version, self._last = newest, _state(text)
                return self._last or None

    def _create(self) -> None:
        """The lease table's first version (empty, with the store's log properties)."""
        try:
            objects.write_delta(self.uri, _SCHEMA.empty_table(), mode="error", configuration=objects.LOG_PROPERTIES)
        except DeltaError as error:  # another writer created it first ("already exists", or a
            # conflict on its first version): it is there to read, else this error goes up
            if not objects.is_delta_table(self.uri):
                raise error from None

    def _commit(self, op: str, *, clean: bool = False) -> bool:
        """Commit `op` as the version after the newest this lease read, with S3's conditional
        put (one request); False if another writer committed that version first. The entry
        is a Delta commit with no files, its commit info holding the metadata, as delta-rs
        wrote it. A checkpoint every `CHECKPOINT_EVERY` versions bounds a fresh reader's
        listing."""
        metadata = {"op": op, "holder": self.holder, "until": f"{time.time() + LEASE_S:.3f}", "clean": str(int(clean))}
        with self._lock:
            assert self._version is not None, "read before a commit"
            version = self._version + 1
            info = {"timestamp": int(time.time() * 1000), "operation": "WRITE",
                    "operationParameters": {"mode": "Append"}, "clientVersion": f"engagelake-{__version__}", **metadata}
            if not objects.put_new(f"{self.uri}/_delta_log/{version:020d}.json", orjson.dumps({"commitInfo": info}) + b"\n"):
                return False
            self._version, self._last = version, metadata
        if version % CHECKPOINT_EVERY == 0:
            checkpoints.write_or_leave(self.uri, version)  # a checkpoint only shortens listings
        return True


def _checkpointed(uri: str) -> int | None:
    """The version of the lease table's last checkpoint (None: none yet, or unreadable)."""
    version = checkpoints.last_version(uri)
    return None if version is None or version < 0 else version


def _state(entry: bytes) -> dict[str, Any]:
    """A lease commit's metadata from its log entry (empty: not a lease commit, such as the
    table's creation): engagelake's own entries and delta-rs' (its custom metadata sits in
    the commit info) alike."""
    for line in entry.splitlines():
        if line.strip() and isinstance(info := orjson.loads(line).get("commitInfo"), dict):
            return info if "op" in info and "holder" in info and "until" in info else {}
    return {}


def _mine(state: dict[str, Any] | None, holder: str) -> bool:
    return state is not None and state["holder"] == holder and state["op"] != "release"
