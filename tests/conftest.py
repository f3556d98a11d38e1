"""Fixtures shared by the end-to-end test files (a test file's own fixture of the same name wins)."""

from __future__ import annotations

import pytest
from tests.helpers import open_ws, track_ok

from engagelake import Workspace


@pytest.fixture
def ws(tmp_path) -> Workspace:
    """A fresh store with the fixed clock and seed."""
    return open_ws(tmp_path)


@pytest.fixture(scope="module")
def shared_ws(tmp_path_factory) -> Workspace:
    """One store per test module holding user "a", for requests that are refused (400s write
    nothing, so the tests can share it)."""
    ws = open_ws(tmp_path_factory.mktemp("shared"))
    track_ok(ws, attributes=[{"external_id": "a"}])
    return ws
