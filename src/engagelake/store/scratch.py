"""Private temporary folders of this process: a batch's stages, DuckDB's spill. Each name
holds the owner's process ID, so the folders that a killed process left behind can be told
from live ones and removed the next time a folder of the same kind is made."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def prefix(kind: str) -> str:
    return f"engagelake-{kind}-"  # then the owner's process ID


def make(kind: str) -> Path:
    """A new folder of `kind` in the system's temporary directory (`TMPDIR`)."""
    sweep_dead(kind)
    return Path(tempfile.mkdtemp(prefix=f"{prefix(kind)}{os.getpid()}-"))


@contextmanager
def folder(kind: str) -> Iterator[Path]:
    """`make(kind)`, removed on exit."""
    path = make(kind)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def sweep_dead(kind: str) -> None:
    """Remove the folders of `kind` whose process is gone (killed, or out of memory)."""
    for path in Path(tempfile.gettempdir()).glob(f"{prefix(kind)}*-*"):
        pid = path.name.removeprefix(prefix(kind)).split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:  # another user's live process
            continue
