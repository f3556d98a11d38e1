"""Data files wherever the store is: a local folder, or object storage (`s3://bucket/prefix`).

The store's tables are Delta tables, which delta-rs reads and writes on either. The engine's
own readers (footers, point reads of row groups, the ledger's newest rows) open files through
here: a local path as a file, a URI through pyarrow's file system for its scheme. Credentials,
region and endpoint come from the environment, as delta-rs and Polars take them
(`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`; `docs/object-storage.md`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import threading

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs

_lock = threading.Lock()


# Every table on object storage takes a checkpoint every 10 versions, not delta-rs' 100: a
# process that loads a table's log (a fresh worker's first read or write) gets each entry since
# the last checkpoint with a request of its own, so up to 100 of them per table before
LOG_PROPERTIES = {"delta.checkpointInterval": "10"}


def is_remote(path: str) -> bool:
    """Whether `path` is a URI (object storage) rather than a local path."""
    return "://" in path and not path.startswith("file://")


def open_input(path: str) -> pa.NativeFile:
    """`path` open for random reads (`read_at`, `size`): a local file or an object."""
    if not is_remote(path):
        return pa.OSFile(path.removeprefix("file://"))
    filesystem, key = _resolve(path)
    return filesystem.open_input_file(key)


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


def read_whole(path: str) -> bytes | None:
    """The content of the file or object at `path` (None: there is none)."""
    try:
        with open_input(path) as source:
            return bytes(source.read())
    except FileNotFoundError:
        return None


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
    return _filesystem(scheme, bucket), f"{bucket}/{key}"


@functools.cache
def _filesystem(scheme: str, bucket: str) -> pafs.FileSystem:
    """One file system per bucket (resolving one asks the bucket's region)."""
    with _lock:
        filesystem, _ = pafs.FileSystem.from_uri(f"{scheme}://{bucket}/")
    return filesystem


def dataset(paths: list[str], schema: pa.Schema) -> pads.Dataset:
    """Objects (Parquet files) as one pyarrow dataset of `schema` (a column a file lacks reads
    as null), for DuckDB to scan where it cannot read object storage itself: its `httpfs`
    extension is downloaded on first use, which a worker without internet cannot."""
    filesystem, _ = _resolve(paths[0])
    return pads.dataset([_resolve(path)[1] for path in paths], schema=schema, format="parquet",
                        filesystem=filesystem)
