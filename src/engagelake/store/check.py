"""`engagelake check` and `engagelake repair`: verify a local store against its ledger, and undo
what a dead or damaged commit left, where that is safe.

The check reads, for the ledger and for every table at the version the ledger names: each Delta
log entry (it must parse, and the entries must follow each other), the version itself, and every
data file that version references (it must exist, its Parquet footer must read, and its row count
must be the log's). Tables whose log goes past the ledger's version hold a batch (or a run merge)
that never committed: the next writer rolls them back, so that alone is no problem. A ledger row
file that no ledger log entry references, of a batch after the head, is one: the ledger's newest
log entry was deleted or lost, and rolling the tables back would drop a batch silently, so
writers refuse (`DeltaStore._recover`) until `repair` is asked to.

`repair` does only what loses nothing that was committed and readable: it rolls tables back to
the ledger's versions (as the next writer would), and moves aside, into
`<store>/_repaired/<time>/`, log entries past the ledger's version that do not parse, a newest
ledger log entry that does not parse, and ledger row files no log entry references. The last
two discard the batch they held (its rows stay in the tables' files until a compaction), which
the plan says before it runs. Anything else (a data file or log entry the ledger's versions
need) is not repairable here: restore it from a backup.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from engagelake.errors import StoreDamaged, StoreError
from engagelake.store.delta import COMPACTING, LEDGER, DeltaStore, writer_lock
from engagelake.store.footers import INDEX_FOLDER, data_file_of
from engagelake.tables.schema import STORED

REPAIRED = "_repaired"  # where `repair` moves the files it takes out of a store
_ENTRY = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(\.\d+\.\d+)?\.parquet$")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a store: the file (or folder) at fault, and what is wrong with it."""

    path: str
    what: str
    repairable: bool = False  # `repair` fixes it (the plan says how)

    def __str__(self) -> str:
        return f"{self.path}: {self.what}"


@dataclass
class Report:
    """What `check` found, and what `repair` would do about it."""

    uri: str
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # normal states worth saying
    rollback: dict[str, tuple[int, int]] = field(default_factory=dict)  # table: (newest, ledger's)
    aside: list[Path] = field(default_factory=list)  # files `repair` moves into REPAIRED
    discarded: list[int] = field(default_factory=list)  # batches the moves aside discard
    checked: dict[str, int] = field(default_factory=dict)  # table: data files verified
    current: dict[str, set[str]] = field(default_factory=dict)  # table: its data files at the ledger's version
    head: int | None = None  # the ledger's newest batch (after a repair: the one kept)

    @property
    def healthy(self) -> bool:
        return not self.problems

    @property
    def repairable(self) -> bool:
        """Whether `repair` would change anything."""
        return bool(self.rollback or self.aside)

    def plan(self) -> list[str]:
        """What `repair` will do, one plain line each."""
        lines = [f"move aside {path.relative_to(self.uri)} (into {REPAIRED}/)" for path in self.aside]
        lines += [f"discard batch {batch}: no ledger log entry names it any more; its rows stay, unpublished, "
                  "in the table files until `engagelake compact`" for batch in self.discarded]
        lines += [f"roll {name} back from version {newest} to version {named}, the version the ledger names"
                  for name, (newest, named) in sorted(self.rollback.items())]
        return lines

    def unrepairable(self) -> list[Problem]:
        return [p for p in self.problems if not p.repairable]


def log_entries(table: Path) -> dict[int, Path]:
    """A table's Delta log entries by version."""
    folder = table / "_delta_log"
    if not folder.is_dir():
        return {}
    return {int(m.group(1)): p for p in folder.iterdir() if (m := _ENTRY.match(p.name))}


def _checkpoints(table: Path) -> list[int]:
    folder = table / "_delta_log"
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _CHECKPOINT.match(p.name))) \
        if folder.is_dir() else []


def entry_error(path: Path) -> str | None:
    """Why a Delta log entry does not parse (each line one JSON action), or None."""
    try:
        text = path.read_bytes()
    except OSError as error:
        return f"cannot be read ({error.strerror})"
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return "is empty"
    for number, line in enumerate(lines, 1):
        try:
            action = orjson.loads(line)
        except orjson.JSONDecodeError as error:
            return f"does not parse (line {number}: {error}); it is truncated or corrupt"
        if not isinstance(action, dict):
            return f"does not parse (line {number} is not a Delta action)"
    return None


def check_store(uri: str | Path) -> Report:
    """Check the store at `uri` (a local folder) without locking it; see the module docstring."""
    root = Path(uri)
    report = Report(str(root))
    if not root.is_dir():
        report.problems.append(Problem(str(root), "is not a folder" if root.exists() else "does not exist"))
        return report
    ledger = root / LEDGER
    entries = log_entries(ledger)
    if not entries:
        tables = [name for name in STORED if (root / name / "_delta_log").is_dir()]
        what = (f"missing: the store's tables ({', '.join(tables[:5])}{', ...' if len(tables) > 5 else ''}) "
                "have no ledger naming their committed versions; restore the ledger from a backup") if tables \
            else "missing: this folder holds no engagelake store"
        report.problems.append(Problem(str(ledger / "_delta_log"), what))
        return report
    version = _check_log(report, ledger, None, ledger_log=True)
    if version is None:
        return report
    if not _check_files(report, ledger, LEDGER, version):
        return report
    try:  # a row per batch ever committed: the numbers of all, the versions of the newest only
        table = DeltaTable(str(ledger), version=version)
        batches = pa.table(table.to_pyarrow_table(columns=["batch_no"])).column("batch_no")
        head = pc.max(batches).as_py()
        newest = pa.table(table.to_pyarrow_table(columns=["versions"], filters=[("batch_no", "=", head)])) \
            if head is not None else None
    except Exception as error:  # noqa: BLE001 - any failure to read is the finding
        report.problems.append(Problem(str(ledger), f"version {version} cannot be read ({_first_line(error)})"))
        return report
    if newest is None or newest.num_rows == 0:
        report.problems.append(Problem(str(ledger), "holds no rows: it was not written by engagelake"))
        return report
    report.head = head
    versions: dict[str, int] = orjson.loads(newest.column("versions")[0].as_py())
    _lost_ledger_rows(report, table, report.head)
    compacting = (root / COMPACTING).exists()
    if compacting:
        report.notes.append(f"a compaction did not finish ({COMPACTING} is there): the next writer rolls it "
                            "forward; `engagelake repair` does too")
    for name in sorted(versions):
        _check_table(report, root / name, name, versions[name], compacting=compacting)
    unnamed = [name for name in STORED if name not in versions and log_entries(root / name)]
    if unnamed:
        report.notes.append(f"tables the ledger does not name yet (written by a writer that died, or built by "
                            f"an unfinished compaction): {', '.join(unnamed)}")
    if report.rollback and not report.discarded:
        report.notes.append(f"tables ahead of the ledger, holding a batch or run merge that never committed: "
                            f"{', '.join(sorted(report.rollback))}; the next writer rolls them back (so does "
                            "`engagelake repair`)")
    if report.discarded and not report.rollback and not compacting:
        report.notes.append("no table is ahead of the ledger: the lost batch wrote no rows")
    _footers_note(report, root)
    return report


def _footers_note(report: Report, root: Path) -> None:
    """What the read caches beside the tables hold (`store/footers.py`, `store/records.py`): a
    reader rebuilds or goes without any of them, so they are counted, not checked."""
    folder = root / INDEX_FOLDER
    count = size = stale = stale_size = 0
    for table in sorted(folder.iterdir()) if folder.is_dir() else []:
        current = report.current.get(table.name, set())
        for path in table.iterdir() if table.is_dir() else []:
            n = path.stat().st_size
            count, size = count + 1, size + n
            if data_file_of(path.name) not in current:
                stale, stale_size = stale + 1, stale_size + n
    if not count:
        return
    line = f"read caches ({INDEX_FOLDER}/: footer indexes, Bloom filters, record copies): {count:,} files, {_mib(size)}"
    if stale:
        line += (f"; {stale:,} of them ({_mib(stale_size)}) serve data files the ledger's versions no longer use "
                 "(merged away): `engagelake compact` removes them")
    report.notes.append(line)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _check_log(report: Report, table: Path, named: int | None, *, ledger_log: bool = False) -> int | None:
    """Check a table's log entries; returns the newest version that may be loaded (for the
    ledger: its newest good entry; None when the log cannot be used). `named`: the version the
    ledger names (entries past it belong to no committed batch)."""
    entries = log_entries(table)
    if not entries:
        report.problems.append(Problem(str(table / "_delta_log"), "missing or empty: the table has no Delta log; "
                                       "restore it from a backup"))
        return None
    checkpoints = _checkpoints(table)
    first, newest = min(entries), max(entries)
    gaps = [v for v in range(first, newest + 1) if v not in entries]
    if first > 0 and not any(c >= first - 1 for c in checkpoints):
        gaps = list(range(0, first)) + gaps
    for version in gaps:
        report.problems.append(Problem(str(table / "_delta_log" / f"{version:020d}.json"),
                                       "missing: the log has a hole; restore the entry from a backup"))
    bad = {v: why for v, p in entries.items() if (why := entry_error(p)) is not None}
    usable = newest
    for version, why in sorted(bad.items()):
        path = entries[version]
        if ledger_log and version == newest:
            report.problems.append(Problem(str(path), f"{why}. It is the ledger's newest entry: the batch it "
                                           "committed is lost unless the entry is restored from a backup; "
                                           "`engagelake repair` moves it aside and keeps the batches before",
                                           repairable=True))
            report.aside.append(path)
            usable = newest - 1
        elif named is not None and version > named:
            report.problems.append(Problem(str(path), f"{why}. It is past the version the ledger names "
                                           f"({named}), so it holds nothing committed; `engagelake repair` moves "
                                           "it aside", repairable=True))
            report.aside.append(path)
        else:
            report.problems.append(Problem(str(path), f"{why}. The committed data needs it: restore it from a "
                                           "backup"))
    if gaps or any(entries[v] not in report.aside for v in bad):
        return None
    if usable < first:
        report.problems.append(Problem(str(table / "_delta_log"), "holds no complete entry"))
        return None
    return usable


def _check_table(report: Report, table: Path, name: str, named: int, *, compacting: bool) -> None:
    usable = _check_log(report, table, named)
    if usable is None:
        return
    entries = log_entries(table)
    newest = max(entries)
    if newest < named:
        report.problems.append(Problem(str(table / "_delta_log" / f"{newest + 1:020d}.json"),
                                       f"missing: the ledger names version {named} of {name} but its log ends at "
                                       f"version {newest}; restore the log entries from a backup"))
        return
    if newest > named and not compacting and _restored_to(entries[newest]) != named:
        past = [entries[v] for v in sorted(entries) if v > named]
        if any(path in report.aside for path in past):  # a torn entry: every uncommitted one goes aside
            report.aside.extend(path for path in past if path not in report.aside)
        else:
            report.rollback[name] = (newest, named)
    _check_files(report, table, name, named)


def _restored_to(entry: Path) -> int | None:
    """The version a RESTORE log entry went back to (a table rolled back and not written since
    holds the ledger's version's content one entry later), else None."""
    try:
        with entry.open("rb") as handle:
            info = orjson.loads(handle.readline()).get("commitInfo") or {}
        return int(info["operationParameters"]["version"]) if info.get("operation") == "RESTORE" else None
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None


def _check_files(report: Report, table: Path, name: str, version: int) -> bool:
    """Every data file of one table version exists, its footer reads and holds the rows its
    add action says; False when one does not (or the version cannot be loaded)."""
    try:
        actions = pa.table(DeltaTable(str(table), version=version).get_add_actions(flatten=True))
    except Exception as error:  # noqa: BLE001 - any failure to load is the finding
        report.problems.append(Problem(str(table), f"version {version} cannot be loaded ({_first_line(error)}); "
                                       "restore the table from a backup"))
        return False
    ok = True
    report.current[name] = set()
    for relative, rows in zip(actions.column("path").to_pylist(), actions.column("num_records").to_pylist(),
                              strict=True):
        path = _data_path(table, relative)
        report.current[name].add(path.name)
        if not path.exists():
            what = (f"missing: version {version} of {name} references it; restore it from a backup "
                    "(a table cannot be read without it)")
            report.problems.append(Problem(str(path), what))
            ok = False
            continue
        try:
            held = pq.read_metadata(path).num_rows
        except (OSError, pa.ArrowException) as error:
            report.problems.append(Problem(str(path), f"is not a readable Parquet file ({_first_line(error)}); "
                                           "restore it from a backup"))
            ok = False
            continue
        if rows is not None and held != rows:
            report.problems.append(Problem(str(path), f"holds {held} rows, the log says {rows}; restore it "
                                           "from a backup"))
            ok = False
    report.checked[name] = actions.num_rows
    return ok


def _lost_ledger_rows(report: Report, ledger: DeltaTable, head: int) -> None:
    """Ledger row files no log entry references, of batches after the head: a lost entry."""
    for path, batch in lost_ledger_rows(Path(report.uri), ledger, head):
        report.problems.append(Problem(
            str(path), f"holds the ledger row of batch {batch}, but no ledger log entry references it: the "
            f"ledger's newest log entry was deleted or lost (or a writer died while committing it), so batch "
            f"{batch} is invisible and writers refuse to roll its rows back. Restore the ledger's log entry "
            f"from a backup; or `engagelake repair` discards batch {batch}", repairable=True))
        report.aside.append(path)
        report.discarded.append(batch)


def lost_ledger_rows(root: Path, ledger: DeltaTable, head: int) -> list[tuple[Path, int]]:
    """(file, batch) of the ledger row files in `root`'s ledger folder that `ledger` (loaded)
    does not reference and that hold a batch after `head`."""
    folder = root / LEDGER
    present = {p.name: p for p in folder.iterdir() if p.is_file() and p.suffix == ".parquet"}
    if len(present) <= len(known := {unquote(p).rsplit("/", 1)[-1] for p in
                                     pa.table(ledger.get_add_actions(flatten=True)).column("path").to_pylist()}):
        return []
    lost = []
    for file_name, path in sorted(present.items()):
        if file_name in known:
            continue
        try:
            batches = pq.read_table(path, columns=["batch_no"]).column("batch_no").to_pylist()
        except (OSError, pa.ArrowException):
            continue  # an unreadable stray file holds no batch to lose
        if batches and max(b for b in batches if b is not None) > head:
            lost.append((path, max(b for b in batches if b is not None)))
    return lost


def _data_path(table: Path, relative: str) -> Path:
    if "://" in relative:
        return Path(unquote(relative.split("://", 1)[1]))
    return table / unquote(relative)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def check(uri: str | Path) -> Report:
    """`check_store` under the writer lock when the store can be locked (a live writer's commit
    in flight would look like a lost ledger entry), without it in a read-only store."""
    if "://" in str(uri):
        raise StoreError(f"check and repair need a local store; {uri} is not one")
    root = Path(uri)
    if not (root / LEDGER).is_dir():
        return check_store(root)
    try:
        with writer_lock(root):
            return check_store(root)
    except StoreError:  # read-only: no writer can be running
        return check_store(root)


def repair(uri: str | Path) -> Report:
    """Check the store under the writer lock and do what the report's plan says; returns the
    report the plan came from (check again to see the result). Raises StoreDamaged, and changes
    nothing, when a problem is not repairable."""
    if "://" in str(uri):
        raise StoreError(f"check and repair need a local store; {uri} is not one")
    root = Path(uri)
    with writer_lock(root):
        report = check_store(root)
        if blocking := report.unrepairable():
            raise StoreDamaged(f"the store at {root} has problems `engagelake repair` cannot fix safely; nothing was "
                               "changed:\n" + "\n".join(f"  {p}" for p in blocking))
        if report.aside:
            target = root / REPAIRED / datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
            for path in report.aside:
                destination = target / path.relative_to(root)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(path, destination)
        for name, (_, named) in report.rollback.items():
            table = DeltaTable(str(root / name))
            if table.version() > named:
                table.restore(named)
    if (root / COMPACTING).exists():  # a dead compaction: opening a snapshot rolls it forward
        DeltaStore(root, create=False).snapshot()
    return report


def describe(report: Report, limit: int = 3) -> str:
    """The first problems of a report, as the message of a StoreDamaged."""
    lines = [str(p) for p in report.problems[:limit]]
    more = len(report.problems) - limit
    if more > 0:
        lines.append(f"... and {more} more")
    return "\n".join(lines)


def iter_lines(report: Report) -> Iterator[str]:
    """The report as plain lines: problems, then notes, then a summary."""
    yield from (f"PROBLEM {p}" for p in report.problems)
    yield from (f"note: {n}" for n in report.notes)
    files = sum(report.checked.values())
    state = "healthy" if report.healthy else f"{len(report.problems)} problem(s)"
    yield f"{report.uri}: {state}; head batch {report.head}, {len(report.checked)} tables, {files} data files checked"
