"""`engagelake check` and `engagelake repair`: verify a store (a local folder or on object
storage) against its ledger, and undo what a dead or damaged commit left, where that is safe.

The check reads, for the ledger and for every table at the version the ledger names: each Delta
log entry (it must parse, and the entries must follow each other), the version itself, and every
data file that version references (it must exist, its Parquet footer must read, and its row count
must be the log's; with `deep`, every page must decode). Tables whose log goes past the ledger's version hold a batch (or a run merge)
that never committed: the next writer rolls them back, so that alone is no problem. A ledger row
file that no ledger log entry references, of a batch after the head, is one: the ledger's newest
log entry was deleted or lost, and rolling the tables back would drop a batch silently, so
writers refuse (`DeltaStore.recover`) until `repair` (store/repair.py) is asked to.

`repair` does only what loses nothing that was committed and readable: it rolls tables back to
the ledger's versions (as the next writer would), and moves aside, into
`<store>/_repaired/<time>/`, log entries past the ledger's version that do not parse, a newest
ledger log entry that does not parse, and ledger row files no log entry references. The last
two discard the batch they held (its rows stay in the tables' files until a compaction), which
the plan says before it runs. Anything else (a data file or log entry the ledger's versions
need) is not repairable here: restore it from a backup.

On object storage the check lists each table's log and data objects once (a listing is paged,
not a request per object), reads every log entry and every data file's footer, and holds the
store's lease while it runs, as a writer would; a move aside is a copy and a delete.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from engagelake.errors import StoreDamaged, StoreError, StoreReadOnly
from engagelake.store import objects, wal
from engagelake.store.footers import INDEX_FOLDER, data_file_of
from engagelake.store.layout import COMPACTING, LEDGER, writer_lock
from engagelake.store.lease import Lease
from engagelake.tables.schema import STORED

REPAIRED = "_repaired"  # where `repair` moves the files it takes out of a store
_ENTRY = objects.LOG_ENTRY
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
    aside: list[str] = field(default_factory=list)  # files `repair` moves into REPAIRED
    discarded: list[int] = field(default_factory=list)  # batches the moves aside discard
    checked: dict[str, int] = field(default_factory=dict)  # table: data files verified
    current: dict[str, set[str]] = field(default_factory=dict)  # table: its data files at the ledger's version
    head: int | None = None  # the ledger's newest batch (after a repair: the one kept)
    deep: bool = False  # every data page decoded, not only the footers (`check --deep`)

    @property
    def healthy(self) -> bool:
        return not self.problems

    @property
    def repairable(self) -> bool:
        """Whether `repair` would change anything."""
        return bool(self.rollback or self.aside)

    def plan(self) -> list[str]:
        """What `repair` will do, one plain line each."""
        lines = [f"move aside {relative_path(path, self.uri)} (into {REPAIRED}/)" for path in self.aside]
        lines += [f"discard batch {batch}: no ledger log entry names it any more; its rows stay, unpublished, "
                  "in the table files until `engagelake compact`" for batch in self.discarded]
        lines += [f"roll {name} back from version {newest} to version {named}, the version the ledger names"
                  for name, (newest, named) in sorted(self.rollback.items())]
        return lines

    def unrepairable(self) -> list[Problem]:
        return [p for p in self.problems if not p.repairable]


def relative_path(path: str, root: str) -> str:
    return path[len(root.rstrip("/")) + 1:] if path.startswith(root.rstrip("/") + "/") else path


def _log_files(table: str) -> list[str]:
    """The names of the files in a table's `_delta_log` folder (none: no log)."""
    return [rel for rel in objects.files_under(objects.join(table, "_delta_log")) if "/" not in rel]


def log_entries(table: str) -> dict[int, str]:
    """A table's Delta log entries by version."""
    folder = objects.join(table, "_delta_log")
    return {int(m.group(1)): objects.join(folder, name) for name in _log_files(table) if (m := _ENTRY.match(name))}


def _checkpoints(table: str) -> list[int]:
    return sorted(int(m.group(1)) for name in _log_files(table) if (m := _CHECKPOINT.match(name)))


def entry_error(path: str) -> str | None:
    """Why a Delta log entry does not parse (each line one JSON action), or None."""
    try:
        text = objects.read_whole(path)
    except OSError as error:
        return f"cannot be read ({error.strerror or _first_line(error)})"
    if text is None:
        return "cannot be read (it is gone)"
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


def root_of(uri: str | Path) -> str:
    """A store's location as the file layer takes it: a URI, or a folder's path."""
    text = str(uri)
    return text if objects.is_remote(text) else str(Path(text.removeprefix("file://")))


def check_store(uri: str | Path, *, deep: bool = False) -> Report:
    """Check the store at `uri` (a local folder or a URI) without locking it; see the module
    docstring. `deep` decodes every data page too: a page damaged under an intact footer is
    found only so (it reads the whole store)."""
    root = root_of(uri)
    report = Report(root, deep=deep)
    if not objects.is_folder(root):
        report.problems.append(Problem(root, "is not a folder" if objects.exists(root) else "does not exist"))
        return report
    ledger = objects.join(root, LEDGER)
    entries = log_entries(ledger)
    if not entries:
        tables = [name for name in STORED if objects.is_folder(objects.join(root, f"{name}/_delta_log"))]
        what = (f"missing: the store's tables ({', '.join(tables[:5])}{', ...' if len(tables) > 5 else ''}) "
                "have no ledger naming their committed versions; restore the ledger from a backup") if tables \
            else "missing: this folder holds no engagelake store"
        report.problems.append(Problem(objects.join(ledger, "_delta_log"), what))
        return report
    version = _check_log(report, ledger, None, ledger_log=True)
    if version is None:
        return report
    if not _check_files(report, ledger, LEDGER, version):
        return report
    try:  # a row per batch ever committed: the numbers of all, the versions of the newest only
        table = objects.delta_table(ledger, version)
        batches = pa.table(table.to_pyarrow_table(columns=["batch_no"])).column("batch_no")
        head = pc.max(batches).as_py()
        newest = pa.table(table.to_pyarrow_table(columns=["versions"], filters=[("batch_no", "=", head)])) \
            if head is not None else None
    except Exception as error:  # noqa: BLE001 - any failure to read is the finding
        report.problems.append(Problem(ledger, f"version {version} cannot be read ({_first_line(error)})"))
        return report
    if newest is None or newest.num_rows == 0:
        report.problems.append(Problem(ledger, "holds no rows: it was not written by engagelake"))
        return report
    report.head = head
    versions: dict[str, int] = orjson.loads(newest.column("versions")[0].as_py())
    _lost_ledger_rows(report, table, report.head)
    compacting = objects.exists(objects.join(root, COMPACTING))
    if compacting:
        report.notes.append(f"a compaction did not finish ({COMPACTING} is there): the next writer rolls it "
                            "forward; `engagelake repair` does too")
    for name in sorted(versions):
        _check_table(report, objects.join(root, name), name, versions[name], compacting=compacting)
    if not objects.is_remote(root):
        _check_logs(report, Path(root))
    unnamed = [name for name in STORED if name not in versions and log_entries(objects.join(root, name))]
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


def _footers_note(report: Report, root: str) -> None:
    """What the read caches beside the tables hold (`store/footers.py`, `store/records.py`): a
    reader rebuilds or goes without any of them, so they are counted, not checked."""
    count = size = stale = stale_size = 0
    for rel, n in sorted(objects.files_under(objects.join(root, INDEX_FOLDER)).items()):
        table, _, name = rel.partition("/")
        if not name or "/" in name:
            continue
        count, size = count + 1, size + n
        if data_file_of(name) not in report.current.get(table, set()):
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


def _check_log(report: Report, table: str, named: int | None, *, ledger_log: bool = False) -> int | None:
    """Check a table's log entries; returns the newest version that may be loaded (for the
    ledger: its newest good entry; None when the log cannot be used). `named`: the version the
    ledger names (entries past it belong to no committed batch)."""
    entries = log_entries(table)
    if not entries:
        report.problems.append(Problem(objects.join(table, "_delta_log"), "missing or empty: the table has no "
                                       "Delta log; restore it from a backup"))
        return None
    checkpoints = _checkpoints(table)
    first, newest = min(entries), max(entries)
    gaps = [v for v in range(first, newest + 1) if v not in entries]
    if first > 0 and not any(c >= first - 1 for c in checkpoints):
        gaps = list(range(0, first)) + gaps
    for version in gaps:
        report.problems.append(Problem(objects.join(table, f"_delta_log/{version:020d}.json"),
                                       "missing: the log has a hole; restore the entry from a backup"))
    bad = {v: why for v, p in entries.items() if (why := entry_error(p)) is not None}
    usable = newest
    for version, why in sorted(bad.items()):
        path = entries[version]
        if ledger_log and version == newest:
            report.problems.append(Problem(path, f"{why}. It is the ledger's newest entry: the batch it "
                                           "committed is lost unless the entry is restored from a backup; "
                                           "`engagelake repair` moves it aside and keeps the batches before",
                                           repairable=True))
            report.aside.append(path)
            usable = newest - 1
        elif named is not None and version > named:
            report.problems.append(Problem(path, f"{why}. It is past the version the ledger names "
                                           f"({named}), so it holds nothing committed; `engagelake repair` moves "
                                           "it aside", repairable=True))
            report.aside.append(path)
        else:
            report.problems.append(Problem(path, f"{why}. The committed data needs it: restore it from a "
                                           "backup"))
    if gaps or any(entries[v] not in report.aside for v in bad):
        return None
    if usable < first:
        report.problems.append(Problem(objects.join(table, "_delta_log"), "holds no complete entry"))
        return None
    return usable


def _check_table(report: Report, table: str, name: str, named: int, *, compacting: bool) -> None:
    usable = _check_log(report, table, named)
    if usable is None:
        return
    entries = log_entries(table)
    newest = max(entries)
    if newest < named:
        report.problems.append(Problem(objects.join(table, f"_delta_log/{newest + 1:020d}.json"),
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


def _restored_to(entry: str) -> int | None:
    """The version a RESTORE log entry went back to (a table rolled back and not written since
    holds the ledger's version's content one entry later), else None."""
    try:
        info = orjson.loads((objects.read_whole(entry) or b"").split(b"\n", 1)[0]).get("commitInfo") or {}
        return int(info["operationParameters"]["version"]) if info.get("operation") == "RESTORE" else None
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None


def _check_files(report: Report, table: str, name: str, version: int) -> bool:
    """Every data file of one table version exists, its footer reads and holds the rows its
    add action says; False when one does not (or the version cannot be loaded)."""
    try:
        actions = pa.table(objects.delta_table(table, version).get_add_actions(flatten=True))
    except Exception as error:  # noqa: BLE001 - any failure to load is the finding
        report.problems.append(Problem(table, f"version {version} cannot be loaded ({_first_line(error)}); "
                                       "restore the table from a backup"))
        return False
    ok = True
    report.current[name] = set()
    present = set(objects.files_under(table))  # one listing, not a request per file
    for relative, rows in zip(actions.column("path").to_pylist(), actions.column("num_records").to_pylist(),
                              strict=True):
        path = _data_path(table, relative)
        report.current[name].add(path.rsplit("/", 1)[-1])
        if relative_path(path, table) not in present:
            what = (f"missing: version {version} of {name} references it; restore it from a backup "
                    "(a table cannot be read without it)")
            report.problems.append(Problem(path, what))
            ok = False
            continue
        try:
            with objects.open_input(path) as source:
                held = pq.read_metadata(source).num_rows
        except (OSError, pa.ArrowException) as error:
            report.problems.append(Problem(path, f"is not a readable Parquet file ({_first_line(error)}); "
                                           "restore it from a backup"))
            ok = False
            continue
        if rows is not None and held != rows:
            report.problems.append(Problem(path, f"holds {held} rows, the log says {rows}; restore it "
                                           "from a backup"))
            ok = False
        elif report.deep and (undecoded := _undecodable(path)) is not None:
            report.problems.append(Problem(path, f"holds a data page that cannot be read ({_first_line(undecoded)}); "
                                           "restore it from a backup"))
            ok = False
    report.checked[name] = actions.num_rows
    return ok


def _undecodable(path: str) -> Exception | None:
    """The error decoding every page of the Parquet file at `path` raises, if any (a row group
    at a time: memory follows the row group, not the file)."""
    try:
        with objects.open_input(path) as source:
            parquet = pq.ParquetFile(source)
            for group in range(parquet.num_row_groups):
                parquet.read_row_group(group)
    except (OSError, pa.ArrowException) as error:
        return error
    return None


def _lost_ledger_rows(report: Report, ledger: DeltaTable, head: int) -> None:
    """Ledger row files no log entry references, of batches after the head: a lost entry."""
    for path, batch in lost_ledger_rows(report.uri, ledger, head):
        report.problems.append(Problem(
            path, f"holds the ledger row of batch {batch}, but no ledger log entry references it: the "
            f"ledger's newest log entry was deleted or lost (or a writer died while committing it), so batch "
            f"{batch} is invisible and writers refuse to roll its rows back. Restore the ledger's log entry "
            f"from a backup; or `engagelake repair` discards batch {batch}", repairable=True))
        report.aside.append(path)
        report.discarded.append(batch)


def lost_ledger_rows(root: str | Path, ledger: DeltaTable, head: int) -> list[tuple[str, int]]:
    """(file, batch) of the ledger row files in `root`'s ledger folder that `ledger` (loaded)
    does not reference and that hold a batch after `head`."""
    folder = objects.join(root_of(root), LEDGER)
    present = {name: objects.join(folder, name) for name in objects.files_under(folder)
               if "/" not in name and name.endswith(".parquet")}
    if len(present) <= len(known := {unquote(p).rsplit("/", 1)[-1] for p in
                                     pa.table(ledger.get_add_actions(flatten=True)).column("path").to_pylist()}):
        return []
    lost = []
    for file_name, path in sorted(present.items()):
        if file_name in known:
            continue
        try:
            with objects.open_input(path) as source:
                batches = pq.read_table(source, columns=["batch_no"]).column("batch_no").to_pylist()
        except (OSError, pa.ArrowException):
            continue  # an unreadable stray file holds no batch to lose
        if batches and max(b for b in batches if b is not None) > head:
            lost.append((path, max(b for b in batches if b is not None)))
    return lost


def _data_path(table: str, relative: str) -> str:
    """A data file's path or URI from its add action's `path` (relative to the table, or whole)."""
    if "://" in relative:
        return unquote(relative) if objects.is_remote(relative) else unquote(relative.split("://", 1)[1])
    return objects.join(table, unquote(relative))


def _check_logs(report: Report, root: Path) -> None:
    """Write-ahead log segments a dead writer left (`store/wal.py`; a live one's writer holds the
    lock the check waits for): answered batches, which the next open writes where the tables do
    not hold them yet (a segment whose flush landed just before its writer died holds some)."""
    waiting = 0
    for path in wal.segments(root):
        try:
            waiting += len(wal.read(path).records)
        except StoreDamaged as error:
            report.problems.append(Problem(str(path), _first_line(error)))
    if waiting:
        report.notes.append(f"{waiting} answered batch(es) are in the write-ahead log ({wal.WAL}) a writer left: the "
                            "next open of the store writes those the tables do not hold yet")


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


@contextmanager
def turn(root: str) -> Iterator[Lease | None]:
    """The writer's turn at the store for a check or a repair: the lock file of a folder, the
    lease on object storage (yielded: a repair checks it is still its own before each change).
    The lease goes back as clean only if it came so: what a dead writer left that the check
    does not undo (a table the ledger does not name yet) stays for the next writer to roll
    back. A lease these credentials may not take raises StoreReadOnly."""
    if not objects.is_remote(root):
        with writer_lock(Path(root)):
            yield None
        return
    lease = Lease(root)
    try:
        lease.acquire(None)  # a dead holder's lease ends on its own
    except StoreError:
        raise
    except Exception as error:  # noqa: BLE001 - the lease table could not be written: read-only credentials
        raise StoreReadOnly(f"the store at {root} cannot be written ({_first_line(error)}): its writers' lease "
                            "cannot be taken") from error
    try:
        yield lease
    finally:
        lease.release(clean=lease.clean_before)


def check(uri: str | Path, *, deep: bool = False) -> Report:
    """`check_store` in the writer's turn when the store can be locked (a live writer's commit
    in flight would look like a lost ledger entry), without it in a read-only store."""
    root = root_of(uri)
    if not objects.is_folder(objects.join(root, LEDGER)):
        return check_store(root, deep=deep)
    try:
        with turn(root):
            return check_store(root, deep=deep)
    except StoreReadOnly as error:  # no writer can be running, or none this process may wait for
        report = check_store(root, deep=deep)
        if objects.is_remote(root):
            report.notes.append(f"checked without the writers' lease ({error}): a commit in flight would look "
                                "like damage; check again if a problem names the newest ledger entry")
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
