"""pytest plugin: one Prefect test server for the whole session (flows and the CLI demo).

Load it from a test module with `pytest_plugins = ["tests.prefect_harness"]` and use the
`prefect_harness` fixture; the server starts only when a test asks for it.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

DB_NAME = "prefect-test.db"  # the database file `prefect_test_harness` makes in its folder


@pytest.fixture(scope="session")
def prefect_harness(request: pytest.FixtureRequest) -> Iterator[None]:
    """Run flows against a temporary Prefect server and database for the session.

    Migrating a new database is about 6 s of the server's 10-11 s start. So the first run
    keeps a copy of the database as migrated, before any flow ran, in pytest's cache (per
    Prefect version), and later runs start from a copy of that copy: the server then finds
    nothing to migrate. Without the cache (`-p no:cacheprovider`) every run migrates."""
    cache = getattr(request.config, "cache", None)  # None under `-p no:cacheprovider`
    kept = (cache.mkdir("prefect-db") / f"{version('prefect')}.db") if cache is not None else None
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry calls
        import prefect.testing.utilities as harness
        from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

        folders: list[Path] = []

        def seeded_folder() -> str:
            folder = Path(tempfile.mkdtemp())
            if kept is not None and kept.exists() and not _copied(kept, folder / DB_NAME):
                kept.unlink(missing_ok=True)  # unreadable: this run migrates and keeps a new one
            folders.append(folder)
            return str(folder)

        # the harness makes its database's folder with `mkdtemp()` (a Prefect that stops
        # calling it loses only the shortcut)
        patch.setattr(harness, "mkdtemp", seeded_folder)
        # No flow-run heartbeats: their thread sleeps in 1 s steps and each flow run's end waits
        # for the step to finish (up to 1 s a run); nothing here watches for crashed runs.
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}), \
                harness.prefect_test_harness(server_startup_timeout=120):
            if kept is not None and not kept.exists() and folders and (folders[0] / DB_NAME).exists():
                partial = kept.with_suffix(f".{os.getpid()}.tmp")
                if _copied(folders[0] / DB_NAME, partial):
                    partial.replace(kept)  # whole or not at all, also beside a run in parallel
            yield


def _copied(source: Path, target: Path) -> bool:
    """Whether `target` became a consistent copy of the SQLite database `source`, which a
    running server may be writing (SQLite's online backup). A failed copy leaves no `target`:
    the cache is a shortcut, never a reason for a session to fail."""
    try:
        src, dst = sqlite3.connect(source), sqlite3.connect(target)
        try:
            src.backup(dst)
        finally:
            src.close()
            dst.close()
    except (sqlite3.Error, OSError):
        target.unlink(missing_ok=True)
        return False
    return True
