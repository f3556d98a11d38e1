"""Child process of the store crash tests, and the batches and snapshots they share.

    ENGAGELAKE_CRASH_AT=<point> python tests/crash_worker.py <store> <point>

opens the store and applies BATCH_2 under KEY_2; the failpoint named by the environment makes the
process SIGKILL itself inside the commit. Exit 0 means the failpoint never fired; exit 3 means the
argument and the environment disagree (a harness mistake, not a store result).
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import polars as pl
from deltalake import DeltaTable

from engagelake import Workspace
from engagelake.rules.messages import EXPORT_FIELDS
from engagelake.store.layout import CRASH_ENV, LEDGER
from engagelake.tables.schema import TABLES, USER_TABLES

NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
SEED = "crash"
TRACK = "/users/track"
EXPORT = "/users/export/ids"
KEY_1 = "batch-1"
KEY_2 = "batch-2"

# Every failpoint of a batch that changes every table, in protocol order.
# the tables BATCH_2 writes: every user table (resource tables go through the same protocol)
WRITTEN = USER_TABLES
CRASH_POINTS = [
    "before_tables",
    *(f"after_table:{t}" for t in WRITTEN),
    "before_ledger",
    "after_ledger",
]


def _track(**body: Any) -> dict[str, Any]:
    return {"method": "POST", "path": TRACK, "body": body}


def _group(gid: str, state: str) -> dict[str, str]:
    return {"subscription_group_id": gid, "subscription_state": state}


# The first committed batch: two users, attributes, a group, a push token, an event, a purchase.
BATCH_1 = [
    _track(
        attributes=[
            {
                "external_id": "u1",
                "first_name": "Ann",
                "email": "ann@example.com",
                "level": 3,
                "gone": "soon",
                "subscription_groups": [_group("g1", "subscribed")],
            },
            {
                "external_id": "u9",
                "push_tokens": [{"app_id": "app", "token": "T1", "device_id": "d1"}],
            },
        ],
        events=[{"external_id": "u1", "name": "signup", "time": "2026-11-22T11:00:00Z"}],
        purchases=[
            {
                "external_id": "u9",
                "product_id": "sku0",
                "currency": "USD",
                "price": 1.5,
                "time": "2026-11-22T11:05:00Z",
            }
        ],
    ),
]

# The batch the child applies: new users (by external ID and by alias), updates and deletions
# (an incremented and a removed attribute, a group change, a push token moving between users),
# events and purchases, a merge (the alias-only profile into u2), then an export that sees the
# whole batch. It changes every user table.
BATCH_2 = [
    _track(
        attributes=[
            {
                "external_id": "u1",
                "level": {"inc": 2},
                "gone": None,
                "subscription_groups": [_group("g1", "unsubscribed"), _group("g2", "subscribed")],
            },
            {
                "external_id": "u2",
                "email": "bob@example.com",
                "push_tokens": [{"app_id": "app", "token": "T1", "device_id": "d2"}],
            },
            {
                "user_alias": {"alias_name": "a1", "alias_label": "crm"},
                "_update_existing_only": False,
                "home_city": "Oslo",
            },
        ],
        events=[
            {
                "external_id": "u2",
                "name": "played",
                "time": "2026-11-22T11:30:00Z",
                "properties": {"k": 1},
            }
        ],
        purchases=[
            {
                "external_id": "u3",
                "product_id": "sku",
                "currency": "USD",
                "price": 9.5,
                "time": "2026-11-22T11:45:00Z",
            }
        ],
    ),
    _track(events=[{"external_id": "u1", "name": "played", "time": "2026-11-22T11:50:00Z"}]),
    {
        "method": "POST",
        "path": "/users/merge",
        "body": {"merge_updates": [{
            "identifier_to_merge": {"user_alias": {"alias_name": "a1", "alias_label": "crm"}},
            "identifier_to_keep": {"external_id": "u2"},
        }]},
    },
    {
        "method": "POST",
        "path": EXPORT,
        "body": {"external_ids": ["u1", "u2", "u3", "u9"], "fields_to_export": list(EXPORT_FIELDS)},
    },
]


def open_store(path: str | Path) -> Workspace:
    return Workspace.open(path, clock=lambda: NOW, seed=SEED)


def snapshot(ws: Workspace) -> dict[str, Any]:
    """Everything a reader can see: the full export, every table's rows (any order), the head."""
    tables = {}
    for name in TABLES:
        frame = ws.table(name).collect()
        tables[name] = (frame.height, frame.columns, sorted(repr(row) for row in frame.rows()))
    head = ws.store.head
    return {
        "export": ws.export_users(list(EXPORT_FIELDS)),
        "tables": tables,
        "head": (head.batch_no, head.next_profile_n, head.next_update_seq, head.seed),
    }


def counts(ws: Workspace) -> dict[str, int]:
    return {name: ws.table(name).collect().height for name in TABLES}


def ledger_versions(store: str | Path) -> dict[str, int]:
    """The table versions the last ledger row names, read straight from the Delta log."""
    frame = pl.from_arrow(
        DeltaTable(f"{store}/{LEDGER}").to_pyarrow_table(columns=["batch_no", "versions"])
    )
    assert isinstance(frame, pl.DataFrame)
    return orjson.loads(frame.sort("batch_no")["versions"][-1])


def ledger_batches(store: str | Path) -> int:
    return DeltaTable(f"{store}/{LEDGER}").to_pyarrow_table(columns=["batch_no"]).num_rows


def disk_versions(store: str | Path) -> dict[str, int]:
    """The newest Delta version of every table and of the ledger, committed or not."""
    return {name: DeltaTable(f"{store}/{name}").version() for name in (*TABLES, LEDGER)}


def tables_ahead(store: str | Path) -> set[str]:
    """Tables whose Delta log has versions past the one the ledger names."""
    named = ledger_versions(store)
    return {name for name in WRITTEN if DeltaTable(f"{store}/{name}").version() > named[name]}


def run_worker(store: str | Path, point: str) -> subprocess.CompletedProcess[str]:
    """Run this file in a child process that applies BATCH_2 to `store` (or compacts it, for a
    `compact:<table>` point) and dies at `point`."""
    src = str(Path(__file__).resolve().parents[1] / "src")  # the checkout's source, as pytest uses
    env = {
        **os.environ,
        CRASH_ENV: point,
        "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p),
    }
    return subprocess.run(
        [sys.executable, __file__, str(store), point],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def main(argv: list[str]) -> int:
    store, point = argv[1], argv[2]
    if os.environ.get(CRASH_ENV) != point:
        return 3
    if point.startswith("compact:"):
        open_store(store).compact()
    else:
        open_store(store).apply(BATCH_2, idempotency_key=KEY_2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
