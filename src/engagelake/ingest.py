"""Applying request files: the one way the CLI (`engagelake apply`) and the batch flows
(`flows/track_batch.py`) apply a file.

A request file is one batch: it is read (`files.read_request_file`: its idempotency key is
`"<file name>:<sha256 of its bytes>"`), its requests are applied with that key, and the responses
are written beside it as `<stem>.responses.ndjson`. Applying a file again changes nothing and
gives the same responses. A file whose batch was applied before and whose stored responses are
gone (retention, erasure) is done, not failed: nothing is applied, its responses file is left
as it was, and its summary says why it was skipped.

The flows run the steps as Prefect tasks of their own (retried on I/O errors, shown in the UI):
they pass them as `read`, `apply` and `write`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engagelake.errors import IdempotentResponsesExpired
from engagelake.files import (
    AppliedFile,
    RequestFile,
    read_request_file,
    skipped_file,
    write_responses_file,
)

if TYPE_CHECKING:
    from engagelake.rules.profile.reading import TrackReader
    from engagelake.workspace import Response, Workspace

Applied = list["Response"] | IdempotentResponsesExpired
ApplyStep = Callable[["Workspace", RequestFile], Applied]
WriteStep = Callable[[RequestFile, list["Response"], float], AppliedFile]


@dataclass(frozen=True)
class FileOutcome:
    """What applying one request file gave."""

    applied: AppliedFile  # its summary; `applied.skipped` says why nothing was applied
    responses: Sequence[Response] = ()  # in request order; none when skipped
    # set when the batch was applied before and its stored responses are gone
    expired: IdempotentResponsesExpired | None = None

    def rejected(self) -> list[tuple[int, Response]]:
        """The rejected requests (4xx, 5xx): their line or row in the file (from 1) and response."""
        return [(line, r) for line, r in enumerate(self.responses, 1) if r.status >= 400]


def apply_requests(workspace: Workspace, batch: RequestFile,
                   read_track: TrackReader | None = None) -> Applied:
    """Apply one file's requests as one batch under its key. A batch applied before whose
    stored responses are gone is returned as its error (it is done, not failed); `read_track`
    reads the track passes (`Workspace.apply`)."""
    try:
        return workspace.apply(batch.iter_requests(), idempotency_key=batch.idempotency_key, read_track=read_track)
    except IdempotentResponsesExpired as done:
        return done


def write_responses(batch: RequestFile, responses: list[Response], seconds: float) -> AppliedFile:
    """Write `<stem>.responses.ndjson` beside the request file; its summary."""
    return write_responses_file(batch, responses, seconds=seconds)


def skipped_because(done: IdempotentResponsesExpired) -> str:
    """Why a file was skipped, as its summary says (`AppliedFile.skipped`)."""
    return f"applied at {done.committed_at} ({done.reason} responses are not kept)"


def apply_file(
    workspace: Workspace,
    path: Path,
    *,
    check: Callable[[RequestFile], None] | None = None,
    read: Callable[[Path], RequestFile] = read_request_file,
    apply: ApplyStep = apply_requests,
    write: WriteStep = write_responses,
) -> FileOutcome:
    """Read the request file at `path`, `check` it (it raises to refuse the file before anything
    applies), apply it as one batch and write its responses beside it. `seconds` in the summary
    is the time `apply` took. Errors other than an expired replay (a bad file, a store error)
    are raised: nothing of the file's batch is then committed."""
    batch = read(path)
    if check is not None:
        check(batch)
    started = time.perf_counter()
    responses = apply(workspace, batch)
    seconds = time.perf_counter() - started
    if isinstance(responses, IdempotentResponsesExpired):
        return FileOutcome(skipped_file(batch, skipped_because(responses)), expired=responses)
    return FileOutcome(write(batch, responses, seconds), responses)


def settle_merges(workspace: Workspace) -> list[BaseException]:
    """Wait for the run merges that follow the last commit; the merges that failed, each
    reported once (a failed merge loses nothing: the batches are committed, the next batch
    merges again)."""
    workspace.close()
    errors = list(workspace.store.merge_errors)
    workspace.store.merge_errors.clear()
    return errors
