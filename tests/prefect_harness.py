"""pytest plugin: one Prefect test server for the whole session (flows and the CLI demo).

Load it from a test module with `pytest_plugins = ["tests.prefect_harness"]` and use the
`prefect_harness` fixture; the server starts only when a test asks for it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """Run flows against a temporary Prefect server and database for the session."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry calls
        from prefect.testing.utilities import prefect_test_harness

        with prefect_test_harness(server_startup_timeout=120):
            yield
