"""Prefect flow `cleanup_push_token_profiles`: the monthly check of the temporary anonymous
profiles `push_token_import` creates. Those that no longer hold a push token are deleted (as
`/users/delete` deletes, with a lineage row each); the rest are left unchanged.

`flows/serve.py` schedules it monthly (`cleanup_push_token_profiles/monthly-cleanup`). The
check is one batch: re-running it deletes only what became tokenless since, so it is always
safe to run again.
"""

from __future__ import annotations

import time

from prefect import flow, get_run_logger, task

from engagelake import Workspace
from flows._artifacts import record_markdown
from flows._retry import IO_TASK_OPTIONS


@task(name="cleanup-push-profiles", **IO_TASK_OPTIONS)
def cleanup_push_profiles(store: str) -> int:
    """The check as one batch; a retry after an I/O error deletes only what is still there."""
    return Workspace.open(store, create=False).cleanup_push_profiles()  # a cleanup never creates a store


@flow(name="cleanup_push_token_profiles")
def cleanup_push_token_profiles(store: str = "data/store") -> int:
    """Delete the temporary anonymous profiles (from `push_token_import`) that hold no push token
    any more; returns how many were deleted."""
    started = time.perf_counter()
    deleted = cleanup_push_profiles(store)
    seconds = time.perf_counter() - started
    get_run_logger().info("deleted %d temporary anonymous profiles without a push token", deleted)
    record_markdown("cleanup_push_token_profiles",
                    f"Deleted **{deleted:,}** temporary anonymous profiles (`push_token_import`) without a "
                    f"push token from `{store}` in {seconds:.2f} s.")
    return deleted


if __name__ == "__main__":
    import sys

    cleanup_push_token_profiles(*sys.argv[1:2])
