"""Deployments of the flows, and the long-running process that serves them.

    python flows/serve.py --store data/store --landing data/landing

registers the deployments below with the Prefect server at `PREFECT_API_URL` and runs their
flow runs, scheduled or triggered (`prefect deployment run <flow>/<deployment>`), until it is
stopped (Ctrl-C pauses the schedules). `docs/operations.md` walks through it.

| deployment | schedule (cron, `--timezone`) | parameters |
|---|---|---|
| `track_batch/nightly-track` | `0 2 * * *` (02:00) | `folder` (the landing folder), `store` |
| `compact_store/daily-compaction` | `0 4 * * *` (04:00) | `store` |
| `cleanup_push_token_profiles/monthly-cleanup` | `0 3 1 * *` (03:00 on the 1st) | `store` |
| `export_batch/on-demand` | none: run on demand | `store`, `out_dir`; give `identifiers_file_or_list` |
| `export_all/on-demand` | none: run on demand | `store`, `out_dir` |

Tasks retry on transient I/O errors only (`flows._retry.IO_TASK_OPTIONS`); the flows themselves
do not retry. Importing this module starts nothing: `build_deployments()` returns the list,
`main()` serves it.
"""

from __future__ import annotations

import argparse
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # Prefect and the flows load when deployments are built: `--help` is quick
    from prefect import Flow
    from prefect.deployments.runner import RunnerDeployment

NIGHTLY_TRACK_CRON = "0 2 * * *"
DAILY_COMPACTION_CRON = "0 4 * * *"
MONTHLY_CLEANUP_CRON = "0 3 1 * *"
TAGS = ["engagelake"]

DEFAULTS = {  # flag: (environment variable, default)
    "store": ("ENGAGELAKE_STORE", "data/store"),
    "landing": ("ENGAGELAKE_LANDING", "data/landing"),
    "exports": ("ENGAGELAKE_EXPORTS", "data/exports"),
    "timezone": ("ENGAGELAKE_TIMEZONE", "UTC"),
}


DESCRIPTION = """\
Register the engagelake deployments with the Prefect server at PREFECT_API_URL and run
their flow runs, scheduled or triggered, until stopped (Ctrl-C or SIGTERM pauses the
schedules). Without PREFECT_API_URL, Prefect starts a temporary server for this process
on a random local port, which stops with it. Relative paths are made absolute.
See docs/operations.md."""

EPILOG = """deployments:
  track_batch/nightly-track                    cron --track-cron: apply the landing folder's files
  compact_store/daily-compaction               cron --compaction-cron: current rows only, old files go
  cleanup_push_token_profiles/monthly-cleanup  cron --cleanup-cron: tokenless push_token_import profiles go
  export_batch/on-demand                       no schedule; needs identifiers_file_or_list
  export_all/on-demand                         no schedule

examples:
  prefect server start --port 4200 &                  # a server that keeps runs and schedules
  export PREFECT_API_URL=http://127.0.0.1:4200/api
  python flows/serve.py --store data/store --landing data/landing
  prefect deployment run track_batch/nightly-track    # from another shell: run one now
  prefect deployment run export_batch/on-demand -p identifiers_file_or_list=/abs/ids.txt
"""


def build_deployments(
    store: str = "data/store",
    landing: str = "data/landing",
    exports: str = "data/exports",
    *,
    timezone: str = "UTC",
    track_cron: str = NIGHTLY_TRACK_CRON,
    compaction_cron: str = DAILY_COMPACTION_CRON,
    cleanup_cron: str = MONTHLY_CLEANUP_CRON,
) -> list[RunnerDeployment]:
    """The deployments of the flows over one store: the nightly track of `landing`, the daily
    compaction, the monthly push-token profile cleanup, and exports on demand into `exports`.
    Entrypoints are module paths (`flows.track_batch.track_batch`), so a run finds its flow
    wherever the serving process runs."""
    from prefect.deployments.runner import EntrypointType, RunnerDeployment
    from prefect.schedules import Cron

    from flows.cleanup_push_tokens import cleanup_push_token_profiles
    from flows.export_batch import export_all, export_batch
    from flows.track_batch import compact_store, track_batch

    def deploy(flow: Flow[..., Any], name: str, description: str, parameters: dict[str, str],
               cron: str | None = None) -> RunnerDeployment:
        schedules = [Cron(cron, timezone=timezone)] if cron else None
        deployment = flow.to_deployment(  # `_sync`: a RunnerDeployment, also under a running loop
            name, schedules=schedules, parameters=parameters, description=description,
            tags=TAGS, entrypoint_type=EntrypointType.MODULE_PATH, _sync=True)  # type: ignore[call-arg]
        assert isinstance(deployment, RunnerDeployment)
        return deployment

    return [
        deploy(track_batch, "nightly-track",
               f"Apply every request file of {landing} to {store}, one batch per file (re-runs apply "
               "nothing again).", {"folder": landing, "store": store}, track_cron),
        deploy(compact_store, "daily-compaction",
               f"Rewrite the tables of {store} to their current rows and delete old files.",
               {"store": store}, compaction_cron),
        deploy(cleanup_push_token_profiles, "monthly-cleanup",
               f"Delete push_token_import's temporary profiles without a push token from {store}.",
               {"store": store}, cleanup_cron),
        deploy(export_batch, "on-demand",
               f"Export users of {store} by external ID; give identifiers_file_or_list (a file or a "
               "list) and, optionally, out_dir.",
               {"store": store, "out_dir": f"{exports}/export_batch"}),
        deploy(export_all, "on-demand", f"Export every user of {store}.",
               {"store": store, "out_dir": f"{exports}/export_all"}),
    ]


def absolute(location: str) -> str:
    """A local path made absolute (runs may start from another folder); a URI as it is."""
    return location if "://" in location else str(Path(location).absolute())


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    def default(name: str) -> str:
        variable, fallback = DEFAULTS[name]
        return os.environ.get(variable) or fallback

    parser = argparse.ArgumentParser(
        prog="python flows/serve.py",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--store", default=default("store"),
                        help="the store's folder or URI (env ENGAGELAKE_STORE; default: %(default)s)")
    parser.add_argument("--landing", default=default("landing"),
                        help="the folder of request files the nightly track applies "
                        "(env ENGAGELAKE_LANDING; default: %(default)s)")
    parser.add_argument("--exports", default=default("exports"),
                        help="where exports on demand write, in export_batch/ and export_all/ "
                        "(env ENGAGELAKE_EXPORTS; default: %(default)s)")
    parser.add_argument("--timezone", default=default("timezone"),
                        help="the schedules' time zone (env ENGAGELAKE_TIMEZONE; default: %(default)s)")
    parser.add_argument("--track-cron", default=NIGHTLY_TRACK_CRON, help="default: %(default)s")
    parser.add_argument("--compaction-cron", default=DAILY_COMPACTION_CRON, help="default: %(default)s")
    parser.add_argument("--cleanup-cron", default=MONTHLY_CLEANUP_CRON, help="default: %(default)s")
    parser.add_argument("--limit", type=int, default=None,
                        help="at most this many flow runs at once (default: no limit)")
    parser.add_argument("--list", action="store_true",
                        help="print the deployments and their parameters, then exit without serving")
    return parser.parse_args(argv)


def describe(deployments: Sequence[RunnerDeployment]) -> str:
    """One line per deployment: full name, schedule, entrypoint, parameters."""
    from prefect.client.schemas.schedules import CronSchedule

    lines = []
    for d in deployments:
        crons = ", ".join(f"{s.schedule.cron} {s.schedule.timezone}" for s in d.schedules or ()
                          if isinstance(s.schedule, CronSchedule)) or "on demand"
        parameters = " ".join(f"{k}={v}" for k, v in d.parameters.items())
        lines.append(f"{d.flow_name}/{d.name}  [{crons}]  {d.entrypoint}  {parameters}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Build the deployments from the flags (or environment) and serve them."""
    args = parse_args(argv)
    deployments = build_deployments(
        absolute(args.store), absolute(args.landing), absolute(args.exports), timezone=args.timezone,
        track_cron=args.track_cron, compaction_cron=args.compaction_cron, cleanup_cron=args.cleanup_cron)
    if args.list:
        print(describe(deployments))
        return
    from prefect import serve

    # On SIGTERM, Prefect 3.8.8's runner calls its async-dispatched stop() inside the event loop,
    # which returns a coroutine nobody awaits: a RuntimeWarning, while the shutdown itself
    # (pausing the schedules) completes. Not an error, so not in the log.
    warnings.filterwarnings("ignore", message="coroutine 'Runner.astop' was never awaited", category=RuntimeWarning)
    serve(*deployments, limit=args.limit)


if __name__ == "__main__":
    main()
