"""The in-memory layer under real crashes (SIGKILL): what a layered workspace answered survives.

A layered workspace (`store/layer.py`) answers a batch once its write-ahead log record is synced
(`store/wal.py`) and writes its batches to the tables later, as one commit. These tests kill the
process that holds the layer, `engagelake serve` under load or a child process at each crash
point of the flush, and check that the next open writes every answered batch exactly once,
leaving the store an uninterrupted run leaves; that a busy layer owner does not starve another
process's writer; and that a torn record at the end of a segment is ignored.

The children are this file's functions, run by `python -c` (`_run_child`) or by a process pool.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import polars as pl
import pytest
from deltalake import DeltaTable
from tests.helpers import (
    ALL_FIELDS,
    EXPORT,
    NOW,
    SEED,
    TRACK,
    built_store,
    copy_of,
    copy_store,
    open_ws,
    unpinned,
)

from engagelake import Workspace
from engagelake.store import wal
from engagelake.store.layout import CRASH_ENV, LEDGER

ROOT = Path(__file__).resolve().parents[1]
ENGAGELAKE = Path(sys.executable).with_name("engagelake")
KEY_PERMISSIONS = ["users.track", "users.export.ids"]

# crash and concurrency tests, processes of their own: the slow run's (docs/decisions.md, "What is
# slow"); the server kill takes 6-15 s, the busy owner 8-10 s, a flush crash 1.5-5 s, a torn tail
# 0.5 s. tests/test_layer.py keeps the default run's representatives (a dropped layer replayed, a
# torn record, a writer waiting for the flush), in one process.
pytestmark = pytest.mark.slow


def _track(**body: Any) -> dict[str, Any]:
    return {"method": "POST", "path": TRACK, "body": body}


def _base(ws: Workspace) -> None:
    """The store the crash tests start from: three users with counters, committed (no layer)."""
    ws.apply([_track(attributes=[{"external_id": f"u{n}", "first_name": f"F{n}", "visits": {"inc": 1}}
                                 for n in (1, 2, 3)])])


# The batches the layered child applies before its flush, each (idempotency key, requests): new
# users, counters, a deletion, a user the layer created and a later batch updates, events and a
# purchase, and a read (an export) that must see the layer's batches before it.
BATCHES: list[tuple[str | None, list[dict[str, Any]]]] = [
    ("k1", [_track(attributes=[{"external_id": "u1", "visits": {"inc": 1}},
                               {"external_id": "u4", "first_name": "Dee", "email": "dee@example.com"}])]),
    (None, [_track(attributes=[{"external_id": "u2", "visits": {"inc": 1}}],
                   events=[{"external_id": "u1", "name": "opened", "time": "2026-11-22T11:00:00Z"}])]),
    ("k2", [{"method": "POST", "path": "/users/delete", "body": {"external_ids": ["u3"]}}]),
    (None, [_track(attributes=[{"external_id": "u4", "visits": {"inc": 1}, "email": "dee@example.org"}])]),
    ("k3", [_track(attributes=[{"external_id": "u1", "visits": {"inc": 1}},
                               {"external_id": "u5", "first_name": "Eve"}],
                   purchases=[{"external_id": "u5", "product_id": "sku", "currency": "USD", "price": 9.5,
                               "time": "2026-11-22T11:30:00Z"}]),
            {"method": "POST", "path": EXPORT, "body": {"external_ids": ["u1", "u3", "u4", "u5"],
                                                       "fields_to_export": ["external_id", "custom_attributes"]}}]),
    (None, [_track(events=[{"external_id": "u4", "name": "played", "time": "2026-11-22T11:45:00Z"}])]),
]
KEYS = [key for key, _ in BATCHES if key is not None]
# the counters after every batch: base 1, then one `inc` per batch that names the user
VISITS = {"u1": 3, "u2": 2, "u4": 1}
FLUSH_POINTS = ["before_tables", "after_table:attributes", "before_ledger", "after_ledger", "layer:flushed"]
# the points after which the flush's ledger rows landed: the log is written already, and goes
WRITTEN_AT = {"after_ledger", "layer:flushed"}


def _apply_all(ws: Workspace, batches: list[tuple[str | None, list[dict[str, Any]]]]) -> list[Any]:
    return [[[r.status, r.body] for r in ws.apply(requests, idempotency_key=key)] for key, requests in batches]


def _child(argv: list[str]) -> int:
    """A child process: open the store at argv[0] with a layer, apply the first argv[2]
    batches of BATCHES, write their answers (and the keys' commit times as the layer answers
    them) to argv[1], then `flush` (argv[3] "flush": dies at $ENGAGELAKE_CRASH_AT) or SIGKILL
    itself before any flush ("kill"). Exit 0: no crash point fired."""
    store, out, count, then = argv[0], Path(argv[1]), int(argv[2]), argv[3]
    ws = Workspace.open(store, clock=lambda: NOW, seed=SEED, layer=True, flush_seconds=3600)
    answers = _apply_all(ws, BATCHES[:count])
    assert ws.layer is not None and len(ws.layer) == count, "a batch was written to the tables already"
    committed = {key: ws.batch_committed_at(key) for key, _ in BATCHES[:count] if key is not None}
    out.write_bytes(orjson.dumps({"answers": answers, "committed_at": committed}))
    if then == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    ws.flush()
    return 0


def _run_child(store: Path, out: Path, count: int, then: str, point: str | None = None) -> None:
    """Run `_child` in a process of its own; it must die by SIGKILL, after writing `out`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), str(ROOT),
                                                                    os.environ.get("PYTHONPATH")) if p)}
    env.pop(CRASH_ENV, None)
    if point is not None:
        env[CRASH_ENV] = point
    code = "import sys; from tests.test_layer_crash import _child; sys.exit(_child(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, str(store), str(out), str(count), then], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, (
        f"the child did not die by SIGKILL ({then}, {point}): rc={proc.returncode}\n{proc.stderr[-3000:]}")
    assert out.exists(), f"the child died before its batches were answered ({point})\n{proc.stderr[-3000:]}"


def _ledger(store: Path) -> pl.DataFrame:
    """The ledger's rows, read straight from its Delta table (opening the store would replay)."""
    frame = pl.from_arrow(DeltaTable(str(store / LEDGER)).to_pyarrow_table(columns=["batch_no", "batch_key", "kind"]))
    assert isinstance(frame, pl.DataFrame)
    return frame.sort("batch_no")


def _content_rows(store: Path) -> int:
    """The ledger's rows of batches (not of merges or compactions)."""
    return _ledger(store).filter(~pl.col("kind").is_in(["merge", "compaction"]).fill_null(False)).height


def _current(ws: Workspace) -> dict[str, list[str]]:
    """Every table's current rows, in any order."""
    return {name: sorted(map(repr, ws.table(name).collect().rows())) for name in ws.table_names()}


# --- 1: `engagelake serve` killed under load ----------------------------------------------------
CLIENTS = 4


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _serving(store: Path, log: Path, *options: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`engagelake serve` on `store` as a process, once its /healthz answers; killed at the end
    if it still runs."""
    port = _free_port()
    command = [str(ENGAGELAKE), "serve", "--store", str(store), "--port", str(port), "--rate-limits", "off",
               "--no-access-log", *options]
    env = {**os.environ}
    env.pop(CRASH_ENV, None)
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log.open("wb"), env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=10).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, log.read_text()
            time.sleep(0.1)
        yield server, base
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(60)


def test_kill_9_of_the_server_after_answers_before_the_flush_loses_nothing(tmp_path: Path) -> None:
    """Clients send track requests to `engagelake serve` (a layer that flushes only hourly);
    SIGKILL. Every acknowledged request is in the log, and the next open writes each logged
    batch once: every acknowledged user with its values, a shared counter equal to the requests
    stored."""
    ws = open_ws(tmp_path)
    store = Path(ws.store.uri)
    key = ws.credentials.create_key("ingest", KEY_PERMISSIONS)
    assert ws.call("POST", TRACK, {"attributes": [{"external_id": "shared", "count": 0}]}).status == 201
    rows_before = _content_rows(store)

    sent: list[tuple[int, int]] = []  # (client, i) of every request sent, answered or not
    acknowledged: list[tuple[int, int]] = []
    stop = threading.Event()
    errors: list[str] = []

    def run(base: str, c: int) -> None:
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        with httpx.Client(base_url=base, timeout=120) as client:
            for i in range(1_000_000):
                if stop.is_set():
                    return
                body = {"attributes": [{"external_id": f"c{c}-{i}", "client": c, "seq": i},
                                       {"external_id": f"client-{c}", "last": i},
                                       {"external_id": "shared", "count": {"inc": 1}}]}
                sent.append((c, i))
                try:
                    r = client.post("/users/track", content=orjson.dumps(body), headers=headers)
                except httpx.TransportError:  # the server is gone
                    return
                if r.status_code == 201:
                    acknowledged.append((c, i))
                else:
                    errors.append(f"{r.status_code}: {r.text}")
                    return

    log = tmp_path / "server.log"  # a file, not a pipe: a full pipe would stop the server
    with _serving(store, log, "--flush-seconds", "3600") as (server, base):
        threads = [threading.Thread(target=run, args=(base, c)) for c in range(CLIENTS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while len(acknowledged) < 40 and not errors:
            assert time.monotonic() < deadline and server.poll() is None, log.read_text()
            time.sleep(0.05)
        time.sleep(2.0)  # a couple of seconds of load
        server.kill()  # SIGKILL: no shutdown, no flush
        assert server.wait(60) == -signal.SIGKILL
        stop.set()
        for t in threads:
            t.join(120)
    assert not errors, errors
    assert len(acknowledged) >= 40

    # the answered batches are in the log, not in the tables
    assert wal.segments(store), "no write-ahead log segment after the kill"
    assert _content_rows(store) == rows_before, "the server flushed, the test proves nothing"

    reopened = Workspace.open(store)  # free lock, a dead writer's log: replayed at open
    assert reopened.store.replayed >= 1
    assert wal.segments(store) == []
    users: dict[str, dict[str, Any]] = {}
    ids = [f"c{c}-{i}" for c, i in sent] + [f"client-{c}" for c in range(CLIENTS)] + ["shared"]
    for start in range(0, len(ids), 50):
        found = reopened.call("POST", EXPORT, {"external_ids": ids[start:start + 50],
                                               "fields_to_export": ["external_id", "custom_attributes"]})
        assert found.status == 200, found
        users |= {u["external_id"]: u["custom_attributes"] for u in found.body["users"]}
    for c, i in acknowledged:
        assert users.get(f"c{c}-{i}") == {"client": c, "seq": i}, (c, i)
    stored = [(c, i) for c, i in sent if f"c{c}-{i}" in users]  # acknowledged, or logged as it died
    assert len(stored) - len(acknowledged) <= CLIENTS, "requests never sent to the log were stored"
    assert users["shared"] == {"count": len(stored)}, "a logged batch was written twice, or not at all"
    for c in range(CLIENTS):
        mine = [i for k, i in stored if k == c]
        if mine:
            assert users[f"client-{c}"] == {"last": max(mine)}
    assert Workspace.check(store).healthy
    check = subprocess.run([str(ENGAGELAKE), "check", "--store", str(store)], capture_output=True, text=True,
                           timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr


# --- 2: a crash at each point of the flush ------------------------------------------------------
@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The store BATCHES leave when applied without a layer (no crash), and their answers."""
    ws = copy_of(tmp_path_factory.mktemp("twin"), _base, clock=lambda: NOW)
    answers = _apply_all(ws, BATCHES)
    ws.close()
    return {"answers": answers, "export": ws.export_users(ALL_FIELDS), "tables": _current(ws),
            "rows": _content_rows(Path(ws.store.uri)),
            "counters": (ws.store.head.next_profile_n, ws.store.head.next_update_seq)}


@pytest.mark.parametrize("point", FLUSH_POINTS)
def test_a_crash_in_the_flush_leaves_the_store_an_uninterrupted_run_leaves(
        tmp_path: Path, twin: dict[str, Any], point: str) -> None:
    """A child answers BATCHES through its layer, then dies at `point` of the flush. The next
    open rolls back what the flush half wrote and replays the log, or (its ledger rows landed)
    removes the log: either way the store the twin's commits made, each batch written once."""
    store = built_store(tmp_path, _base)
    rows_before = _content_rows(store)
    out = tmp_path / "answers.json"
    _run_child(store, out, len(BATCHES), "flush", point)
    child = orjson.loads(out.read_bytes())
    assert child["answers"] == twin["answers"]  # the layer answers as commits do
    assert len(wal.segments(store)) == 1
    written = point in WRITTEN_AT
    assert _content_rows(store) == rows_before + (len(BATCHES) if written else 0)

    ws = Workspace.open(store, clock=lambda: NOW)
    assert ws.store.replayed == (0 if written else len(BATCHES))
    assert wal.segments(store) == []
    assert ws.export_users(ALL_FIELDS) == twin["export"]
    assert _current(ws) == twin["tables"]
    assert (ws.store.head.next_profile_n, ws.store.head.next_update_seq) == twin["counters"]
    # one ledger row a batch, each key once: nothing written twice
    assert _content_rows(store) == twin["rows"]
    assert sorted(k for k in _ledger(store)["batch_key"].to_list() if k is not None) == sorted(KEYS)
    for key in KEYS:  # committed as the layer answered it
        assert ws.batch_committed_at(key) == datetime.fromisoformat(child["committed_at"][key]), key
    visits = {u["external_id"]: u.get("custom_attributes", {}).get("visits")
              for u in ws.export_users(["external_id", "custom_attributes"])}
    assert visits == {**VISITS, "u5": None}
    assert Workspace.check(store).healthy

    # a keyed batch applied again is a replay: the stored answers, nothing written
    for n, (batch_key, requests) in enumerate(BATCHES):
        if batch_key is not None:
            again = ws.apply(requests, idempotency_key=batch_key)
            assert [[r.status, r.body] for r in again] == twin["answers"][n], batch_key
    assert _content_rows(store) == twin["rows"]
    assert ws.export_users(ALL_FIELDS) == twin["export"]


# --- 3: another process's writer and a busy layer owner ----------------------------------------
BUSY_S = 6.0  # how long the layer's owner goes on once the other writer is about to write


def _busy_owner(store: str, folder: str) -> dict[str, Any]:
    """Small batches in a loop through a layer that flushes every 0.2 s, until BUSY_S seconds
    after the other writer is ready (at most 120 s)."""
    ws = Workspace.open(store, seed=SEED, layer=True, flush_seconds=0.2)
    statuses: list[int] = []
    stop_at: float | None = None
    started = time.monotonic()
    while stop_at is None or time.monotonic() < stop_at:
        body = {"attributes": [{"external_id": f"a{len(statuses)}"}, {"external_id": "shared", "count": {"inc": 1}}]}
        statuses.append(ws.call("POST", TRACK, body).status)
        if len(statuses) == 1:
            (Path(folder) / "owner-started").touch()
        if stop_at is None and (Path(folder) / "other-ready").exists():
            stop_at = time.monotonic() + BUSY_S
        if time.monotonic() - started > 120:
            break
    ended = time.time()
    ws.close()
    return {"statuses": statuses, "ended": ended, "other_ready": stop_at is not None}


def _other_writer(store: str, folder: str) -> dict[str, Any]:
    """One batch, with no layer, waiting up to 30 s for the writer lock."""
    ws = Workspace.open(store, seed=SEED, retry_for=30)
    (Path(folder) / "other-ready").touch()
    started = time.time()
    status = ws.call("POST", TRACK, {"attributes": [{"external_id": "b"}, {"external_id": "shared",
                                                                           "count": {"inc": 1}}]}).status
    return {"status": status, "started": started, "ended": time.time()}


def test_a_busy_layer_owner_lets_another_processes_writer_through(tmp_path: Path) -> None:
    """The owner of a layer takes the writer lock again at its next batch after each flush; a
    writer of another process (no layer) must get its turn at a flush, not when the owner
    stops, and neither loses the other's updates of a shared counter."""
    ws = open_ws(tmp_path)
    store = ws.store.uri
    assert ws.call("POST", TRACK, {"attributes": [{"external_id": "shared", "count": 0}]}).status == 201
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=context, initializer=unpinned) as pool:
        owner = pool.submit(_busy_owner, store, str(tmp_path))
        deadline = time.monotonic() + 120
        while not (tmp_path / "owner-started").exists():
            assert time.monotonic() < deadline and not owner.done(), owner.result() if owner.done() else "no batch"
            time.sleep(0.02)
        other = pool.submit(_other_writer, store, str(tmp_path)).result(timeout=300)
        busy = owner.result(timeout=300)
    assert busy["other_ready"], "the other writer never got ready while the owner ran"
    assert other["status"] == 201
    assert set(busy["statuses"]) == {201}
    waited = other["ended"] - other["started"]
    assert other["ended"] < busy["ended"], f"the other writer waited {waited:.1f} s: until the owner stopped"

    users = {u["external_id"]: u.get("custom_attributes")
             for u in Workspace.open(store).export_users(["external_id", "custom_attributes"])}
    batches = len(busy["statuses"])
    assert {f"a{n}" for n in range(batches)} | {"b", "shared"} == set(users)
    assert users["shared"] == {"count": batches + 1}, "a batch of one writer was lost over the other's"
    assert wal.segments(Path(store)) == []
    assert Workspace.check(store).healthy


# --- 4: a torn record at the end of a segment ---------------------------------------------------
TORN = 3  # batches the child applies before it dies


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store whose layered writer answered the first TORN batches and died before a flush."""
    root = tmp_path_factory.mktemp("killed")
    store = built_store(root, _base)
    _run_child(store, root / "answers.json", TORN, "kill")
    return store


def _torn_tails(segment: Path) -> dict[str, bytes]:
    """Bytes a crash inside a record's write leaves after the last whole record."""
    records = wal.read(segment).records
    payload = records[-1].encode()
    frame = wal._FRAME.pack(len(payload), 0)
    return {
        "frame header cut": frame[:5],
        "payload cut": wal._FRAME.pack(len(payload), 12345) + payload[: len(payload) // 2],
        "bad checksum": frame + payload,  # whole, but its checksum is 0: never synced whole
        "zeros": bytes(4096),  # a file system that grew the file before its data landed
    }


@pytest.mark.parametrize("tail", ["frame header cut", "payload cut", "bad checksum", "zeros"])
def test_a_torn_record_at_the_end_of_a_segment_is_ignored(tmp_path: Path, killed: Path, tail: str) -> None:
    """The layered child answered TORN batches and died; a crash inside the write of the next
    record left a part of it: the next open writes the TORN batches, and nothing else."""
    store = copy_store(killed, tmp_path / "store")
    (segment,) = wal.segments(store)
    assert len(wal.read(segment).records) == TORN
    with segment.open("ab") as log:
        log.write(_torn_tails(segment)[tail])

    ws = Workspace.open(store, clock=lambda: NOW)
    assert ws.store.replayed == TORN
    assert wal.segments(store) == []
    plain = copy_of(tmp_path, _base, "plain", clock=lambda: NOW)
    answers = _apply_all(plain, BATCHES[:TORN])
    assert orjson.loads((killed.parent / "answers.json").read_bytes())["answers"] == answers
    assert ws.export_users(ALL_FIELDS) == plain.export_users(ALL_FIELDS)
    assert _current(ws) == _current(plain)
    assert _content_rows(store) == _content_rows(Path(plain.store.uri))
    assert Workspace.check(store).healthy
