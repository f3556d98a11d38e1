"""Prefect flows `export_batch` and `export_all`: users out as `users.ndjson` + `users.parquet`.

`export_batch` exports a list of external IDs through `POST /users/export/ids`, 50 IDs per
request (the API's limit); `export_all` streams the whole store with `Workspace.iter_users`, chunk by chunk,
in parts that may run side by side (on a Dask cluster with a `DaskTaskRunner`: `docs/scale-out.md`).
Both write `users.ndjson` (one exported user a line, shaped like the API's `users` elements)
and `users.parquet` (one column per field; nested values such as `custom_attributes` as JSON
text). Exports only read the store, so re-running them is always safe.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task

from engagelake import Workspace
from engagelake.files import join_user_files, read_identifiers, write_user_chunks, write_users_files
from engagelake.rules.messages import EXPORT_FIELDS
from engagelake.workspace import EXPORT_CHUNK_USERS
from flows._artifacts import record_markdown
from flows._retry import IO_TASK_OPTIONS, quoted

EXPORT_PATH = "/users/export/ids"
IDS_PER_REQUEST = 50


class ExportFailedError(RuntimeError):
    """The export endpoint answered an error; carries its status and body."""

    def __init__(self, status: int, body: dict[str, Any] | None, external_ids: Sequence[str]):
        message = (body or {}).get("message", "no message")
        first = external_ids[0] if external_ids else "-"
        super().__init__(
            f"{EXPORT_PATH} answered {status}: {message} (chunk starting at external ID {first!r})"
        )
        self.status = status
        self.body = body


@dataclass(frozen=True)
class ExportResult:
    """Where an export went and what it found."""

    users: int
    ndjson_path: Path
    parquet_path: Path
    invalid_user_ids: list[str] = field(default_factory=list)


@task(name="read-identifiers", **IO_TASK_OPTIONS)
def load_identifiers(source: str | list[str]) -> list[str]:
    """External IDs from a list or a file (JSON array, or one ID a line), each once."""
    return read_identifiers(source)


@task(name="export-ids", **IO_TASK_OPTIONS)
def export_chunk(
    workspace: Workspace, external_ids: list[str], fields: list[str]
) -> dict[str, Any]:
    """One `POST /users/export/ids` for at most 50 external IDs; its response body."""
    body = {"external_ids": external_ids, "fields_to_export": fields}
    response = workspace.call("POST", EXPORT_PATH, body)
    if response.status != 200 or response.body is None:
        raise ExportFailedError(response.status, response.body, external_ids)
    return response.body


@dataclass(frozen=True)
class ExportPlan:
    """A bulk export cut in parts: the batch every part reads, the clock every part shapes
    users with, and each part's ranges of `service_id` (`Workspace.export_ranges`)."""

    batch: int
    at: datetime
    parts: list[list[tuple[str, str | None]]]
    seed: str | None = None  # the store's (a part's worker checks it holds this store open)


@task(name="plan-export", **IO_TASK_OPTIONS)
def plan_export(store: str, users_per_chunk: int, parts: int) -> ExportPlan:
    """The batch and key ranges to export, as `parts` runs of consecutive ranges."""
    workspace = Workspace.open(store, create=False)
    batch, ranges = workspace.export_ranges(users_per_chunk)
    size = -(-len(ranges) // max(parts, 1))  # ranges per part, rounded up
    return ExportPlan(batch, datetime.now(UTC), [ranges[i : i + size] for i in range(0, len(ranges), size)],
                      workspace.store.head.seed)


@task(name="export-part", task_run_name="export part {part}", **IO_TASK_OPTIONS)
def export_part(store: str, plan: ExportPlan, part: int, fields: list[str], out_dir: str) -> tuple[Path, Path, int]:
    """Stream the users of one part, shaped like the export endpoint's users, chunk by chunk into
    `users.ndjson` and `users.parquet` in `out_dir`: memory follows a chunk, not the store. It
    opens the store itself, so it may run in any process that reaches the store and `out_dir`
    (a Dask worker)."""
    workspace = Workspace.open_kept(store, clock=lambda: plan.at, seed=plan.seed)  # a worker's parts share one
    chunks = workspace.iter_users(fields, at_batch=plan.batch, key_ranges=plan.parts[part])
    return write_user_chunks(chunks, out_dir, fields)


@task(name="join-parts", **IO_TASK_OPTIONS)
def join_parts(parts: list[tuple[Path, Path, int]], out_dir: str) -> tuple[Path, Path, int]:
    """The parts' files, in part order, as `users.ndjson` and `users.parquet` in `out_dir`."""
    return join_user_files(parts, out_dir)


@task(name="write-users", **IO_TASK_OPTIONS)
def write_users(users: list[dict[str, Any]], out_dir: str) -> tuple[Path, Path]:
    """Write `users.ndjson` and `users.parquet` into `out_dir`."""
    return write_users_files(users, out_dir)


@flow(name="export_batch")
def export_batch(
    identifiers_file_or_list: str | list[str],
    out_dir: str,
    store: str = "data/store",
    fields: list[str] | None = None,
) -> ExportResult:
    """Export the users with the given external IDs (a list, or a file: a JSON array or one ID
    a line) into `out_dir`, in the order of the IDs; `fields` defaults to every export field."""
    logger = get_run_logger()
    started = time.perf_counter()
    workspace = Workspace.open(store, create=False)  # an export never creates a store
    external_ids = load_identifiers(identifiers_file_or_list)
    fields_to_export = list(fields) if fields is not None else list(EXPORT_FIELDS)
    users: list[dict[str, Any]] = []
    invalid: list[str] = []
    for start in range(0, len(external_ids), IDS_PER_REQUEST):
        chunk = external_ids[start : start + IDS_PER_REQUEST]
        body = export_chunk(workspace, chunk, fields_to_export)
        users.extend(body.get("users") or [])
        invalid.extend(body.get("invalid_user_ids") or [])
    ndjson_path, parquet_path = write_users(quoted(users), out_dir)
    logger.info(
        "exported %d users for %d external IDs to %s (%d matched no user)",
        len(users),
        len(external_ids),
        out_dir,
        len(invalid),
    )
    record_markdown("export_batch", export_summary(store, len(external_ids), len(users), invalid,
                                                   ndjson_path, parquet_path, time.perf_counter() - started))
    return ExportResult(len(users), ndjson_path, parquet_path, invalid)


@flow(name="export_all")
def export_all(
    out_dir: str,
    store: str = "data/store",
    fields: list[str] | None = None,
    users_per_chunk: int = EXPORT_CHUNK_USERS,
    parts: int = 1,
) -> ExportResult:
    """Export every user of the store into `out_dir`, ordered by `service_id`; `fields`
    defaults to every field. With `parts` > 1 the store's key ranges are cut into that many
    parts, exported as tasks of their own on the flow's task runner (threads by default; a
    `DaskTaskRunner` puts them on a Dask cluster's workers), all as of one batch, then joined
    into the same two files in the same order: the result is the same for any `parts`."""
    logger = get_run_logger()
    started = time.perf_counter()
    fields_to_export = list(fields) if fields is not None else list(EXPORT_FIELDS)
    plan = plan_export(store, users_per_chunk, parts)  # an export never creates a store
    if len(plan.parts) <= 1:  # one part writes the files itself
        ndjson_path, parquet_path, count = export_part(store, plan, 0, fields_to_export, out_dir)
    else:
        folder = Path(out_dir) / f".parts-{uuid.uuid4().hex}"
        futures = [export_part.submit(store, plan, part, fields_to_export, str(folder / f"part-{part:05d}"))
                   for part in range(len(plan.parts))]
        try:
            ndjson_path, parquet_path, count = join_parts([future.result() for future in futures], out_dir)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    logger.info("exported all %d users to %s in %d part(s)", count, out_dir, max(len(plan.parts), 1))
    record_markdown("export_all", export_summary(store, None, count, [], ndjson_path, parquet_path,
                                                 time.perf_counter() - started))
    return ExportResult(count, ndjson_path, parquet_path)


def export_summary(store: str, asked: int | None, users: int, invalid: list[str],
                   ndjson_path: Path, parquet_path: Path, seconds: float) -> str:
    """The markdown of an export run: how many users went where, and the IDs that matched none."""
    lines = [f"Exported **{users:,}** users from `{store}`"
             + (f" for {asked:,} external IDs" if asked is not None else "") + f" in {seconds:.2f} s:",
             "", f"- `{ndjson_path}`", f"- `{parquet_path}`"]
    if invalid:
        shown = ", ".join(f"`{i}`" for i in invalid[:20]) + (", ..." if len(invalid) > 20 else "")
        lines += ["", f"{len(invalid):,} external IDs matched no user: {shown}"]
    return "\n".join(lines)
