"""How the `engagelake` CLI shows results on a terminal: tables of frames and rows, lineage
trees, forget-check reports, the apply summary's rows. Rich and the engine's modules are imported
inside each function (`engagelake --help` imports this module)."""

from __future__ import annotations

import shlex
from datetime import datetime
from typing import TYPE_CHECKING, Any

from engagelake.cli.common import cell, console, say

if TYPE_CHECKING:
    from engagelake.files import AppliedFile
    from engagelake.workspace import ForgetReport


def print_frame(frame: Any, limit: int) -> None:
    """Print a polars frame as a rich table, at most `limit` rows."""
    from rich.table import Table

    table = Table(*frame.columns)
    for row in frame.head(limit).iter_rows():
        table.add_row(*("[dim]null[/dim]" if v is None else cell(v) for v in row))
    console().print(table)
    if frame.height > limit:
        say(f"[dim]… {frame.height - limit:,} more rows (--limit {limit})[/dim]")


def print_rows(rows: list[dict[str, Any]], columns: dict[str, str]) -> None:
    """A table of `rows`, one column per header -> field (lists joined, times to the second,
    nulls blank)."""
    from rich.table import Table

    def text(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, list):
            return ", ".join(map(cell, value))
        if isinstance(value, datetime):
            return value.strftime("%Y-%m-%d %H:%M:%S %Z")
        return cell(value)

    table = Table(*columns)
    for row in rows:
        table.add_row(*(text(row[field]) for field in columns.values()))
    console().print(table)


def print_lineage_tree(title: str, rows: Any, limit: int) -> None:
    """Print lineage rows (the first `limit`) as a rich tree: each profile not merged away, its
    steps in order, and under each applied merge the merged profile's own steps."""
    from rich.markup import escape
    from rich.tree import Tree

    from engagelake.rules.identity.lineage import LineageStep, ProfileHistory, lineage_tree

    def step_text(step: LineageStep) -> str:
        text = f"[dim]{step.at:%Y-%m-%d %H:%M:%S}[/dim]  [bold]{step.kind}[/bold] {escape(step.source or '')}"
        text += f" → {escape(step.target)}" if step.target is not None else ""
        if step.merged is not None:
            text += f"  [dim](profile {step.merged.service_id[:8]} merged in)[/dim]"
        if step.outcome != "applied":
            text += f"  [yellow]{escape(step.outcome)}: {escape(step.reason or 'no reason given')}[/yellow]"
        return text

    def add_steps(branch: Tree, history: ProfileHistory) -> None:
        for step in history.steps:
            node = branch.add(step_text(step))
            if step.merged is not None:
                add_steps(node, step.merged)

    roots, loose = lineage_tree(rows.head(limit))
    tree = Tree(f"[bold]{escape(title)}[/bold]: {rows.height:,} lineage row(s)")
    for root in roots:
        state = "[red]deleted[/red]" if root.deleted else "[green]live[/green]"
        add_steps(tree.add(f"profile {root.service_id[:8]} ({state})"), root)
    if loose:
        branch = tree.add("[dim]steps that resolved to no profile[/dim]")
        for step in loose:
            branch.add(step_text(step))
    console().print(tree)
    if rows.height > limit:
        say(f"[dim]… {rows.height - limit:,} more rows (--limit {limit})[/dim]")


def print_forget_report(report: ForgetReport) -> None:
    """Where the values occur (a table: one row per file, place and column), the retained old
    versions, the files that could not be searched whole, and a verdict."""
    from rich.table import Table

    from engagelake import Workspace

    places_in_order = Workspace.forget_places()
    out = console()
    out.print(f"searched {report.files:,} files under {cell(report.root)} for {len(report.values)} value(s)")
    if report.profiles:  # the values a check after the delete needs: the profile is gone then
        out.print(f"the identifiers name {report.profiles} profile(s): their current values are searched too. "
                  "To check them after the delete, pass:")
        out.print(cell(" ".join(f"--value {shlex.quote(v)}" for v in report.values)), soft_wrap=True)
    places: dict[tuple[str, str, str], tuple[list[str], list[str]]] = {}
    for o in sorted(report.occurrences, key=lambda o: (o.path, places_in_order.index(o.place))):
        values, details = places.setdefault((o.path, o.place, o.column or ""), ([], []))
        values.extend(v for v in [o.value] if v not in values)
        details.extend(d for d in [o.detail] if d and d not in details)
    if places:
        table = Table("file", "place", "column", "values", "detail", title="copies found")
        table.columns[0].overflow = "fold"
        for (path, place, column), (values, details) in places.items():
            detail = ", ".join(details[:2]) + (f", ... ({len(details)} in all)" if len(details) > 2 else "")
            table.add_row(cell(path), place, cell(column), cell(", ".join(values)), cell(detail))
        out.print(table)
    if report.retained:
        table = Table("table", "version", "old data files", "old log entries",
                      title="old versions still on disk (vacuum retention)")
        table.columns[2].overflow = table.columns[3].overflow = "fold"
        for kept in report.retained:
            table.add_row(cell(kept.table), str(kept.version), cell("\n".join(kept.old_files) or "-"),
                          cell("\n".join(kept.old_log_entries) or "-"))
        out.print(table)
    for line in report.notes:
        out.print(f"[dim]note: {cell(line)}[/dim]")
    for line in report.unreadable:
        out.print(f"[bold red]not searched whole[/bold red] (raw bytes only): {cell(line)}")
    if report.occurrences:
        found = len({o.value for o in report.occurrences})
        out.print(f"[bold red]{found} of {len(report.values)} value(s) found in {len(places)} place(s) of "
                  f"{len({o.path for o in report.occurrences})} file(s)[/bold red]")
    elif report.unreadable:
        out.print("[bold red]no copy found in the files searched, but some could not be searched whole[/bold red]")
    else:
        out.print("[bold green]no copy of any value found[/bold green]"
                  + (" (old versions are still on disk: see above)" if report.retained else ""))


def applied_row(applied: AppliedFile) -> tuple[str, ...]:
    """One summary row of an applied request file."""
    statuses = ", ".join(f"{status}×{count}" for status, count in applied.statuses.items())
    return (
        applied.path.name, f"{applied.requests:,}", statuses, f"{applied.errors:,}",
        f"{applied.seconds:.2f}",
    )  # fmt: skip


def message(body: Any) -> str:
    """A rejected response's message, for one line of the summary."""
    text = body.get("message") if isinstance(body, dict) else None
    return str(text if text is not None else body)[:200]
