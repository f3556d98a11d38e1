"""The commands that write requests into a store: `apply` (request files, one batch each) and
`demo` (a generated workload, applied with the track_batch and merge_batch flows)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from engagelake.cli.common import (
    DEFAULT_STORE,
    Store,
    cell,
    console,
    fail,
    input_errors,
    progress,
    say,
    stderr,
)
from engagelake.cli.render import applied_row, message, print_lineage_tree

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from engagelake.files import AppliedFile
    from engagelake.workspace import Workspace

DEMO_REQUESTS = Path("data/demo/requests")
REJECTIONS_SHOWN = 5  # rejected requests `apply` prints
SAMPLE_FIELDS = [
    "external_id", "first_name", "email", "country", "language", "created_at",
    "custom_attributes", "custom_events", "purchases", "total_revenue",
]  # fmt: skip


def demo(
    users: Annotated[int, typer.Option(min=1, help="Number of distinct users.")] = 100_000,
    objects: Annotated[
        int, typer.Option(min=1, help="Attribute, event and purchase objects in all.")
    ] = 1_000_000,
    store: Store = DEFAULT_STORE,
    seed: Annotated[int, typer.Option(help="Random seed of the generated workload.")] = 7,
    requests_dir: Annotated[
        Path,
        typer.Option(
            help="Folder for the generated request files (earlier requests-*.ndjson there are replaced)."
        ),
    ] = DEMO_REQUESTS,
    per_file: Annotated[
        int, typer.Option(min=1, help="Requests per request file (one batch per file).")
    ] = 1000,
) -> None:
    """Generate a /users/track workload, apply it with Prefect flows, show results.

    The workload is written to --requests-dir as NDJSON request files and applied to --store by the track_batch flow, one batch per file; then one user in a hundred is merged into its neighbour (a merge request file beside the requests, applied by the merge_batch flow); then a summary (users, events, purchases, throughput), a sample export of 3 users and the lineage tree of one merged user are printed.

    Re-running with the same options on the same day (UTC) applies nothing twice: each file is an idempotent batch, and the summary says the files were already applied instead of showing a throughput.

    Examples:
      engagelake demo
      engagelake demo --users 1000 --objects 10000 --store /tmp/demo-store
    """
    prefect_defaults()
    with input_errors():
        from engagelake import Workspace

        if Workspace.store_state(store) == "new":  # refuses a file, or a folder of other things, before any work
            say(f"creating a new store at {store}", markup=False)
        else:
            say(f"adding to the store at {store} (its earlier batches stay)", markup=False)
        started = datetime.now(UTC)
        applied, objects_by_file = _run_demo(users, objects, store, seed, requests_dir, per_file)
        merged = _merge_duplicates(users, store, requests_dir.parent / "merges")
        workspace = Workspace.open(store)
        _print_summary(workspace, applied, objects_by_file, _replayed(workspace, applied, started))
        _print_sample(workspace)
        if merged:
            _print_lineage(workspace, merged[0])


# How long the flows' temporary Prefect server may take to answer (Prefect's own default is 20 s):
# its first start on a new Prefect home migrates a new database, and on a cold 2-core machine
# that took longer than 20 s (docs/operations.md, "The temporary server's start").
EPHEMERAL_STARTUP_TIMEOUT_SECONDS = 180


def prefect_defaults() -> None:
    """The Prefect settings of the flows this CLI runs, as environment defaults (an explicit
    setting still wins). Set before Prefect is imported: it reads its settings once, at import,
    and the environment wherever the command runs (`[tool.prefect]` in pyproject.toml only from
    the repository's root)."""
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(EPHEMERAL_STARTUP_TIMEOUT_SECONDS))
    # Progress bars instead of Prefect's console log
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")  # nor the client's telemetry notice on a terminal's first run


def apply_files(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="Request files (.ndjson, or .parquet with columns method, path, body, query) "
            "or folders of them.",
            metavar="FILE",
            show_default=False,
        ),
    ],
    store: Store = DEFAULT_STORE,
    allow_errors: Annotated[
        bool,
        typer.Option("--allow-errors", help="Exit 0 even when some requests were rejected (4xx)."),
    ] = False,
) -> None:
    """Apply request files to the store, one atomic batch per file; print a summary.

    Each file is applied with the idempotency key "<file name>:<sha256>", so applying the same file again changes nothing and gives the same responses. Responses are written beside each file as <stem>.responses.ndjson.

    A rejected request (4xx) does not stop the others: the batch commits, the first rejections are printed, and the command exits 1 unless --allow-errors is given.

    Examples:
      engagelake apply data/demo/requests --store data/store
      engagelake apply batch-001.ndjson batch-002.parquet --allow-errors
    """
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from engagelake import Workspace
    from engagelake.files import list_request_files
    from engagelake.ingest import apply_file, settle_merges

    with input_errors():
        paths = [p for f in files for p in (list_request_files(f) if f.is_dir() else [f])]
        if missing := [str(p) for p in paths if not p.is_file()]:
            fail(f"no such request file: {', '.join(missing)}; check the path, or pass the folder that holds the files")
        if not paths:
            fail(f"no .ndjson or .parquet request files in {', '.join(map(str, files))} "
                 "(*.responses.ndjson are responses, not requests)")
        workspace = Workspace.open(store)
        table = Table("file", "requests", "statuses", "non-fatal errors", "seconds")
        table.columns[0].overflow = "fold"
        rejected: list[tuple[str, int, int, str]] = []  # (file, line, status, message)
        columns = (TextColumn("Applying {task.fields[file]}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("files"), TimeElapsedColumn())
        with progress(*columns, transient=True) as bar:
            task = bar.add_task("apply", total=len(paths), file="")
            for path in paths:
                bar.update(task, file=path.name)
                outcome = apply_file(workspace, path)
                if (done := outcome.expired) is not None:  # applied before: nothing to do
                    table.add_row(path.name, "-", f"skipped: applied at {done.committed_at:%Y-%m-%d %H:%M:%S} UTC", "-", "-")
                else:
                    table.add_row(*applied_row(outcome.applied))
                    rejected += [(path.name, line, r.status, message(r.body)) for line, r in outcome.rejected()]
                bar.advance(task)
        with stderr().status("Merging sorted runs"):  # they follow each commit, in a thread
            merge_errors = settle_merges(workspace)
    console().print(table)
    for error in merge_errors:  # the batches are committed: a warning, not a failure
        say(f"[yellow]warning:[/yellow] merging sorted runs failed ({cell(error)}); nothing is lost, "
            "the next batch merges again")
    say("Responses are beside each file as <stem>.responses.ndjson.")
    if rejected:
        shown = rejected[:REJECTIONS_SHOWN]
        say(f"[red]{len(rejected):,} request(s) rejected[/red] (the others are committed); first {len(shown)}:")
        for name, line, status, text in shown:
            say(f"  {name} line {line}: {status} {text}", markup=False)
        if not allow_errors:
            raise typer.Exit(1)


# --- demo steps ----------------------------------------------------------------------------------
def _run_demo(
    users: int, objects: int, store: str, seed: int, requests_dir: Path, per_file: int
) -> tuple[list[AppliedFile], dict[Path, int]]:
    """Write the workload's request files, then apply them with the track_batch flow under
    progress bars; return what applying each file gave and the objects in each file."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from engagelake.demo import count_objects, generate_workload, write_request_files

    _remove_demo_files(requests_dir)
    file_objects: list[int] = []
    columns = (
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with progress(*columns) as bars:
        generating = bars.add_task("Generating requests", total=objects)

        def counted(requests: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
            for index, request in enumerate(requests):
                n = count_objects(request)
                if index % per_file == 0:
                    file_objects.append(0)
                file_objects[-1] += n
                bars.advance(generating, n)
                yield request

        midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        workload = generate_workload(users, objects, seed, now=midnight)
        paths = write_request_files(counted(workload), requests_dir, per_file)
        objects_by_file = dict(zip(paths, file_objects, strict=True))
        applying = bars.add_task("Applying (track_batch flow)", total=sum(file_objects))
        started = time.perf_counter()
        applied = _apply_with_flow(requests_dir, store, bars, applying, objects_by_file)
        wall = time.perf_counter() - started
    say(f"[dim]flow wall time {wall:,.1f} s, including Prefect's start[/dim]")
    return applied, objects_by_file


def _replayed(workspace: Workspace, applied: list[AppliedFile], started: datetime) -> set[Path]:
    """The request files whose batch was committed before `started`: applying them again was
    an idempotent replay that wrote nothing."""
    from engagelake.files import read_request_file

    replayed = set()
    for file in applied:
        committed_at = workspace.batch_committed_at(read_request_file(file.path).idempotency_key)
        if committed_at is not None and committed_at < started:
            replayed.add(file.path)
    return replayed


def _apply_with_flow(
    folder: Path, store: str, bars: Progress, task: TaskID, objects_by_file: dict[Path, int]
) -> list[AppliedFile]:
    """Run the track_batch flow over `folder`, advancing `task` as each file is applied."""
    from flows.track_batch import track_batch

    def advance(applied: AppliedFile) -> None:
        bars.advance(task, objects_by_file.get(applied.path, 0))

    return track_batch(str(folder), store, on_file_applied=advance)


def _merge_duplicates(users: int, store: str, folder: Path) -> list[str]:
    """Merge user-(i+51) into user-(i+50) for every hundred users, with the merge_batch flow;
    return the external IDs kept."""
    import orjson
    from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

    from flows.track_batch import merge_batch

    pairs = [(f"user-{i + 51:06d}", f"user-{i + 50:06d}") for i in range(0, users - 51, 100)]
    if not pairs:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    updates = [{"identifier_to_merge": {"external_id": a}, "identifier_to_keep": {"external_id": b}} for a, b in pairs]
    requests = [{"method": "POST", "path": "/users/merge", "body": {"merge_updates": updates[i:i + 50]}}
                for i in range(0, len(updates), 50)]
    (folder / "merges-000.ndjson").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in requests))
    columns = (TextColumn("{task.description:<28}"), SpinnerColumn(), TimeElapsedColumn())
    with progress(*columns) as bars:
        bars.add_task(f"Merging {len(pairs):,} duplicates (merge_batch flow)", total=None)
        merge_batch(str(folder), store)
    return [keep for _, keep in pairs]


def _print_lineage(workspace: Workspace, external_id: str) -> None:
    rows = workspace.lineage(external_id)
    say(f"\nLineage: engagelake lineage {external_id}", markup=False)
    print_lineage_tree(f"external_id {external_id}", rows, 10)


def _remove_demo_files(folder: Path) -> None:
    """Remove request and responses files of an earlier demo run (only `requests-*.ndjson`)."""
    if folder.is_dir():
        for path in folder.glob("requests-*.ndjson"):
            path.unlink()


def _print_summary(
    workspace: Workspace, applied: list[AppliedFile], objects_by_file: dict[Path, int], replayed: set[Path]
) -> None:
    """Users, events and purchases in the store; files, objects and apply throughput of the
    files this run applied (time spent in `Workspace.apply`, without Prefect's start-up). Files
    already applied before (a re-run over the same store) were replays: no throughput for them."""
    from rich.table import Table

    counts = workspace.sql(
        "select (select count(*) from profiles) as users, (select count(*) from events) as events, "
        "(select count(*) from purchases) as purchases"
    ).row(0, named=True)
    new = [file for file in applied if file.path not in replayed]
    objects, seconds = sum(objects_by_file.get(f.path, 0) for f in new), sum(f.seconds for f in new)
    table = Table(
        "users", "events", "purchases", "files applied", "objects", "seconds", "objects/s", title="engagelake demo"
    )
    table.add_row(
        f"{counts['users']:,}", f"{counts['events']:,}", f"{counts['purchases']:,}", f"{len(new):,}",
        f"{objects:,}", f"{seconds:,.1f}" if new else "–", f"{objects / max(seconds, 1e-9):,.0f}" if new else "–",
    )  # fmt: skip
    console().print(table)
    if replayed:
        which = "All" if not new else f"{len(replayed):,} of the"
        say(
            f"{which} {len(applied):,} request files were already applied to this store: an idempotent replay, "
            "nothing written again" + (", so no throughput to show" if not new else ", not counted above")
            + ". Measure with a new --store, or another --seed or --objects.")


def _print_sample(workspace: Workspace) -> None:
    """A sample export of the first three users, as the API returns them."""
    ids = workspace.sql(
        "select external_id from profiles where external_id is not null order by created_seq limit 3"
    )["external_id"].to_list()
    response = workspace.call(
        "POST", "/users/export/ids", {"external_ids": ids, "fields_to_export": SAMPLE_FIELDS}
    )
    say(f"\nSample export: POST /users/export/ids {ids}", markup=False)
    console().print_json(data=response.body)
