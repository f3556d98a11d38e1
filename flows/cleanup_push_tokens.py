"""Prefect flow `cleanup_push_token_profiles`: the monthly check of the temporary anonymous
profiles `push_token_import` creates. Those that no longer hold a push token are deleted (as
`/users/delete` deletes, with a lineage row each); the rest are left unchanged.

Schedule it monthly, for example `cleanup_push_token_profiles.serve(cron="0 3 1 * *")`. The
check is one batch: re-running it deletes only what became tokenless since, so it is always
safe to run again.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from engagelake import Workspace


@flow(name="cleanup_push_token_profiles")
def cleanup_push_token_profiles(store: str = "data/store") -> int:
    """Delete the temporary anonymous profiles (from `push_token_import`) that hold no push token
    any more; returns how many were deleted."""
    deleted = Workspace.open(store, create=False).cleanup_push_profiles()  # a cleanup never creates a store
    get_run_logger().info("deleted %d temporary anonymous profiles without a push token", deleted)
    return deleted


if __name__ == "__main__":
    import sys

    cleanup_push_token_profiles(*sys.argv[1:2])
