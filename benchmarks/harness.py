"""What the benchmarks share to run and measure: the console, RSS readings, the benchmark
workspace (a fixed clock and seed) and a base store built through the engine.
"""

from __future__ import annotations

import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from engagelake.workspace import Response, Workspace
from workload import NOW, load_requests

SEED = "bench-track"

console = Console(width=None if sys.stdout.isatty() else 120)


# --- measuring ----------------------------------------------------------------------------------
def vm_rss() -> int:
    """Current resident set size of this process in bytes (from /proc/self/status)."""
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def max_rss() -> int:
    """Peak resident set size of this process so far, in bytes (`ru_maxrss` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class RssSampler:
    """Samples VmRSS every `interval` seconds in a background thread; keeps the maximum."""

    def __init__(self, interval: float = 0.02):
        self.interval = interval
        self.baseline = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, vm_rss())
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self.baseline = self.peak = vm_rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, vm_rss())

    @property
    def delta(self) -> int:
        return self.peak - self.baseline


def mib(n: float) -> str:
    return f"{n / 1024**2:,.0f} MiB"


def errors_in(responses: list[Response]) -> int:
    """Responses that are not 2xx or that carry per-object errors."""
    return sum(1 for r in responses if r.status >= 300 or (r.body or {}).get("errors"))


# --- the benchmark store ------------------------------------------------------------------------
def open_ws(path: Path) -> Workspace:
    return Workspace.open(path, clock=lambda: NOW, seed=SEED)


def build_store(path: Path, users: int, chunk: int, rng: np.random.Generator, label: str) -> dict[str, Any]:
    """Create `users` users with attribute-only requests, `chunk` objects per apply."""
    ws = open_ws(path)
    gen_s = engine_s = 0.0
    bad = applies = 0
    for start in range(0, users, chunk):
        t = time.perf_counter()
        reqs = load_requests(start, min(start + chunk, users), rng)
        gen_s += time.perf_counter() - t
        t = time.perf_counter()
        responses = ws.apply(reqs)
        engine_s += time.perf_counter() - t
        bad += errors_in(responses)
        applies += 1
        del reqs, responses
        if users // chunk <= 20 or applies % 10 == 0 or start + chunk >= users:
            console.print(f"  {label}: {min(start + chunk, users):,}/{users:,} users, "
                          f"engine {engine_s:,.1f} s (this apply {time.perf_counter() - t:,.1f} s), "
                          f"generation {gen_s:,.1f} s")
    profiles = ws.table("profiles").collect().height
    return {"ws": ws, "seconds": engine_s, "generation_s": gen_s, "applies": applies,
            "profiles": profiles, "bad_responses": bad}
