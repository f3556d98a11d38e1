"""Data files wherever the store is: a local folder, or object storage (`s3://bucket/prefix`).

The store's tables are Delta tables, which delta-rs reads and writes on either. The engine's
own readers (footers, point reads of row groups, the ledger's newest rows) open files through
here: a local path as a file, a URI through pyarrow's file system for its scheme. Credentials,
region and endpoint come from the environment, as delta-rs and Polars take them
(`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`; `docs/object-storage.md`),
or from storage options given for the bucket (`configure`, as `Workspace.open(storage_options=...)`
does), which every reader and writer here then takes: delta-rs, Polars and pyarrow alike.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable, PostCommitHookProperties, write_deltalake

from engagelake.errors import ConfigError

_lock = threading.Lock()


# Every table on object storage takes a checkpoint every 10 versions, not delta-rs' 100: a
# process that loads a table's log (a fresh worker's first read or write) gets each entry since
# the last checkpoint with a request of its own, so up to 100 of them per table before
LOG_PROPERTIES = {"delta.checkpointInterval": "10"}


# The storage options engagelake takes, by their environment variables' names (delta-rs and
# Polars know them in lower case), and the argument of pyarrow's S3 file system for each.
STORAGE_OPTIONS: dict[str, str | None] = {
    "aws_access_key_id": "access_key", "aws_secret_access_key": "secret_key", "aws_session_token": "session_token",
    "aws_region": "region", "aws_endpoint_url": "endpoint_override", "aws_allow_http": None,
}
_configured: dict[str, dict[str, str]] = {}  # "scheme://bucket" → its storage options


def configure(uri: str, options: Mapping[str, str] | None) -> None:
    """Use `options` (see `STORAGE_OPTIONS`; case does not matter) for every object of the
    bucket of `uri` from now on, over the environment's settings; None: the environment's.
    Raises ConfigError for an option it does not know."""
    if not is_remote(uri):
        return
    root = _bucket_root(uri)
    if options is None:
        _configured.pop(root, None)
        return
    given = {key.lower(): str(value) for key, value in options.items()}
    if unknown := sorted(set(given) - set(STORAGE_OPTIONS)):
        raise ConfigError(f"unknown storage option {unknown[0]!r}; the options are "
                          f"{', '.join(k.upper() for k in STORAGE_OPTIONS)} (as the environment names them)")
    _configured[root] = given


def storage_options(uri: str) -> dict[str, str] | None:
    """The options given for the bucket of `uri` (None: none, the environment's apply)."""
    return _configured.get(_bucket_root(uri)) if is_remote(uri) else None


def _bucket_root(uri: str) -> str:
    scheme, rest = uri.split("://", 1)
    return f"{scheme}://{rest.partition('/')[0]}"


def delta_table(uri: str, version: int | None = None) -> DeltaTable:
    """The Delta table at `uri` (at `version`: None, the newest), with its bucket's options."""
    return DeltaTable(uri, version=version, storage_options=storage_options(uri))


def is_delta_table(uri: str) -> bool:
    return DeltaTable.is_deltatable(uri, storage_options=storage_options(uri))


# delta-rs' commit hooks, as every engagelake write takes them: a checkpoint every
# `delta.checkpointInterval` versions, but no expired log cleanup. The cleanup lists the whole
# `_delta_log` after every commit, so a commit's requests grew with the table's history (a page
# of 1,000 keys a request: 8 requests and 0.25 s against moto for an append to a table of 1,100
# versions, 6 and 0.09 s without); compaction cleans the logs up instead (`Compactor.vacuum`).
COMMIT_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)


def write_delta(target: str | DeltaTable, data: Any, **arguments: Any) -> None:
    """`write_deltalake` with the bucket's options (a loaded table carries its own) and
    `COMMIT_HOOKS`."""
    options = storage_options(target) if isinstance(target, str) else None
    arguments.setdefault("post_commithook_properties", COMMIT_HOOKS)
    write_deltalake(target, data, storage_options=options, **arguments)


def scan_parquet(paths: list[str], schema: dict[str, pl.DataType]) -> pl.LazyFrame:
    """Polars' reader of whole files of `schema`; a column older files lack reads as null."""
    return pl.scan_parquet(paths, schema=schema, missing_columns="insert", storage_options=storage_options(paths[0]))


def is_remote(path: str) -> bool:
    """Whether `path` is a URI (object storage) rather than a local path."""
    return "://" in path and not path.startswith("file://")


def open_input(path: str) -> pa.NativeFile:
    """`path` open for random reads (`read_at`, `size`): a local file or an object."""
    if not is_remote(path):
        return pa.OSFile(path.removeprefix("file://"))
    filesystem, key = _resolve(path)
    return filesystem.open_input_file(key)


def open_output(path: str) -> pa.NativeFile:
    """`path` open for writing from its start (`tell` counts the bytes written): a local file
    or an object (written when closed)."""
    if not is_remote(path):
        return pa.OSFile(path.removeprefix("file://"), "wb")
    filesystem, key = _resolve(path)
    return filesystem.open_output_stream(key)


def exists(path: str) -> bool:
    """Whether a file or object is at `path`."""
    if not is_remote(path):
        return os.path.exists(path.removeprefix("file://"))
    filesystem, key = _resolve(path)
    return bool(filesystem.get_file_info(key).type != pafs.FileType.NotFound)


def touch(path: str) -> None:
    """Write an empty file or object at `path` (a marker)."""
    if not is_remote(path):
        open(path.removeprefix("file://"), "wb").close()
        return
    filesystem, key = _resolve(path)
    with filesystem.open_output_stream(key):
        pass


def write_whole(path: str, data: bytes) -> None:
    """Write `data` at `path` so that readers see the old content or the new, whole: a local
    file through a temporary one renamed over it; an object as one put (atomic on S3)."""
    if not is_remote(path):
        local = path.removeprefix("file://")
        temporary = f"{os.path.dirname(local) or '.'}/.{os.path.basename(local)}.{os.getpid()}"
        with open(temporary, "wb") as out:
            out.write(data)
        os.replace(temporary, local)
        return
    filesystem, key = _resolve(path)
    with filesystem.open_output_stream(key) as out:
        out.write(data)


def put_new(path: str, data: bytes) -> bool:
    """Write the object `path` with `data` only if there is none there (S3's conditional put,
    through `obstore`, the object store library delta-rs commits with); False if there was
    one. One request. Object storage only: a folder's writers link a temporary file instead
    (`appends.commit`)."""
    import obstore
    from obstore.exceptions import AlreadyExistsError

    store, key = _resolve_store(path)
    try:
        obstore.put(store, key, data, mode="create")
    except AlreadyExistsError:
        return False
    return True


def names_after(folder: str, after: str | None) -> list[str]:
    """The names of the objects directly in `folder` (a URI) that sort after `after` (None:
    all), in name order: one listing request per 1,000, from `after` on. Object storage only."""
    import obstore

    store, key = _resolve_store(folder)
    prefix = key.rstrip("/") + "/"
    names: list[str] = []
    for chunk in obstore.list(store, prefix, offset=prefix + after if after is not None else None, chunk_size=1000):
        names.extend(meta["path"][len(prefix):] for meta in chunk)
    return sorted(name for name in names if "/" not in name)


LOG_ENTRY = re.compile(r"^(\d{20})\.json$")  # a Delta log entry's name (its version)


def entries_after(table: str, version: int | None) -> list[int]:
    """The versions of the log entries of the Delta table at `table` (a URI) after `version`
    (None: all), in order, from one listing (a page per 1,000). Object storage only."""
    names = names_after(join(table, "_delta_log"), None if version is None else f"{version:020d}.json")
    return sorted(int(m.group(1)) for name in names if (m := LOG_ENTRY.match(name)))


def _resolve_store(uri: str) -> tuple[Any, str]:
    """The `obstore` store of `uri`'s bucket and the key in it (as `_resolve` for pyarrow)."""
    scheme, rest = uri.split("://", 1)
    bucket, _, key = rest.partition("/")
    options = _configured.get(f"{scheme}://{bucket}")
    return _object_store(scheme, bucket, tuple(sorted(options.items())) if options else (), _environment()), key


@functools.cache
def _object_store(scheme: str, bucket: str, options: tuple[tuple[str, str], ...],
                  environment: tuple[str | None, ...]) -> Any:
    """One `obstore` store per bucket, options and environment (it reads the same variables
    and takes the same options as delta-rs)."""
    from obstore.store import from_url

    config: Any = {key: value for key, value in options if key != "aws_allow_http"}
    allow_http = dict(options).get("aws_allow_http", "").lower() in ("1", "true", "yes")
    return from_url(f"{scheme}://{bucket}", config=config or None,
                    client_options={"allow_http": True} if allow_http else None)


def read_whole(path: str) -> bytes | None:
    """The content of the file or object at `path` (None: there is none). One request for an
    object (opened as a file, pyarrow asks its size first)."""
    if not is_remote(path):
        try:
            with open_input(path) as source:
                return bytes(source.read())
        except FileNotFoundError:
            return None
    import obstore
    from obstore.exceptions import BaseError, NotFoundError

    store, key = _resolve_store(path)
    try:
        return bytes(obstore.get(store, key).bytes())
    except (FileNotFoundError, NotFoundError):
        return None
    except BaseError as error:  # the readers that report an unreadable object catch OSError
        raise OSError(f"{path}: {error}") from error


def files_under(root: str) -> dict[str, int]:
    """Every file under the folder (or prefix) `root`, by its path relative to `root` ('/'
    between parts), with its size; links to folders are not followed. One listing on object
    storage (paged), however many files."""
    if not is_remote(root):
        base = root.removeprefix("file://")
        found = {}
        for folder, _, names in os.walk(base):
            for name in names:
                path = os.path.join(folder, name)
                if os.path.isfile(path):
                    found[os.path.relpath(path, base).replace(os.sep, "/")] = os.path.getsize(path)
        return found
    filesystem, key = _resolve(root)
    infos = filesystem.get_file_info(pafs.FileSelector(key.rstrip("/"), recursive=True, allow_not_found=True))
    start = len(key.rstrip("/")) + 1
    return {info.path[start:]: info.size for info in infos if info.type == pafs.FileType.File}


def is_folder(path: str) -> bool:
    """Whether `path` is a folder (on object storage: a prefix some object is under)."""
    if not is_remote(path):
        return os.path.isdir(path.removeprefix("file://"))
    filesystem, key = _resolve(path)
    return bool(filesystem.get_file_info(key.rstrip("/")).type == pafs.FileType.Directory)


def move(source: str, target: str) -> None:
    """Move the file or object `source` to `target` (on object storage: a copy, then a delete),
    making the target's folder when it has none."""
    if not is_remote(source):
        local = target.removeprefix("file://")
        os.makedirs(os.path.dirname(local), exist_ok=True)
        shutil.move(source.removeprefix("file://"), local)
        return
    filesystem, key = _resolve(source)
    filesystem.move(key, _resolve(target)[1])


def join(folder: str, name: str) -> str:
    """`name` inside `folder`, a local path or a URI (a `Path` would make `s3://` `s3:/`)."""
    return f"{folder.rstrip('/')}/{name}"


def remove(path: str) -> None:
    """Delete the file or object at `path`, if there is one."""
    if not is_remote(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path.removeprefix("file://"))
        return
    filesystem, key = _resolve(path)
    with contextlib.suppress(FileNotFoundError):
        filesystem.delete_file(key)


def remove_tree(path: str) -> None:
    """Delete the folder at `path` and all below it (on object storage: every object under
    the prefix), if there is one."""
    if not is_remote(path):
        shutil.rmtree(path.removeprefix("file://"), ignore_errors=True)
        return
    filesystem, key = _resolve(path)
    with contextlib.suppress(FileNotFoundError):
        filesystem.delete_dir(key)


def _resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    scheme, rest = uri.split("://", 1)
    bucket, _, key = rest.partition("/")
    options = _configured.get(f"{scheme}://{bucket}")
    given = tuple(sorted(options.items())) if options else ()
    return _filesystem(scheme, bucket, given, _environment()), f"{bucket}/{key}"


def _environment() -> tuple[str | None, ...]:
    """The variables a file system takes from the environment when it is made: a change of
    them (another endpoint, other credentials) makes another."""
    return tuple(os.environ.get(f"AWS_{name}") for name in (
        "ENDPOINT_URL", "REGION", "DEFAULT_REGION", "ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "SESSION_TOKEN",
        "ALLOW_HTTP"))


@functools.cache
def _filesystem(scheme: str, bucket: str, options: tuple[tuple[str, str], ...],
                environment: tuple[str | None, ...]) -> pafs.FileSystem:
    """One file system per bucket, options and environment (resolving one asks the bucket's
    region)."""
    with _lock:
        # `allow_delayed_open`: a small object is written with one PUT when it is closed, not
        # three (a multipart upload begun at open, a part, its completion)
        if not options:
            delayed = "?allow_delayed_open=true" if scheme == "s3" else ""
            filesystem, _ = pafs.FileSystem.from_uri(f"{scheme}://{bucket}/{delayed}")
            return filesystem
        given = dict(options)
        arguments: dict[str, str] = {}
        for key, value in given.items():
            if (argument := STORAGE_OPTIONS[key]) is not None:
                arguments[argument] = value
        if given.get("aws_allow_http", "").lower() in ("1", "true", "yes"):
            arguments["scheme"] = "http"
        if "endpoint_override" in arguments:  # pyarrow takes the host, and the scheme apart
            endpoint = arguments["endpoint_override"]
            if "://" in endpoint:
                arguments["scheme"], arguments["endpoint_override"] = endpoint.split("://", 1)
        return pafs.S3FileSystem(**arguments, allow_delayed_open=True)


WHOLE_READ_BYTES = 64 << 20  # objects of a dataset read whole when they are this small together


def _conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with the columns of `schema`, in its order and types (a column it lacks: nulls)."""
    columns = [table.column(f.name) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
               for f in schema]
    return pa.table(columns, names=schema.names).cast(schema)


def dataset(paths: list[str], schema: pa.Schema, sizes: list[int] | None = None) -> pads.Dataset:
    """Objects (Parquet files) as one pyarrow dataset of `schema` (a column a file lacks reads
    as null), for DuckDB to scan where it cannot read object storage itself: its `httpfs`
    extension is downloaded on first use, which a worker without internet cannot. `sizes`:
    the objects' sizes, when known (a table's add actions name them): no request asks them."""
    filesystem, _ = _resolve(paths[0])
    if sizes is None:
        return pads.dataset([_resolve(path)[1] for path in paths], schema=schema, format="parquet",
                            filesystem=filesystem)
    if sum(sizes) <= WHOLE_READ_BYTES:  # one GET an object, where a reader makes two (footer, data)
        with ThreadPoolExecutor(min(len(paths), 8) or 1) as pool:
            tables = list(pool.map(lambda path: pq.read_table(pa.BufferReader(read_whole(path))), paths))
        return pads.InMemoryDataset([_conformed(table, schema) for table in tables], schema=schema)
    parquet = pads.ParquetFileFormat()
    fragments = [parquet.make_fragment(_resolve(path)[1], filesystem, file_size=size)
                 for path, size in zip(paths, sizes, strict=True)]
    return pads.FileSystemDataset(fragments, schema, parquet, filesystem)
