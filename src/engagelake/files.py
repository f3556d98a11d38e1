"""Request, response and export files: the one place that reads and writes them.

The flows and the CLI share these helpers, so a file applied by `engagelake apply` and the same
file applied by the `track_batch` flow carry the same idempotency key and give the same
responses file.

- Request files are NDJSON (one `{"method", "path", "body", "query"?}` object a line) or
  Parquet with the columns `method`, `path`, `body` (JSON text) and optionally `query` (JSON
  text, nullable).
- A responses file `<stem>.responses.ndjson` sits next to its request file, one
  `{"status", "body"}` a line, in request order.
- An export writes `users.ndjson` and `users.parquet` (nested values as JSON text columns).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from engagelake.errors import EngagelakeError

if TYPE_CHECKING:
    import polars as pl
    import pyarrow.parquet as pq

REQUEST_SUFFIXES = (".ndjson", ".parquet")
RESPONSES_SUFFIX = ".responses.ndjson"
PARQUET_COLUMNS = ("method", "path", "body", "query")
HASH_PIECE_BYTES = 1 << 20  # a request file is hashed in pieces of this size
PARQUET_BATCH_ROWS = 4096  # Parquet requests decoded at a time


class RequestFileError(EngagelakeError, ValueError):
    """A request or identifiers file that cannot be read as such; the message names the file
    and, where there is one, the line or row."""


class ResponseLike(Protocol):
    """What the files need of `engagelake.Response`."""

    @property
    def status(self) -> int: ...

    @property
    def body(self) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class RequestFile:
    """One request file: its path and the idempotency key of its exact bytes. Its requests are
    decoded as they are drawn (`iter_requests`), so a landing file of any size never exists as
    dicts: `Workspace.apply` takes them one at a time."""

    path: Path
    idempotency_key: str

    def iter_requests(self) -> Iterator[dict[str, Any]]:
        """The file's requests, in order. A line or row that is not a request raises
        `RequestFileError` naming it (inside `apply`, nothing of the batch is then committed);
        so does a file whose bytes changed since its key was computed."""
        digest = self.idempotency_key.rsplit(":", 1)[1]
        if self.path.suffix == ".parquet":
            yield from _parquet_requests(self.path, digest)
        else:
            yield from _ndjson_requests(self.path, digest)


@dataclass(frozen=True)
class AppliedFile:
    """What applying one request file gave: counts by status and where the responses are."""

    path: Path
    responses_path: Path
    requests: int
    statuses: dict[int, int]
    errors: int  # non-fatal errors of the accepted requests (fatal ones are in `statuses`)
    seconds: float = 0.0
    objects: int = 0  # objects the accepted requests processed (their responses' `*_processed`)
    # why nothing was applied: the file's batch was applied before and its stored responses
    # are gone (retention or erasure); its responses file, if any, is left as it was
    skipped: str | None = None


def skipped_file(request_file: RequestFile, why: str) -> AppliedFile:
    """The summary of a request file whose batch was applied before (nothing applied now)."""
    return AppliedFile(request_file.path, responses_path(request_file.path), 0, {}, 0, skipped=why)


def list_request_files(folder: str | Path) -> list[Path]:
    """The `*.ndjson` and `*.parquet` request files of `folder`, in sorted name order.

    Responses files (`*.responses.ndjson`) and hidden or partial files are not request files.
    """
    folder = Path(folder)
    if not folder.is_dir():
        msg = f"request folder {str(folder)!r} does not exist or is not a folder"
        raise RequestFileError(msg)
    paths = sorted(
        path
        for path in folder.iterdir()
        if path.is_file()
        and path.suffix in REQUEST_SUFFIXES
        and not path.name.endswith(RESPONSES_SUFFIX)
        and not path.name.startswith(".")
    )
    stems = Counter(path.stem for path in paths)
    if clashes := sorted(stem for stem, count in stems.items() if count > 1):
        msg = (
            f"request files in {str(folder)!r} share a name: {', '.join(clashes)} "
            "(.ndjson and .parquet); rename one so that each gets its own responses file"
        )
        raise RequestFileError(msg)
    return paths


def read_request_file(path: str | Path) -> RequestFile:
    """An NDJSON or Parquet request file, its key `"<file name>:<sha256 of its bytes>"` (the
    bytes are hashed in pieces; a Parquet file's columns are checked now, its rows as drawn)."""
    path = Path(path)
    if path.suffix not in REQUEST_SUFFIXES:
        msg = f"{path}: not a request file; expected a .ndjson or .parquet file"
        raise RequestFileError(msg)
    digest = hashlib.sha256()
    with path.open("rb") as data:
        while piece := data.read(HASH_PIECE_BYTES):
            digest.update(piece)
    if path.suffix == ".parquet":
        _parquet_columns(path, path.read_bytes())
    # a name of bytes that are not UTF-8 (read as lone surrogates) is keyed by its escape: the ledger keeps UTF-8
    name = path.name.encode("utf-8", "backslashreplace").decode()
    return RequestFile(path=path, idempotency_key=f"{name}:{digest.hexdigest()}")


def responses_path(path: str | Path) -> Path:
    """Where the responses of request file `path` go: `<stem>.responses.ndjson` beside it."""
    path = Path(path)
    return path.with_name(path.stem + RESPONSES_SUFFIX)


def write_responses_file(
    request_file: RequestFile, responses: Sequence[ResponseLike], *, seconds: float = 0.0
) -> AppliedFile:
    """Write one `{"status", "body"}` line per response next to the request file (atomically);
    `seconds` is how long applying took, for the summary."""
    target = responses_path(request_file.path)
    lines = [orjson.dumps({"status": r.status, "body": r.body}) for r in responses]
    write_bytes_atomically(target, b"".join(line + b"\n" for line in lines))
    return AppliedFile(
        path=request_file.path,
        responses_path=target,
        requests=len(responses),
        statuses=dict(sorted(Counter(r.status for r in responses).items())),
        errors=sum(len((r.body or {}).get("errors") or ()) for r in responses if r.status < 400),
        seconds=seconds,
        objects=sum(processed_objects(r.body) for r in responses if r.status < 400),
    )


def processed_objects(body: dict[str, Any] | None) -> int:
    """The objects a response says were processed: the sum of its `*_processed` counts
    (`attributes_processed`, `events_processed`, `purchases_processed`, `aliases_processed`)."""
    return sum(v for k, v in (body or {}).items() if k.endswith("_processed") and isinstance(v, int))


def read_responses_file(path: str | Path) -> list[dict[str, Any]]:
    """The `{"status", "body"}` lines of a responses file."""
    return [orjson.loads(line) for line in Path(path).read_bytes().splitlines() if line.strip()]


def read_identifiers(source: str | Path | Iterable[str]) -> list[str]:
    """External IDs from a list, a JSON array file, or a text file with one ID a line.

    Blank lines and surrounding whitespace are ignored; repeated IDs are kept once, first place.
    """
    if isinstance(source, str | Path):
        path = Path(source)
        if not path.is_file():
            msg = f"identifiers file {str(path)!r} does not exist"
            raise RequestFileError(msg)
        if path.suffix == ".json":
            values = _load_json(path, path.read_bytes())
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                msg = f"{path}: expected a JSON array of external ID strings"
                raise RequestFileError(msg)
        else:
            values = path.read_text(encoding="utf-8").splitlines()
    else:
        values = list(source)
        if not all(isinstance(v, str) for v in values):
            msg = "external IDs must be strings"
            raise RequestFileError(msg)
    return list(dict.fromkeys(v.strip() for v in values if v.strip()))


# exported fields that are not text: the rest are strings, or objects and arrays kept as JSON text
NUMERIC_EXPORT_FIELDS = {"random_bucket": "Int64", "total_revenue": "Float64"}


def export_schema(fields: Sequence[str]) -> dict[str, pl.DataType]:
    """The columns of exported users' Parquet file for `fields`, whoever the users are (a
    streamed export writes chunk after chunk under one schema)."""
    import polars as pl

    return {name: getattr(pl, NUMERIC_EXPORT_FIELDS.get(name, "String"))() for name in fields}


def users_frame(users: Sequence[dict[str, Any]], schema: dict[str, pl.DataType] | None = None) -> pl.DataFrame:
    """Exported users as a frame: one column per field (first appearance order, or `schema`'s
    columns), nested values (objects, arrays) as JSON text."""
    import polars as pl

    names = list(schema) if schema is not None else list(dict.fromkeys(name for user in users for name in user))
    columns: dict[str, pl.Series] = {}
    for name in names:
        values = [user.get(name) for user in users]
        if schema is not None and name in NUMERIC_EXPORT_FIELDS:
            columns[name] = pl.Series(name, values, dtype=schema[name], strict=False)
        elif any(isinstance(v, dict | list) for v in values):
            text = [None if v is None else orjson.dumps(v).decode() for v in values]
            columns[name] = pl.Series(name, text, dtype=pl.String)
        else:
            series = pl.Series(name, values, strict=False)
            columns[name] = series.cast(pl.String) if series.dtype == pl.Null else series
    frame = pl.DataFrame(columns, height=len(users))
    return frame if schema is None else frame.cast(dict(schema.items()))


def write_users_files(users: Sequence[dict[str, Any]], out_dir: str | Path) -> tuple[Path, Path]:
    """Write `users.ndjson` and `users.parquet` into `out_dir` (created when missing)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ndjson = out / "users.ndjson"
    write_bytes_atomically(ndjson, b"".join(orjson.dumps(user) + b"\n" for user in users))
    parquet = out / "users.parquet"
    partial = parquet.with_name(f".{parquet.name}.partial")
    users_frame(users).write_parquet(partial)
    os.replace(partial, parquet)
    return ndjson, parquet


def write_user_chunks(chunks: Iterable[Sequence[dict[str, Any]]], out_dir: str | Path,
                      fields: Sequence[str]) -> tuple[Path, Path, int]:
    """Stream chunks of exported users into `users.ndjson` and `users.parquet` (one row group
    per chunk, columns `export_schema(fields)`) in `out_dir`; each file appears whole when all
    is written. Returns both paths and the number of users."""
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ndjson, parquet = out / "users.ndjson", out / "users.parquet"
    partials = [path.with_name(f".{path.name}.partial") for path in (ndjson, parquet)]
    schema = export_schema(fields)
    count = 0
    with partials[0].open("wb") as lines, pq.ParquetWriter(partials[1], users_frame([], schema).to_arrow().schema) as rows:
        for chunk in chunks:
            lines.write(b"".join(orjson.dumps(user) + b"\n" for user in chunk))
            rows.write_table(users_frame(chunk, schema).to_arrow())
            count += len(chunk)
    for partial, path in zip(partials, (ndjson, parquet), strict=True):
        os.replace(partial, path)
    return ndjson, parquet, count


def join_user_files(parts: Sequence[tuple[Path, Path, int]], out_dir: str | Path) -> tuple[Path, Path, int]:
    """The `users.ndjson` and `users.parquet` of several exports (`write_user_chunks`), in the
    order given, as one pair in `out_dir`: lines copied as bytes, row groups as they are.
    Streamed, each file appearing whole when all is written. Returns both paths and the users."""
    import pyarrow.parquet as pq

    if not parts:
        raise ValueError("no export to join")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ndjson, parquet = out / "users.ndjson", out / "users.parquet"
    partials = [path.with_name(f".{path.name}.partial") for path in (ndjson, parquet)]
    writer: pq.ParquetWriter | None = None
    try:
        with partials[0].open("wb") as lines:
            for part_lines, part_rows, _ in parts:
                with part_lines.open("rb") as source:
                    shutil.copyfileobj(source, lines)
                rows = pq.ParquetFile(part_rows)
                writer = writer or pq.ParquetWriter(partials[1], rows.schema_arrow)
                for group in range(rows.num_row_groups):
                    writer.write_table(rows.read_row_group(group))
    finally:
        if writer is not None:
            writer.close()
    for partial, path in zip(partials, (ndjson, parquet), strict=True):
        os.replace(partial, path)
    return ndjson, parquet, sum(users for _, _, users in parts)


def write_bytes_atomically(path: Path, data: bytes) -> None:
    """Write to a new temporary file beside `path`, then rename it over `path`. The file is
    made with `O_EXCL` under a name of its own: a file or link planted in a request folder (a
    `.partial` pointing elsewhere) is never written through."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise


def _load_json(path: Path, text: bytes, where: str = "") -> Any:
    """`orjson.loads` with an error that names the file and place."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as error:
        msg = f"{path}{where}: not valid JSON ({error})"
        raise RequestFileError(msg) from error


def _ndjson_requests(path: Path, digest: str) -> Iterator[dict[str, Any]]:
    """One request object per non-blank line, read a line at a time; the lines are hashed as
    they go, and a file that no longer matches its key is refused at its end."""
    hasher = hashlib.sha256()
    with path.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            hasher.update(line)
            if line.strip():
                request = _load_json(path, line, f" line {number}")
                yield _check_request(request, path, f"line {number}")
    _check_unchanged(path, hasher.hexdigest(), digest)


def _parquet_requests(path: Path, digest: str) -> Iterator[dict[str, Any]]:
    """Rows of `method`, `path`, `body` (JSON text) and optional `query` (JSON text or null),
    decoded a row group batch at a time from the same bytes the key was computed from."""
    data = path.read_bytes()  # compressed columns: small beside the requests as dicts
    _check_unchanged(path, hashlib.sha256(data).hexdigest(), digest)
    file = _parquet_columns(path, data)
    columns = [name for name in PARQUET_COLUMNS if name in file.schema_arrow.names]
    number = 0
    for batch in file.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns):
        cells = batch.to_pydict()
        queries = cells.get("query") or [None] * batch.num_rows
        for method, route, body, query in zip(cells["method"], cells["path"], cells["body"], queries, strict=True):
            number += 1
            where = f" row {number}"
            request: dict[str, Any] = {
                "method": method,
                "path": route,
                "body": None if body is None else _body(body),
            }
            if query is not None:
                request["query"] = _load_json(path, _text(query), where)
            yield _check_request(request, path, f"row {number}")


def _parquet_columns(path: Path, data: bytes) -> pq.ParquetFile:
    """The Parquet request file, once its columns are known to be those of requests."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as error:
        msg = f"{path}: not a readable Parquet file ({error})"
        raise RequestFileError(msg) from error
    missing = [name for name in PARQUET_COLUMNS[:3] if name not in file.schema_arrow.names]
    if missing:
        msg = (
            f"{path}: missing column(s) {', '.join(missing)}; a Parquet request file has the "
            "columns method, path, body (JSON text) and optionally query (JSON text)"
        )
        raise RequestFileError(msg)
    return file


def _check_unchanged(path: Path, found: str, digest: str) -> None:
    if found != digest:
        msg = f"{path} changed while it was applied (its idempotency key no longer matches); apply it again"
        raise RequestFileError(msg)


def _body(text: str | bytes) -> Any:
    """A Parquet body cell: its JSON value, or the text itself when it is not JSON, so that the
    engine answers that request 400 like the API does instead of the whole file failing."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _text(value: Any) -> bytes:
    """JSON text from a Parquet string or binary cell."""
    return value if isinstance(value, bytes) else str(value).encode()


def _check_request(request: Any, path: Path, where: str) -> dict[str, Any]:
    """The request shape of `Workspace.apply`: string `method` and `path`, object `query`."""
    if not isinstance(request, dict):
        msg = f"{path} {where}: expected a request object {{method, path, body, query?}}"
        raise RequestFileError(msg)
    for name in ("method", "path"):
        if not isinstance(request.get(name), str):
            msg = f"{path} {where}: {name!r} must be a string, got {request.get(name)!r}"
            raise RequestFileError(msg)
    if request.get("query") is not None and not isinstance(request["query"], dict):
        msg = f"{path} {where}: 'query' must be an object of query parameters or null"
        raise RequestFileError(msg)
    extra = set(request) - {"method", "path", "body", "query"}
    if extra:
        msg = f"{path} {where}: unknown key(s) {', '.join(sorted(extra))}; allowed: method, path, body, query"
        raise RequestFileError(msg)
    return request
