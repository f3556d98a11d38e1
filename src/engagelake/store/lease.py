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
`LEASE_S`; the next writer then takes it, and rolls back what the dead one left (`_recover`).

A writer that has lost its lease (it did not renew in time: a process paused for longer than
the lease) must not publish: `check` raises before the ledger row is written.
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

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from engagelake.errors import StaleStoreError, StoreError, TurnEndedError
from engagelake.store import objects

LEASE = "_writer_lease"  # the table, beside the store's tables
# how long a lease lasts unless renewed: a writer that died holding it delays the next one by
# as much (`ENGAGELAKE_LEASE_S`; shorter fails over sooner, but a holder must renew in time)
LEASE_S = float(os.environ.get("ENGAGELAKE_LEASE_S") or 60.0)
RENEW_EVERY_S = LEASE_S / 4  # a holder renews this often
_SCHEMA = pa.schema([("holder", pa.string())])  # never holds a row: the commits' metadata says it all
_JITTER = random.Random()


class Lease:
    """One writer's turn at a store on object storage (`acquire`, then `release`)."""

    def __init__(self, store_uri: str):
        self.store = store_uri.rstrip("/")
        self.uri = f"{self.store}/{LEASE}"
        self.holder = uuid.uuid4().hex  # this writer, in the commits' metadata
        self._table: DeltaTable | None = None
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
            table = self._load()
            state = _state(table)
            if state is None or state["op"] == "release" or float(state["until"]) <= time.time():
                if self._commit(table, "acquire"):
                    # the writer before gave the lease back after a block that raised nothing:
                    # no table holds a version the ledger does not name (`DeltaStore._recover`)
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
        if self._lost is None:
            table = self._load()
            if _mine(_state(table), self.holder):
                self._commit(table, "release", clean=clean)  # if it fails, the lease ends on its own

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_EVERY_S):
            try:
                table = self._load()
                renewed = _mine(_state(table), self.holder) and self._commit(table, "renew")
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
        table = self._load()
        with self._lock:
            table.create_checkpoint()
            table.cleanup_metadata()

    def _load(self) -> DeltaTable:
        """The lease table at its newest version (created with the first lease)."""
        with self._lock:
            if self._table is not None:
                self._table.update_incremental()
                return self._table
            try:
                self._table = objects.delta_table(self.uri)
            except TableNotFoundError:
                try:
                    objects.write_delta(self.uri, _SCHEMA.empty_table(), mode="error",
                                        configuration=objects.LOG_PROPERTIES)
                except DeltaError as error:  # another writer created it first ("already exists",
                    # or a conflict on its first version): it is there to load, else this error goes up
                    try:
                        self._table = objects.delta_table(self.uri)
                    except TableNotFoundError:
                        raise error from None
                    return self._table
                self._table = objects.delta_table(self.uri)
            return self._table

    def _commit(self, table: DeltaTable, op: str, *, clean: bool = False) -> bool:
        """Commit `op` as the version after the one `table` holds; False if another writer
        committed that version first."""
        metadata = {"op": op, "holder": self.holder, "until": f"{time.time() + LEASE_S:.3f}", "clean": str(int(clean))}
        with self._lock:
            try:
                objects.write_delta(table, _SCHEMA.empty_table(), mode="append", commit_properties=CommitProperties(
                    custom_metadata=metadata, max_commit_retries=0))
            except CommitFailedError:
                return False
            return True


def _state(table: DeltaTable) -> dict[str, Any] | None:
    """The newest lease commit's metadata (None: no lease was ever taken)."""
    last = table.history(1)[0]
    return last if "op" in last and "holder" in last and "until" in last else None


def _mine(state: dict[str, Any] | None, holder: str) -> bool:
    return state is not None and state["holder"] == holder and state["op"] != "release"
