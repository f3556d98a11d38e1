"""Prefect flows `track_batch`, `merge_batch`, `identify_batch`: apply a folder of request files,
each file as one batch; `compact_store`; and `publish_current`.

Files (`*.ndjson`, `*.parquet`) are applied in sorted name order with
`Workspace.apply(requests, idempotency_key="<file name>:<sha256 of the file>")`, and the
responses are written beside each file as `<stem>.responses.ndjson`. Re-running the flow over
the same files applies nothing again: the store answers with the responses it stored, and the
responses files are rewritten with the same content. A changed file is a new batch.
"""

from __future__ import annotations

import contextvars
import functools
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext, TaskRunContext
from prefect.futures import wait

from engagelake import IdempotentResponsesExpired, Response, Workspace
from engagelake.errors import ConfigError
from engagelake.files import (
    AppliedFile,
    RequestFile,
    list_request_files,
    read_request_file,
    write_responses_file,
)
from engagelake.ingest import apply_file, apply_requests, settle_merges
from engagelake.rules.profile.reading import TrackInput, TrackReader, joined, read_track, shares_of
from engagelake.workspace import MIN_PART_ROWS, Part, Plan, Written
from flows._artifacts import record_batches, record_table_rows
from flows._retry import IO_TASK_OPTIONS, quoted


@task(name="find-request-files", **IO_TASK_OPTIONS)
def find_request_files(folder: str) -> list[Path]:
    """The folder's request files in sorted name order."""
    return list_request_files(folder)


@task(name="read-request-file", task_run_name="read {path.name}", **IO_TASK_OPTIONS)
def read_requests(path: Path) -> RequestFile:
    """Read one request file and compute its idempotency key."""
    return read_request_file(path)


@task(name="apply-batch", **IO_TASK_OPTIONS)
def apply_batch(workspace: Workspace, batch: RequestFile,
                reader: TrackReader | None = None) -> list[Response] | IdempotentResponsesExpired:
    """Apply one file's requests as one batch; retrying is safe under the batch's key. A batch
    applied before whose stored responses are gone (retention, erasure) is returned as its
    error: it is done, not failed. `reader` reads the track passes (`shared_reader`)."""
    return apply_requests(workspace, batch, reader)


T = TypeVar("T")

# A pass's requests are shared out only when each share has this much text at least: a task on
# a cluster costs about 0.26 s of a worker, about what reading 1 MiB of requests takes.
MIN_SHARE_BYTES = 1 << 20


@task(name="read-track-share", task_run_name="read requests {first_req}..", retries=2, retry_delay_seconds=1,
      cache_policy=NO_CACHE, persist_result=False)
def read_track_share(texts: Sequence[str], max_updates: int | None, first_req: int) -> TrackInput:
    """Parse and check one share of a track pass's requests: a pure function of their text, so
    a retry (a worker lost) reads the same."""
    return read_track(texts, max_updates, first_req=first_req)


def _bare(submit: Callable[[], T]) -> T:
    """Run `submit` (task submissions) in a copy of the context without the parameters of the
    task and the flow run it is called from: Prefect ships the current runs' contexts with every
    task it submits to a cluster, and those parameters hold the open workspace and the flow's
    callbacks, which do not travel. The tasks are the flow run's own."""
    outside = contextvars.copy_context()
    flow_run = FlowRunContext.get()
    if flow_run is not None:
        outside.run(FlowRunContext.__var__.set, flow_run.model_copy(update={"parameters": {}}))
    outside.run(TaskRunContext.__var__.set, None)  # type: ignore[arg-type]
    return outside.run(submit)


def shared_reader(parts: int) -> TrackReader | None:
    """A reader that splits each track pass's requests into up to `parts` shares of about equal
    text, read as tasks on the flow's task runner (a `DaskTaskRunner`: its workers), joined in
    request order. A pass too small to share, or a call outside a flow run, is read here. The
    rules, identity resolution and the commit stay in the flow's process (docs/scale-out.md)."""
    if parts <= 1:
        return None

    def read(texts: Sequence[str], max_updates: int | None) -> TrackInput:
        bounds = shares_of(texts, parts, MIN_SHARE_BYTES)
        if len(bounds) <= 1 or FlowRunContext.get() is None:
            return read_track(texts, max_updates)
        futures = _bare(lambda: [read_track_share.submit(list(texts[a:b]), max_updates, a) for a, b in bounds])
        wait(futures)  # a share that fails for good leaves no other one running after the batch
        return joined([future.result() for future in futures])

    return read


@task(name="write-responses", **IO_TASK_OPTIONS)
def write_responses(batch: RequestFile, responses: list[Response], seconds: float) -> AppliedFile:
    """Write `<stem>.responses.ndjson` beside the request file."""
    return write_responses_file(batch, responses, seconds=seconds)


def apply_request_files(
    folder: str,
    store: str,
    on_file_applied: Callable[[AppliedFile], None] | None = None,
    *,
    only: tuple[str, ...] = (),
    flow_name: str | None = None,
    parts: int = 1,
) -> list[AppliedFile]:
    """The body of the batch flows: every file of `folder` as one batch, in name order. With
    `only`, a file holding a request to another path is refused before anything applies. With
    `flow_name`, the run's table artifact (key: the flow name with dashes) lists each file's
    figures, also when a file stops the run. With `parts` > 1, each big track pass's requests
    are read (parsed and checked) in that many shares on the flow's task runner."""
    applied: list[AppliedFile] = []
    failure: BaseException | None = None
    try:
        _apply_files(folder, store, on_file_applied, only, applied, shared_reader(parts))
    except BaseException as error:  # recorded in the artifact, then raised unchanged
        failure = error
        raise
    finally:
        if flow_name is not None:
            record_batches(flow_name, folder, store, applied, failed=failure)
    return applied


def _apply_files(folder: str, store: str, on_file_applied: Callable[[AppliedFile], None] | None,
                 only: tuple[str, ...], applied: list[AppliedFile], reader: TrackReader | None) -> None:
    """Apply each file with `engagelake.ingest.apply_file`, its steps run as this module's tasks."""
    logger = get_run_logger()
    workspace = Workspace.open(store)
    check = functools.partial(check_paths, only=only) if only else None

    def apply(workspace: Workspace, batch: RequestFile) -> list[Response] | IdempotentResponsesExpired:
        return apply_batch(workspace, quoted(batch), quoted(reader))

    def write(batch: RequestFile, responses: list[Response], seconds: float) -> AppliedFile:
        return write_responses(quoted(batch), quoted(responses), seconds)

    for path in find_request_files(folder):
        outcome = apply_file(workspace, path, check=check, read=read_requests, apply=apply, write=write)
        result = outcome.applied
        if outcome.expired is not None:
            logger.info("%s: skipped, %s", path.name, result.skipped)
        else:
            logger.info(
                "%s: %d requests, %d objects processed in %.2f s, statuses %s, %d non-fatal errors",
                path.name,
                result.requests,
                result.objects,
                result.seconds,
                result.statuses,
                result.errors,
            )
        applied.append(result)
        if on_file_applied is not None:
            on_file_applied(result)
    settle_runs(workspace)


def settle_runs(workspace: Workspace) -> None:
    """Wait for the run merges that follow the last commit, inside the flow run; a failed
    merge loses nothing (the next batch merges again), so it is a warning."""
    for error in settle_merges(workspace):
        get_run_logger().warning("merging sorted runs failed (nothing is lost; the next batch merges again): %s",
                                 error)


def check_paths(batch: RequestFile, only: tuple[str, ...]) -> None:
    for n, request in enumerate(batch.iter_requests()):  # a first pass, decoded as it goes
        path = "/" + str(request.get("path", "")).strip("/")
        if path not in only:
            raise ConfigError(f"{batch.path.name}: request {n} goes to {path}; this flow applies only {', '.join(only)}")


@flow(name="track_batch")
def track_batch(
    folder: str,
    store: str = "data/store",
    on_file_applied: Callable[[AppliedFile], None] | None = None,
    parts: int = 1,
) -> list[AppliedFile]:
    """Apply every request file of `folder` to the store, one batch per file, in name order.
    Files may interleave every endpoint (track, merge, identify, rename, delete, export, ...).

    With `parts` > 1, each track pass is parsed and checked in up to `parts` shares of at least
    1 MiB of requests each (`MIN_SHARE_BYTES`), as tasks of their own on the flow's task runner
    (threads by default; a `DaskTaskRunner` puts them on a Dask cluster's workers); the rest of
    the batch runs in the flow's process. The responses and the store are the same for any
    `parts`.

    `on_file_applied` is called in-process after each file (the CLI uses it for progress bars);
    it is not stored with the flow run.
    """
    return apply_request_files(folder, store, on_file_applied, flow_name="track_batch", parts=parts)


@flow(name="merge_batch")
def merge_batch(
    folder: str,
    store: str = "data/store",
    on_file_applied: Callable[[AppliedFile], None] | None = None,
) -> list[AppliedFile]:
    """Apply files of `/users/merge` requests, one batch per file (safe to re-run)."""
    return apply_request_files(folder, store, on_file_applied, only=("/users/merge",), flow_name="merge_batch")


@flow(name="identify_batch")
def identify_batch(
    folder: str,
    store: str = "data/store",
    on_file_applied: Callable[[AppliedFile], None] | None = None,
) -> list[AppliedFile]:
    """Apply files of `/users/identify` requests, one batch per file (safe to re-run)."""
    return apply_request_files(folder, store, on_file_applied, only=("/users/identify",),
                               flow_name="identify_batch")


@task(name="compact", **IO_TASK_OPTIONS)
def compact(store: str, response_retention_days: float) -> dict[str, int]:
    """Compact the store; a crash midway rolls forward, so a retry after an I/O error is safe."""
    return Workspace.open(store, create=False, response_retention=timedelta(days=response_retention_days)).compact()


@task(name="compact-part", task_run_name="compact {part.table} [{part.low}, {part.high})", **IO_TASK_OPTIONS)
def compact_part(store: str, plan: Plan, part: Part) -> Written:
    """Write one part of a compaction (files its planner commits); a failed part leaves no
    file, so a retry after an I/O error is safe."""
    return Workspace.open_kept(store, seed=plan.head.seed).compact_part(plan, part)  # a worker's parts share one


@flow(name="compact_store")
def compact_store(store: str = "data/store", response_retention_days: float = 7.0, parts: int = 1,
                  min_part_rows: int = MIN_PART_ROWS) -> dict[str, int]:
    """Rewrite every table to its current rows and delete unreferenced files (deleted users'
    data leaves the disk); stored responses of keyed batches go after `response_retention_days`,
    and at once when they concerned a deleted user. Returns the rows kept per table.

    With `parts` > 1 each big sorted table is cut into about that many key ranges, written as
    tasks of their own on the flow's task runner (threads by default; a `DaskTaskRunner` puts
    them on a Dask cluster's workers), then committed together by the flow, which holds the
    store's writer lock throughout: the tables hold the same rows in the same order. A part
    holds `min_part_rows` stored rows at least (a smaller table is one part)."""
    started = time.perf_counter()
    if parts <= 1:
        rows = compact(store, response_retention_days)
    else:
        workspace = Workspace.open(store, create=False, response_retention=timedelta(days=response_retention_days))
        with workspace.compaction(parts, min_part_rows=min_part_rows) as job:
            futures = [compact_part.submit(store, job.plan, part) for part in job.plan.parts]
            wait(futures)  # every part ended before one's error leaves the block (and the lock)
            rows = job.finish([future.result() for future in futures])
    seconds = time.perf_counter() - started
    get_run_logger().info("compacted %s rows in %d tables in %.2f s", f"{sum(rows.values()):,}", len(rows), seconds)
    record_table_rows("compact_store", store, rows, f"kept after {seconds:.2f} s")
    return rows


@flow(name="publish_current")
def publish_current(store: str = "data/store", out: str | None = None) -> dict[str, int]:
    """Write every table's current rows as plain Delta tables under `out` (default:
    `<store>/current`) for readers outside engagelake; run it after the batches it should show.
    Returns the rows per table."""
    rows = Workspace.open(store, create=False).publish(out)
    get_run_logger().info("published %s rows in %d tables", f"{sum(rows.values()):,}", len(rows))
    record_table_rows("publish_current", store, rows, f"published to `{out or store + '/current'}`")
    return rows


if __name__ == "__main__":
    import sys

    track_batch(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "data/store")
