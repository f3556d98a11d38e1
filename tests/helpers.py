"""Shared helpers for the end-to-end rule tests: open a store, call the API, read exports.

Everything goes through `Workspace.call` / `Workspace.apply`; `ws.table(...).collect()` is used only where
the API has no view of the state (profile counts, subscription groups).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from engagelake import Response, Workspace
from engagelake.link_keys import LINK_KEYS_ENV, LinkKey, Ring
from engagelake.rules.messages import EXPORT_FIELDS

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
SEED = "t"
TRACK = "/users/track"
EXPORT = "/users/export/ids"
ALL_FIELDS = list(EXPORT_FIELDS)


# a link key known in advance, for tests that write the tokens they expect (`fixed_link_keys`)
TEST_LINK_KEY = LinkKey("test0001", hashlib.sha256(b"engagelake test link key").digest(), NOW)


def fixed_link_keys(folder: Path) -> Iterator[Path]:
    """Every store opened meanwhile signs links with TEST_LINK_KEY: a key file holding it is
    `$ENGAGELAKE_LINK_KEYS` (a generator, for a fixture of any scope)."""
    path = folder / "link-keys.json"
    path.write_bytes(Ring((TEST_LINK_KEY,)).to_json())
    path.chmod(0o600)
    before = os.environ.get(LINK_KEYS_ENV)
    os.environ[LINK_KEYS_ENV] = str(path)
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop(LINK_KEYS_ENV, None)
        else:
            os.environ[LINK_KEYS_ENV] = before


class Clock:
    """A clock the test can move: `Workspace.open(..., clock=clock)` reads `clock()`."""

    def __init__(self, now: datetime = NOW) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now = self.now + timedelta(**delta)
        return self.now


# Where this process keeps its template stores (the session fixture `store_templates` sets it to
# a folder of pytest's temporary directory; else one is made on first use): one new store per
# seed, created once and copied for each `open_ws`, which costs about a quarter of creating one.
TEMPLATES: Path | None = None


def unpinned() -> None:
    """Give this process every core the test run may use again: an xdist worker is pinned to
    one (`tests/conftest.py`) and the processes it starts inherit that. For tests whose
    processes must run side by side (a `ProcessPoolExecutor`'s `initializer`)."""
    cpus = os.environ.get("ENGAGELAKE_TEST_CPUS")
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})


def templates() -> Path:
    global TEMPLATES
    if TEMPLATES is None:  # a process a test started (pytest's own have the session fixture's)
        TEMPLATES = Path(tempfile.mkdtemp(prefix="engagelake-templates-"))
        atexit.register(shutil.rmtree, TEMPLATES, ignore_errors=True)  # a killed one leaves it
    return TEMPLATES


def template_store(seed: str = SEED) -> Path:
    """A new, empty store with `seed`, created once per process: copy it, never write to it."""
    path = templates() / f"new-{hashlib.sha256(seed.encode()).hexdigest()[:16]}"
    if not path.exists():
        building = path.with_name(f"{path.name}.building")
        shutil.rmtree(building, ignore_errors=True)
        Workspace.open(building, seed=seed)
        building.rename(path)
    return path


def copy_store(source: Path, target: Path, *, dirs_exist_ok: bool = False) -> Path:
    """A copy of the store (or any folder) at `source`, without the files' modes and times
    (nothing reads them: copying them took three system calls more a file)."""
    return Path(shutil.copytree(source, target, copy_function=shutil.copyfile, dirs_exist_ok=dirs_exist_ok))


def built_store(tmp_path: Path, build: Callable[[Workspace], Any], name: str = "store", *,
                seed: str = SEED) -> Path:
    """The store that `build(ws)` makes of a new one (fixed clock, `seed`), at `tmp_path / name`:
    a copy of a template that `build` filled once per process (its merges done), never rebuilt;
    `build` must depend on nothing but the store it is given."""
    key = hashlib.sha256(f"{build.__module__}.{build.__qualname__}:{seed}".encode()).hexdigest()[:16]
    template = templates() / f"built-{key}"
    if not template.exists():
        building = template.with_name(f"{template.name}.building")
        shutil.rmtree(building, ignore_errors=True)
        ws = open_ws(building.parent, building.name, seed=seed)
        build(ws)
        ws.store.wait_for_merges()
        building.rename(template)
    copy_store(template, tmp_path / name)
    return tmp_path / name


def copy_of(tmp_path: Path, build: Callable[[Workspace], Any], name: str = "store", *, clock: Any = None,
            seed: str = SEED) -> Workspace:
    """`built_store(...)` opened with the fixed clock (or the given one)."""
    return Workspace.open(built_store(tmp_path, build, name, seed=seed), clock=clock or (lambda: NOW), seed=seed)


def open_ws(tmp_path: Path, name: str = "store", *, clock: Any = None, seed: str = SEED,
            template: bool = True) -> Workspace:
    """A fresh store under `tmp_path` with the fixed clock (or the given one) and seed: a copy
    of the seed's template store, or with `template=False` created there (for a test that
    patches how stores are created). An existing store there is opened as it is."""
    path = tmp_path / name
    if template and (not path.exists() or (path.is_dir() and not any(path.iterdir()))):
        copy_store(template_store(seed), path, dirs_exist_ok=True)
    return Workspace.open(path, clock=clock or (lambda: NOW), seed=seed)


def service_id(n: int, seed: str = SEED) -> str:
    """The service_id of the n-th profile created in a store (n from 0)."""
    return hashlib.sha256(f"{seed}:{n}".encode()).hexdigest()[:24]


def random_bucket(sid: str) -> int:
    return int(sid[:8], 16) % 10000


def ts(moment: datetime) -> str:
    """A moment as the export formats it: ISO 8601 UTC with milliseconds."""
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def iso(moment: datetime) -> str:
    """A moment as an event or purchase `time` (ISO 8601 with `Z`)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def alias(name: str, label: str = "crm") -> dict[str, str]:
    return {"alias_name": name, "alias_label": label}


def event(name: str = "played", when: datetime = NOW, **fields: Any) -> dict[str, Any]:
    """An event object; pass the identifier as a keyword (external_id="u1", email=..., ...)."""
    return {"name": name, "time": iso(when), **fields}


def purchase(
    product_id: str = "sku", price: float = 10.0, when: datetime = NOW, **fields: Any
) -> dict[str, Any]:
    return {"product_id": product_id, "currency": "USD", "price": price, "time": iso(when), **fields}


def track(ws: Workspace, **arrays: Any) -> Response:
    """POST /users/track with the given arrays (attributes=[...], events=[...], purchases=[...])."""
    return ws.call("POST", TRACK, body=arrays)


def track_ok(ws: Workspace, **arrays: Any) -> dict[str, Any]:
    """Track and assert a 201 without non-fatal errors; returns the body."""
    r = track(ws, **arrays)
    assert r.status == 201, r
    assert r.body is not None and "errors" not in r.body, r.body
    return r.body


def assert_strict_json(r: Response) -> None:
    """The body survives strict JSON encoders: no NaN or Infinity (`allow_nan=False`), no
    datetimes or other Python-only values, no lone surrogates (UTF-8), no non-string keys or
    integers beyond 64 bits (orjson without options). HTML pages (`str`) are text."""
    assert isinstance(r.status, int), r
    if isinstance(r.body, str):
        r.body.encode("utf-8")
        return
    json.dumps(r.body, allow_nan=False, ensure_ascii=False).encode("utf-8")
    orjson.dumps(r.body)


def errors(r: Response) -> list[dict[str, Any]]:
    """The non-fatal errors of a track response (asserts the request itself succeeded)."""
    assert r.status == 201, r
    assert r.body is not None and r.body["message"] == "success", r.body
    return r.body.get("errors", [])


def err(type_: str, input_array: str, index: int) -> dict[str, Any]:
    return {"type": type_, "input_array": input_array, "index": index}


def only_error(r: Response, type_: str, input_array: str = "attributes", index: int = 0) -> None:
    """Assert the response carries exactly this one non-fatal error."""
    assert errors(r) == [err(type_, input_array, index)], r.body


def export(ws: Workspace, fields: list[str] | None = None, **identifiers: Any) -> Response:
    """POST /users/export/ids; `fields=None` leaves `fields_to_export` out."""
    body: dict[str, Any] = dict(identifiers)
    if fields is not None:
        body["fields_to_export"] = fields
    return ws.call("POST", EXPORT, body=body)


def export_users(ws: Workspace, fields: list[str], **identifiers: Any) -> list[dict[str, Any]]:
    r = export(ws, fields, **identifiers)
    assert r.status == 200, r
    assert r.body is not None
    return r.body["users"]


def export_one(ws: Workspace, external_id: str, fields: list[str]) -> dict[str, Any] | None:
    """The exported user with that external ID, or None when no user has it."""
    users = export_users(ws, fields, external_ids=[external_id])
    assert len(users) <= 1, users
    return users[0] if users else None


def export_alias(ws: Workspace, user_alias: dict[str, str], fields: list[str]) -> dict[str, Any] | None:
    users = export_users(ws, fields, user_aliases=[user_alias])
    assert len(users) <= 1, users
    return users[0] if users else None


def custom_attributes(ws: Workspace, external_id: str) -> dict[str, Any]:
    """The custom attributes of an existing user ({} when it has none)."""
    user = export_one(ws, external_id, ["external_id", "custom_attributes"])
    assert user is not None, f"no user {external_id!r}"
    return user.get("custom_attributes", {})


def field(ws: Workspace, external_id: str, name: str) -> Any:
    """One exported field of an existing user (None when absent)."""
    user = export_one(ws, external_id, ["external_id", name])
    assert user is not None, f"no user {external_id!r}"
    return user.get(name)


def exists(ws: Workspace, external_id: str) -> bool:
    return export_one(ws, external_id, ["external_id"]) is not None


def profile_count(ws: Workspace) -> int:
    return ws.table("profiles").collect().height


def group_states(ws: Workspace, group_id: str) -> dict[str, str]:
    """service_id -> state of one subscription group (the API has no read path for groups)."""
    df = ws.table("subscriptions").collect()
    rows = df.filter(df["group_id"] == group_id).select("service_id", "state").rows()
    return dict(rows)


# --- identity endpoint tests --------------------------------------------------------------------
USER_STATE_TABLES = (
    "profiles", "external_ids", "aliases", "attributes", "subscriptions", "push_tokens", "events", "purchases",
)


def post(path: str, body: Any) -> dict[str, Any]:
    """One request of a batch for `ws.apply`."""
    return {"method": "POST", "path": path, "body": body}


def base(n: int, external_id: str | None = None, **fields: Any) -> dict[str, Any]:
    """The exported user for the n-th profile created: its fixed fields plus `fields`."""
    sid = service_id(n)
    user = {"created_at": ts(NOW), "service_id": sid, "random_bucket": random_bucket(sid), **fields}
    if external_id is not None:
        user["external_id"] = external_id
    return user


def profile_row(ws: Workspace, n: int) -> dict[str, Any]:
    """The `profiles` row of the n-th profile created."""
    df = ws.table("profiles").collect()
    rows = df.filter(df["service_id"] == service_id(n)).to_dicts()
    assert len(rows) == 1, rows
    return rows[0]


def state_snapshot(ws: Workspace, tables: tuple[str, ...] = USER_STATE_TABLES) -> dict[str, Any]:
    """The full export and the rows of `tables`, order-insensitive: what a request could change."""
    out: dict[str, Any] = {"export": ws.export_users(ALL_FIELDS)}
    for name in tables:
        out[name] = sorted(map(repr, ws.table(name).collect().to_dicts()))
    return out


def apply_and_call(tmp_path: Path, requests: list[dict[str, Any]]) -> tuple[list[Response], Workspace]:
    """Apply `requests` as one batch on a fresh store and call them one by one on another; assert
    that the responses and the final exports are equal; return the responses and the batch's store."""
    batch_ws = open_ws(tmp_path, "batch")
    batch = batch_ws.apply(requests)
    calls_ws = open_ws(tmp_path, "calls")
    calls = [calls_ws.call(r["method"], r["path"], r["body"]) for r in requests]
    assert batch == calls
    assert batch_ws.export_users(ALL_FIELDS) == calls_ws.export_users(ALL_FIELDS)
    return batch, batch_ws
