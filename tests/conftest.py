"""Fixtures shared by the end-to-end test files (a test file's own fixture of the same name wins)."""

from __future__ import annotations

import os
import sys
from typing import Any

# pytest caches the test modules and plugins it rewrites (asserts) as bytecode, unless Python
# writes none: with PYTHONDONTWRITEBYTECODE set (as on this project's machines) every xdist
# worker rewrote 178 modules (hypothesis, anyio, the tests) on each run, about 5 s of its
# collection's 9-10 s. The workers start after this file is read, with the variable gone.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# The tests' stores live in RAM when the machine has room: each test copies a template store
# (about 70 folders and 100 files) and every commit writes a few files, and on this machine's
# disk (ext4) a folder costs about 215 us to make and a file 256 us to create, against 6 and
# 29 us on tmpfs. With fewer than 2 GiB free on /dev/shm (or a temp root chosen by the caller)
# the tests use the system's temp folder as before; the stores behave the same on either (a
# crash test kills processes, not the machine). Set before xdist starts the workers, which
# inherit both variables.
def _ram_temp_root(root: str = "/dev/shm", room: int = 2 << 30) -> str | None:
    try:
        free = os.statvfs(root)
    except OSError:
        return None
    return root if free.f_bavail * free.f_frsize >= room and os.access(root, os.W_OK) else None


if "PYTEST_DEBUG_TEMPROOT" not in os.environ and "PYTEST_XDIST_WORKER" not in os.environ and (
        _ram := _ram_temp_root()) is not None:
    os.environ["PYTEST_DEBUG_TEMPROOT"] = _ram  # tmp_path and tmp_path_factory
    os.environ.setdefault("TMPDIR", _ram)  # tempfile's, in the workers and the processes tests start

# Each xdist worker computes on one thread (Polars' pool, Arrow's): the workers fill the cores
# already, and a pool's idle threads spin between the many small queries of a test. Set before
# Polars is imported (below, through the helpers); a run with -n 0 keeps every core.
# Each worker is also pinned to a core of its own (when there are no more workers than cores):
# every Polars query hands its work to the pool's thread and waits, and a hand-off within one
# core costs about two-fifths of one across cores (an eager join of tiny frames: 100 against
# 255 us here); the default run took 3:44 instead of 4:31. The worker's threads, started later,
# inherit the pin, and so do the processes its tests start: a test whose processes must run
# side by side gives them back every core (`helpers.unpinned`, from the variable below).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("POLARS_MAX_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _worker = os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw")
    if hasattr(os, "sched_setaffinity") and _worker.isdigit():  # Linux, xdist's own worker names
        _cpus = sorted(os.sched_getaffinity(0))
        if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", len(_cpus) + 1)) <= len(_cpus):
            os.environ["ENGAGELAKE_TEST_CPUS"] = ",".join(map(str, _cpus))
            os.sched_setaffinity(0, {_cpus[int(_worker) % len(_cpus)]})  # a restarted worker: gw2, ...

# (imported after the settings above, which Polars reads once)
import pytest  # noqa: E402
from tests import helpers  # noqa: E402
from tests.helpers import open_ws, track_ok  # noqa: E402

from engagelake import Workspace  # noqa: E402

# the files whose tests use the Prefect test server (tests/prefect_harness.py)
PREFECT_FILES = {"tests/test_cli.py", "tests/test_deployments.py", "tests/test_flows.py", "tests/test_scale_out.py"}
# the units of the default run that take longest, longest first (`--durations=0`, summed per file;
# measured 2026-12-02: the prefect files 55 s, then 19 s down to 5 s). A file missing here is handed
# out by its number of tests, maybe last: add a file that takes 5 s or more.
LONGEST_FIRST = (
    "prefect", "tests/test_merge.py", "tests/test_object_storage.py", "tests/test_api_server.py",
    "tests/test_forget_check.py", "tests/test_track_fatal.py", "tests/test_track_attributes.py",
    "tests/test_track_identifiers.py", "tests/test_merging.py", "tests/test_store.py",
    "tests/test_read_ahead.py", "tests/test_identify.py", "tests/test_out_of_core.py",
    "tests/test_track_subscriptions.py", "tests/test_bad_input.py", "tests/test_erasure.py",
    "tests/test_track_events.py", "tests/test_store_damage.py", "tests/test_partial_rows.py",
    "tests/test_preference_pages.py", "tests/test_staging.py", "tests/test_delete.py",
    "tests/test_dispatch.py", "tests/test_footers.py", "tests/test_export.py",
    "tests/test_preference_centers.py", "tests/test_lineage.py", "tests/test_runs.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` (each file's tests on one worker: a module fixture is built once), with
    the files that use the Prefect test server as one unit, so that the server starts once, and
    the longest units handed out first.
    (`--dist loadgroup` with xdist_group marks would say it, but xdist 3.8 loses the groups under
    pytest 9.2: pytest-dev/pytest-xdist#1386.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class PrefectFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "prefect" if scope in PREFECT_FILES else scope

        def _assign_work_unit(self, node: Any) -> None:
            # the longest units first (xdist hands them out by number of tests): a long file
            # handed out last would run on while the other worker has nothing left
            for scope in reversed(LONGEST_FIRST):
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return PrefectFilesTogether(config, log)


@pytest.fixture(scope="session", autouse=True)
def store_templates(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The template stores that `open_ws` copies, under this session's temporary folder (one
    per xdist worker): each is created once, on first use."""
    helpers.TEMPLATES = tmp_path_factory.mktemp("templates")


@pytest.fixture
def ws(tmp_path) -> Workspace:
    """A fresh store with the fixed clock and seed (a copy of the template store)."""
    return open_ws(tmp_path)


@pytest.fixture(scope="module")
def shared_ws(tmp_path_factory) -> Workspace:
    """One store per test module holding user "a", for requests that are refused (400s write
    nothing, so the tests can share it)."""
    ws = open_ws(tmp_path_factory.mktemp("shared"))
    track_ok(ws, attributes=[{"external_id": "a"}])
    return ws
