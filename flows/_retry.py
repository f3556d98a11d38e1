"""Retry settings shared by the flows' tasks: retry on I/O errors only."""

from __future__ import annotations

from typing import Any, TypeVar, cast

from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

T = TypeVar("T")

# Missing files and refused permissions do not heal by waiting.
PERMANENT_IO_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


def is_transient_io_error(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect `retry_condition_fn`: retry when the task failed with a transient `OSError`."""
    error = state.result(raise_on_failure=False)
    return isinstance(error, OSError) and not isinstance(error, PERMANENT_IO_ERRORS)


IO_TASK_OPTIONS: dict[str, Any] = {
    "retries": 3,
    "retry_delay_seconds": [1, 5, 15],
    "retry_condition_fn": is_transient_io_error,
    # Batches are large and applied under an idempotency key: nothing to cache or persist.
    "cache_policy": NO_CACHE,
    "persist_result": False,
}


def quoted(value: T) -> T:
    """`value` passed to a task as it is: Prefect neither walks it for futures nor hashes it
    (big batches and response lists), typed as the value itself (`quote` is not)."""
    return cast(T, quote(value))
