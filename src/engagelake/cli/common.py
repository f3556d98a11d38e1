"""What every command of the `engagelake` CLI shares: the --store option, opening a store that
must exist, the consoles (stdout for results, stderr for progress), and the red one-line
error exit.

Only typer and the standard library are imported here at module level: `engagelake --help`
imports every command module, and must not load polars, duckdb, deltalake or prefect.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    from rich.progress import Progress

    from engagelake.workspace import Workspace

DEFAULT_STORE = "data/store"

Store = Annotated[
    str,
    typer.Option(
        "--store",
        "-s",
        help="Store location: a folder or a URI. demo, apply, serve and the create commands make a new store "
        "where the path is missing or an empty folder; no command makes one over other files.",
        envvar="ENGAGELAKE_STORE",
    ),
]


@contextmanager
def input_errors() -> Iterator[None]:
    """Turn engagelake's own errors and file errors into a red one-line message and exit 1."""
    from engagelake.errors import EngagelakeError

    try:
        yield
    except (EngagelakeError, OSError) as error:
        fail(str(error))


def fail(message: str) -> NoReturn:
    """Print `error: <message>` in red on stderr and exit with code 1."""
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/bold red] {escape(message)}")
    raise typer.Exit(1)


def stderr() -> Any:
    """The stderr console: progress and status displays go there, never into piped output."""
    from rich.console import Console

    return Console(stderr=True)


def progress(*columns: Any, transient: bool = False) -> Progress:
    """A rich progress display on stderr, shown only when stderr is a terminal (not in pipes,
    logs or tests, where a redrawn bar would garble the text)."""
    from rich.progress import Progress

    console = stderr()
    return Progress(*columns, console=console, transient=transient, disable=not console.is_terminal)


def say(message: str, *, markup: bool = True) -> None:
    """Print a message on stdout, unwrapped (a terminal wraps it; a pipe gets it whole)."""
    console().print(message, markup=markup, soft_wrap=True)


def console() -> Any:
    """The stdout console (created per call so that test runners can capture it)."""
    from rich.console import Console

    return Console()


def cell(value: Any) -> str:
    """A table cell: the value's text, with rich markup escaped."""
    from rich.markup import escape

    return escape(str(value))


def open_existing(store: str, **options: Any) -> Workspace:
    """Open a store that must exist already (reading commands never create one); `options`
    go to `Workspace.open`."""
    from engagelake import Workspace

    if "://" not in store and not Path(store).exists():
        fail(
            f"no store at {store!r}; pass --store PATH, or create one with `engagelake demo` or `engagelake apply FILE`"
        )
    return Workspace.open(store, create=False, **options)
