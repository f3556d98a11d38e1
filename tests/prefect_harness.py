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
        from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
        from prefect.testing.utilities import prefect_test_harness

        # No flow-run heartbeats: their thread sleeps in 1 s steps and each flow run's end waits
        # for the step to finish (up to 1 s a run); nothing here watches for crashed runs.
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}), \
                prefect_test_harness(server_startup_timeout=120):
            yield
