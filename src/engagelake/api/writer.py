"""Group commit: one thread applies whatever requests have queued as one `Workspace.apply`
batch, and each request is answered once its batch is durable.

Requests queue in arrival order and a batch keeps that order, so the result equals applying
them one by one in arrival order (`apply`'s own guarantee). A commit costs about the same for
one request and for hundreds: this is what makes the server fast under load. Reads (exports,
GETs) queue too, so a read sees every write that was answered before it was sent.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any

from engagelake.routing import Response
from engagelake.workspace import Workspace

log = logging.getLogger("engagelake.api")

MAX_BATCH = 500  # requests per batch: about 37,500 objects of full track requests
# requests waiting for the writer before new ones are turned away (503): at the measured
# 155-205 requests/s of full track requests, 10-13 s of work, past most clients' timeouts
MAX_QUEUED = 2000
# Clients busy when a batch ends are those it answered, who are most likely sending their next
# requests, and those queued. When the writer finds fewer queued than that, it waits for the
# rest while they keep arriving (a gap of LINGER_GAP_S ends the wait), up to LINGER_MAX_S, or
# until the batch holds them all. Under load (64 clients) the writer had alternated a batch of
# 1 request with one of 63 (the first answered client to send again was drawn alone), or
# settled in two groups of about 32 taking turns; a batch costs little more for 63 requests
# than for 1 or 32 (95-390, 200, 230 ms). The event loop answers a batch's requests before it
# reads the next ones, so arrivals pause: gaps of 3, 10 and 20 ms ended the wait too early,
# 30 ms did not (docs/decisions.md). A lone client never waits: it is the only one busy.
LINGER_GAP_S = 0.03
LINGER_MAX_S = 0.1
# A wait that gained no request (clients whose next request takes longer than the gap: far
# away, or slow to send) is not tried again for this many batches: it would only add its gap.
LINGER_PAUSE = 8
# how often the writer logs what it did (INFO, logger `engagelake.api`): operators see whether
# requests are grouped, how long a batch takes and what waits
STATS_EVERY_S = 60.0
_STOP = object()
# what a request that could not be applied answers (503): nothing of the server's inside (the
# exception, a path of the store); the server log has the error
NOT_APPLIED = ("the request was not applied because of an error inside the server (its log has the details); "
               "nothing of it was stored, retry later")


class WriterBusy(Exception):
    """The queue is full: the request was not taken (nothing of it is stored)."""


class GroupCommitWriter:
    """The server's single writer over `workspace`."""

    def __init__(self, workspace: Workspace, *, max_batch: int = MAX_BATCH, max_queued: int = MAX_QUEUED,
                 linger_gap: float = LINGER_GAP_S, linger_max: float = LINGER_MAX_S,
                 stats_every: float = STATS_EVERY_S):
        self.workspace = workspace
        self.stats_every = stats_every
        self._window: list[tuple[int, float]] = []  # (requests, seconds) of each batch since the last report
        self._window_start = time.monotonic()
        self._window_waits = 0
        self.max_batch = max_batch
        self.max_queued = max_queued
        self.linger_gap, self.linger_max = linger_gap, linger_max  # 0: never wait
        self.batches = 0  # batches applied, for the benchmark and the tests
        self.lingered = 0  # batches that waited for requests on their way, likewise
        self._last = 0  # clients busy when the last batch ended (answered, or queued)
        self._no_waits = 0  # batches left before the writer waits again (LINGER_PAUSE)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._queued = 0  # requests taken and not yet drawn by the writer
        self._count = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="engagelake-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Apply what has queued, then stop (the server stops taking requests first)."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def submit(self, request: dict[str, Any]) -> Future[Response]:
        """Queue one request (`{"method", "path", "body", "query"}`); its future holds the
        response. Raises `WriterBusy` when `max_queued` requests wait already."""
        future: Future[Response] = Future()
        with self._count:
            if self._queued >= self.max_queued:
                raise WriterBusy(f"{self._queued:,} requests are waiting to be applied")
            self._queued += 1
        self._queue.put((request, future))
        return future

    @property
    def queued(self) -> int:
        """Requests taken and not yet drawn into a batch."""
        return self._queued

    def full(self) -> bool:
        """Whether a request submitted now would be turned away (a hint: `submit` decides)."""
        return self._queued >= self.max_queued

    def _drawn(self, n: int) -> None:
        with self._count:
            self._queued -= n

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is _STOP:
                break
            batch = [first]
            stopping = self._draw(batch, None)
            if not stopping and len(batch) < self._last and self.linger_max > 0:
                if self._no_waits:
                    self._no_waits -= 1
                else:
                    self.lingered += 1
                    self._window_waits += 1
                    drawn = len(batch)
                    stopping = self._draw(batch, time.monotonic() + self.linger_max, until=self._last)
                    if len(batch) == drawn and not stopping:  # nobody came: clients slower than the gap
                        self._no_waits = LINGER_PAUSE
            self._drawn(len(batch))
            # a request whose caller is gone (its handler was cancelled: a client that hung up,
            # a shutdown that timed out) is not applied: nobody could learn that it was
            live = [(request, future) for request, future in batch if future.set_running_or_notify_cancel()]
            if live:
                started = time.perf_counter()
                self._apply(live)
                self._window.append((len(live), time.perf_counter() - started))
                self._report()
            # the clients busy now: those just answered, who may send again, and those queued
            self._last = len(batch) + self.queued
        self._report(last=True)

    def _report(self, *, last: bool = False) -> None:
        """Log the batches since the last report, once `stats_every` seconds have passed (or
        the writer stops: `last`)."""
        elapsed = time.monotonic() - self._window_start
        if (elapsed < self.stats_every and not last) or not self._window:
            return
        sizes = [n for n, _ in self._window]
        times = sorted(seconds * 1e3 for _, seconds in self._window)
        log.info("group commit, last %.0f s: requests %d, batches %d (%.1f requests a batch, at most %d); "
                 "batch time median %.0f ms, max %.0f ms; batches that waited for requests on their way %d; "
                 "queued now %d", elapsed, sum(sizes), len(sizes), sum(sizes) / len(sizes), max(sizes),
                 times[len(times) // 2], times[-1], self._window_waits, self.queued)
        self._window, self._window_start, self._window_waits = [], time.monotonic(), 0

    def _draw(self, batch: list[Any], deadline: float | None, until: int | None = None) -> bool:
        """Add queued requests to `batch`, in order: those waiting now (no `deadline`), or those
        that keep arriving until `deadline` (a gap of `linger_gap` ends it) or until the batch
        holds `until`. True when the stop came (the requests before it are in `batch`)."""
        limit = min(self.max_batch, until or self.max_batch)
        while len(batch) < limit:
            try:
                if deadline is None:
                    item = self._queue.get_nowait()
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    item = self._queue.get(timeout=min(self.linger_gap, left))
            except queue.Empty:
                break
            if item is _STOP:
                return True  # answer what came before the stop, then end
            batch.append(item)
        return False

    def _apply(self, batch: list[tuple[dict[str, Any], Future[Response]]]) -> None:
        try:
            responses = self.workspace.apply([request for request, _ in batch])
        except Exception as error:  # noqa: BLE001 - the writer must outlive any failed batch
            if len(batch) > 1:  # one request may be the cause: the others must not pay for it
                # halves, in order, each split again if it fails: one bad request among n costs
                # about 2 log2(n) applies, not n (a request that fails every batch it is in could
                # otherwise make the writer apply a full queue one request at a time)
                half = len(batch) // 2
                log.warning("a batch of %d requests failed (%s: %s); applying it again as two halves of %d and %d",
                            len(batch), type(error).__name__, error, half, len(batch) - half)
                self._apply(batch[:half])
                self._apply(batch[half:])
                return
            log.exception("a request was not applied")
            responses = [Response(503, {"message": NOT_APPLIED})]
        self.batches += 1
        store = self.workspace.store
        while store.commit_errors:  # the batch is committed all the same
            log.warning("a batch was committed, but a step after its commit failed: %r", store.commit_errors.pop(0))
        while store.merge_errors:  # the store is intact; the next writer rolls the merge back
            log.warning("a run merge after a commit failed: %r", store.merge_errors.pop(0))
        while self.workspace.flush_errors:  # the batches are in the log: the next flush writes them
            log.warning("a flush of the in-memory layer failed (its batches are logged, and written at the next "
                        "flush): %r", self.workspace.flush_errors.pop(0))
        for (_, future), response in zip(batch, responses, strict=True):
            future.set_result(response)
