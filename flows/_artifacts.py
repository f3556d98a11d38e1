"""Prefect artifacts of the flows: what a run did, shown in the UI under a stable key per flow.

Each flow run creates one artifact (a new version of its key), so the UI's Artifacts page shows
the latest run of each flow and its history. Keys are the flow names with dashes (Prefect keys
take lowercase letters, numbers and dashes only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from engagelake.files import AppliedFile

TOTAL = "total"


def artifact_key(flow_name: str) -> str:
    """The stable artifact key of a flow: `track_batch` -> `track-batch`."""
    return flow_name.replace("_", "-")


def batch_rows(applied: Sequence[AppliedFile]) -> list[dict[str, Any]]:
    """One row per applied file (one batch each) and a total row: requests, objects processed,
    requests per status, non-fatal errors, seconds. Every row has the same columns."""
    statuses = sorted({status for a in applied for status in a.statuses})

    def row(file: str, items: Sequence[AppliedFile]) -> dict[str, Any]:
        return {
            "file": file,
            "requests": sum(a.requests for a in items),
            "objects": sum(a.objects for a in items),
            **{f"status {s}": sum(a.statuses.get(s, 0) for a in items) for s in statuses},
            "non-fatal errors": sum(a.errors for a in items),
            "seconds": round(sum(a.seconds for a in items), 3),
        }

    return [*(row(a.path.name, [a]) for a in applied), row(TOTAL, applied)]


def record_batches(flow_name: str, folder: str, store: str, applied: Sequence[AppliedFile],
                   *, failed: BaseException | None = None) -> None:
    """The table artifact of a batch flow run: one row per file, then the total."""
    total = batch_rows(applied)[-1]
    outcome = f"; stopped by {type(failed).__name__}: {failed}" if failed is not None else ""
    description = (
        f"`{flow_name}`: {len(applied)} file(s) of `{folder}` applied to `{store}`, "
        f"{total['requests']:,} requests, {total['objects']:,} objects processed, "
        f"{total['non-fatal errors']:,} non-fatal errors in {total['seconds']:.2f} s{outcome}"
    )
    create_table_artifact(batch_rows(applied), key=artifact_key(flow_name), description=description)


def record_table_rows(flow_name: str, store: str, rows: Mapping[str, int], what: str) -> None:
    """The table artifact of a whole-store flow run (compaction, publishing): rows per table."""
    table = [{"table": name, "rows": count} for name, count in rows.items()]
    description = f"`{flow_name}` on `{store}`: {sum(rows.values()):,} rows {what} in {len(rows)} tables"
    create_table_artifact(table, key=artifact_key(flow_name), description=description)


def record_markdown(flow_name: str, markdown: str) -> None:
    """A markdown artifact for a flow run whose outcome is a few figures."""
    create_markdown_artifact(markdown, key=artifact_key(flow_name), description=f"`{flow_name}` run summary")
