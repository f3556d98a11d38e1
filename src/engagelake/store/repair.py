"""`engagelake repair`: check the store in the writer's turn, then do what the report's plan
says (move damaged files aside, roll tables back to the versions the ledger names), then roll
a dead compaction forward by opening the store (`store/check.py` finds the problems)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from engagelake.errors import StoreDamaged
from engagelake.store import objects
from engagelake.store.check import REPAIRED, Report, check_store, relative_path, root_of, turn
from engagelake.store.delta import DeltaStore
from engagelake.store.layout import COMPACTING
from engagelake.store.lease import Lease


def repair(uri: str | Path) -> Report:
    """Check the store in the writer's turn and do what the report's plan says; returns the
    report the plan came from (check again to see the result). Raises StoreDamaged, and changes
    nothing, when a problem is not repairable; TurnEndedError, when the lease on object storage
    ended while it ran (another writer may have committed since the check)."""
    root = root_of(uri)
    with turn(root) as lease:
        report = check_store(root)
        if blocking := report.unrepairable():
            raise StoreDamaged(f"the store at {root} has problems `engagelake repair` cannot fix safely; nothing was "
                               "changed:\n" + "\n".join(f"  {p}" for p in blocking))
        if report.aside:
            target = objects.join(root, f"{REPAIRED}/{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%fZ')}")
            for path in report.aside:
                _still_ours(lease)
                objects.move(path, objects.join(target, relative_path(path, root)))
        for name, (_, named) in report.rollback.items():
            table = objects.delta_table(objects.join(root, name))
            if table.version() > named:
                _still_ours(lease)
                table.restore(named)
    if objects.exists(objects.join(root, COMPACTING)):  # a dead compaction: opening a snapshot rolls it forward
        DeltaStore(root, create=False).snapshot()
    return report


def _still_ours(lease: Lease | None) -> None:
    """Raise TurnEndedError when the lease ended while the check read the store (a renewal
    failed): another writer may have committed since, and a roll-back would drop its batch."""
    if lease is not None:
        lease.check()
