"""Small work on one CPU.

Polars hands every operation to its thread pool and waits for the answer. When the pool's
thread and the caller sit on different CPUs, each hand-off is a wake-up across CPUs: on the
2-CPU VM the benchmarks run on, a `filter` of 3 rows took 100-120 µs that way and 25 µs with
both on one CPU, and a Python thread ping-pong took 51 µs. A small batch runs 400-odd such
operations on small frames, so it spent more time handing work over than doing it: a
75-object `/users/track` call took 129-132 ms, against 90-93 ms pinned as below
(`docs/decisions.md` has the figures). A big pass still wants every CPU for its frames.

`one_cpu()` pins the calling thread and Polars' pool threads to the CPU the caller is on, for
the block or until `release()`: a batch holds it while its passes are small. Threads other
than those keep their CPUs (reads and DuckDB run beside it), but a thread the pinned thread
starts inherits the pin: those get the caller's old CPUs back at release. Only the first
holder in a process pins (a nested or concurrent one runs as it is), so that two holders
cannot leave each other's pins behind. Where the OS cannot pin threads (not Linux), or the
process has one CPU, or `ENGAGELAKE_ONE_CPU=0`, nothing changes.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

ENV = "ENGAGELAKE_ONE_CPU"  # "0": never pin (to measure against)
_TASKS = "/proc/self/task"
_POOL_THREAD = re.compile(rb"polars-\d+\n?$")  # Polars' pool ("polars-ooc-clean..." is not one)

_lock = threading.Lock()
_held = False  # a holder in this process has pinned
_local = threading.local()  # `pinned`: this thread's pin


def pinned() -> bool:
    """Whether the calling thread runs pinned to one CPU: then DuckDB runs its queries in it
    too (`rules/duck.py`), with no worker threads to hand work to."""
    pin = getattr(_local, "pin", None)
    return pin is not None and pin.cpu is not None


def _enabled() -> bool:
    return (os.environ.get(ENV, "1") != "0" and hasattr(os, "sched_setaffinity")
            and os.path.isdir(_TASKS))


def _tasks() -> set[int]:
    return {int(t) for t in os.listdir(_TASKS)}


def _is_pool_thread(tid: int) -> bool:
    try:
        with open(f"{_TASKS}/{tid}/comm", "rb") as f:
            return _POOL_THREAD.match(f.read()) is not None
    except OSError:  # the thread ended
        return False


def _current_cpu() -> int:
    """The CPU the calling thread runs on (field 39 of its stat line)."""
    with open("/proc/thread-self/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[36])


class Pin:
    """One holder's pin; `release()` undoes it (again: nothing)."""

    def __init__(self) -> None:
        self.cpu: int | None = None  # pinned to, while pinned
        self._thread = 0  # the pinned thread's ID
        self._mask: set[int] = set()
        self._before: set[int] = set()
        self._pool: dict[int, set[int]] = {}  # Polars' pool threads: their masks before

    def _pin(self) -> None:
        mask = os.sched_getaffinity(0)
        if len(mask) < 2:
            return
        cpu = _current_cpu()
        self.cpu = cpu if cpu in mask else min(mask)  # from here on, `release` undoes what was done
        self._mask, self._before, self._thread = mask, _tasks(), threading.get_native_id()
        for tid in self._before:
            if _is_pool_thread(tid):
                try:
                    before = os.sched_getaffinity(tid)
                except OSError:  # ended meanwhile
                    continue
                self._pool[tid] = before
                _set(tid, {self.cpu})
        os.sched_setaffinity(self._thread, {self.cpu})
        _local.pin = self

    def release(self) -> None:
        global _held
        if self.cpu is None:
            return
        cpu, self.cpu = self.cpu, None
        if getattr(_local, "pin", None) is self:
            _local.pin = None
        try:
            _set(self._thread, self._mask)
            for tid, mask in self._pool.items():
                _set(tid, mask)
            seen = set(self._before)
            while new := _tasks() - seen:  # started meanwhile (by a pinned thread, if pinned),
                seen |= new  # and those they start while this runs
                for tid in new:
                    try:
                        if os.sched_getaffinity(tid) == {cpu}:
                            os.sched_setaffinity(tid, self._mask)
                    except OSError:  # ended meanwhile
                        pass
        finally:
            with _lock:
                _held = False


def _set(tid: int, mask: set[int]) -> None:
    try:
        os.sched_setaffinity(tid, mask)
    except OSError:  # the thread ended
        pass


@contextmanager
def one_cpu() -> Iterator[Pin]:
    """Pin the calling thread and Polars' pool to one CPU for the block (see the module)."""
    global _held
    pin = Pin()
    if _enabled():
        with _lock:
            first, _held = not _held, True
        if first:
            try:
                pin._pin()
            except Exception:  # noqa: BLE001 - cannot pin here (a container's policy, an odd /proc): run as it is
                pin.release()
            except BaseException:  # an interrupt: undone, and it goes on up
                pin.release()
                with _lock:
                    _held = False
                raise
            if pin.cpu is None:
                with _lock:
                    _held = False
    try:
        yield pin
    finally:
        pin.release()
