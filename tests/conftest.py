"""Fixtures shared by the end-to-end test files (a test file's own fixture of the same name wins)."""

from __future__ import annotations

import pytest
from tests import helpers
from tests.helpers import open_ws, track_ok

from engagelake import Workspace


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
