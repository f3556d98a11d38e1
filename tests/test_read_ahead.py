"""Rows read ahead (`store/ahead.py`): a big batch reads its users' stored rows once, and the
passes answer and end exactly as when each reads its own."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers import open_ws
from tests.test_apply_equals_call import final_state, post_export, post_track

import engagelake.batch as batch_module
from engagelake.rules.profile.parse import named_external_ids
from engagelake.store import ahead, snapshot

MERGE = "/users/merge"


def test_named_external_ids_finds_each_object_s_id_as_written() -> None:
    texts = [
        '{"attributes":[{"external_id":"a","n":1},{"external_id" : "b"}],'
        '"events":[{"external_id":"c","name":"e","properties":{"external_id":"d"}}]}',
        '{"purchases":[{"external_id":"a","product_id":"p"}, {"external_id":"e\\"x"}]}',
        '{"attributes":[{"user_alias":{"alias_name":"external_id","alias_label":"l"}}]}',
        "not json at all",
    ]
    # a property that reads like one is found (it only costs a read); an escaped one is not
    assert sorted(named_external_ids(texts).to_list()) == ["a", "b", "c", "d"]
    assert named_external_ids([]).len() == 0


def _users(ws: Any, n: int) -> None:
    ws.apply([post_track(attributes=[{"external_id": f"u{i}", "n": i, "tags": ["t"]} for i in range(n)])])


def _sorted(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort(frame.columns)


@pytest.mark.parametrize("asked", [["u1", "u2"], ["u1", "nobody"], ["nobody", "u9"], []])
def test_a_probe_of_rows_read_ahead_answers_as_the_store(tmp_path: Path, asked: list[str]) -> None:
    ws = open_ws(tmp_path)
    _users(ws, 10)
    snapshot = ws.state.source
    assert snapshot is not None
    read = ahead.ReadAhead(snapshot)
    found = read.load("external_ids", "external_id", pl.Series(["u1", "u2", "u3", "nobody"]))
    read.load("attributes", "service_id", found["service_id"])
    ids = pl.Series("external_id", asked, pl.String)
    assert _sorted(read.probe("external_ids", "external_id", ids)).equals(
        _sorted(snapshot.probe("external_ids", "external_id", ids)))
    sids = snapshot.probe("external_ids", "external_id", pl.Series(["u1", "u9"]))["service_id"]
    assert _sorted(read.probe("attributes", "service_id", sids)).equals(
        _sorted(snapshot.probe("attributes", "service_id", sids)))
    assert read.rows("attributes") == snapshot.rows("attributes") == 20


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A snapshot of 12 users over two runs, the second removing an attribute and setting another;
    one user deleted."""
    ws = open_ws(tmp_path_factory.mktemp("ahead"))
    _users(ws, 12)
    got = ws.apply([post_track(attributes=[{"external_id": f"u{i}", "n": None, "m": i} for i in range(0, 12, 3)]),
                    {"method": "POST", "path": "/users/delete", "body": {"external_ids": ["u5"]}}])
    assert [r.status for r in got] == [201, 200]
    return ws.state.source


IDS = [f"u{i}" for i in range(14)]  # u12 and u13 were never stored


@settings(max_examples=60, deadline=None)
@given(loaded=st.sets(st.sampled_from(IDS)), asked=st.lists(st.sampled_from(IDS), unique=True))
def test_a_probe_answers_as_the_store_whatever_was_read_ahead(stored: Any, loaded: set[str], asked: list[str]) -> None:
    read = ahead.ReadAhead(stored)
    found = read.load("external_ids", "external_id", pl.Series(sorted(loaded), dtype=pl.String))
    read.load("attributes", "service_id", found["service_id"])
    ids = pl.Series("external_id", asked, pl.String)
    assert _sorted(read.probe("external_ids", "external_id", ids)).equals(
        _sorted(stored.probe("external_ids", "external_id", ids)))
    sids = stored.probe("external_ids", "external_id", ids)["service_id"]
    assert _sorted(read.probe("attributes", "service_id", sids)).equals(
        _sorted(stored.probe("attributes", "service_id", sids)))


def _counted_loads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(table, values) of each `ReadAhead.load` from now on."""
    loads: list[tuple[str, int]] = []
    load = ahead.ReadAhead.load

    def counted(self: ahead.ReadAhead, name: str, column: str, values: pl.Series) -> pl.DataFrame:
        loads.append((name, values.len()))
        return load(self, name, column, values)

    monkeypatch.setattr(ahead.ReadAhead, "load", counted)
    return loads


def _with_and_without(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: list[dict[str, Any]]) -> dict[bool, Any]:
    """`batch` applied to a store of 10 users reading ahead (True) and not (False): the
    responses and the final state of each."""
    results = {}
    for reads_ahead in (True, False):
        monkeypatch.setattr(batch_module, "READ_AHEAD_MIN_ROWS", 0 if reads_ahead else 10**12)
        ws = open_ws(tmp_path, f"ahead-{reads_ahead}")
        _users(ws, 10)
        results[reads_ahead] = ws.apply(copy.deepcopy(batch)), final_state(ws)
    return results


# passes of two requests; increments need the stored values; a merge and an export between
# passes end a window of requests read ahead, and a new one starts after them
BATCH = [
    post_track(attributes=[{"external_id": f"u{i}", "n": {"inc": 1}}]) for i in range(5)
] + [
    post_track(attributes=[{"external_id": "new1", "n": 5}], events=[{"external_id": "u6", "name": "e",
                                                                       "time": "2026-11-20T00:00:00Z"}]),
    {"method": "POST", "path": MERGE, "body": {"merge_updates": [
        {"identifier_to_merge": {"external_id": "u7"}, "identifier_to_keep": {"external_id": "u8"}}]}},
    post_track(attributes=[{"external_id": "u8", "n": {"inc": 10}, "tags": {"add": ["z"]}}]),
    post_track(attributes=[{"external_id": "u1", "n": {"inc": 100}}]),
    post_track(attributes=[{"external_id": "new1", "n": {"inc": 1}}]),
    post_export(external_ids=["u1", "u8", "new1"]),
    post_track(attributes=[{"external_id": "u9", "n": "text"}]),
    post_track(attributes=[{"external_id": "u9", "n": {"inc": 1}}]),  # not a number now: an error
    post_track(attributes=[{"external_id": "u2", "n": {"inc": 1}}]),
]


# an equivalence, each batch run twice (3 s): held in the slow run, staged in both
@pytest.mark.parametrize("stage", [pytest.param(False, marks=pytest.mark.slow), True], ids=["held", "staged"])
def test_a_batch_that_reads_ahead_answers_and_ends_as_one_that_does_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage: bool) -> None:
    monkeypatch.setattr(batch_module, "TRACK_RUN_MAX", 2)
    if stage:
        monkeypatch.setattr(batch_module, "STAGE_ROWS", 1)
    loads = _counted_loads(monkeypatch)
    results = _with_and_without(tmp_path, monkeypatch, BATCH)
    # three windows: the first five passes' requests, after the merge, after the export
    assert [name for name, _ in loads] == ["external_ids", "attributes"] * 3
    assert results[True] == results[False]
    responses = results[True][0]
    assert [r.status for r in responses] == [201] * 6 + [202] + [201] * 3 + [200] + [201] * 3
    assert responses[-2].body["errors"][0]["input_array"] == "attributes"


def test_passes_read_ahead_read_the_attributes_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_module, "TRACK_RUN_MAX", 2)
    monkeypatch.setattr(batch_module, "READ_AHEAD_MIN_ROWS", 0)
    probes: list[int] = []
    probe = snapshot.Snapshot.probe

    def counted(self: snapshot.Snapshot, name: str, column: str, values: pl.Series, held: Any = None) -> pl.DataFrame:
        if name == "attributes":
            probes.append(values.len())
        return probe(self, name, column, values, held)

    monkeypatch.setattr(snapshot.Snapshot, "probe", counted)
    ws = open_ws(tmp_path)
    _users(ws, 10)
    probes.clear()
    got = ws.apply([post_track(attributes=[{"external_id": f"u{i}", "n": {"inc": 1}}]) for i in range(10)])
    assert [r.status for r in got] == [201] * 10
    assert probes == [10]  # one read for five passes
    assert ws.call("POST", "/users/export/ids", {"external_ids": ["u3"], "fields_to_export": ["custom_attributes"]}
                   ).body["users"][0]["custom_attributes"]["n"] == 4


def test_a_small_store_reads_no_rows_ahead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_module, "TRACK_RUN_MAX", 2)
    monkeypatch.setattr(ahead.ReadAhead, "load", lambda *_: pytest.fail("read ahead under READ_AHEAD_MIN_ROWS"))
    ws = open_ws(tmp_path)
    _users(ws, 10)
    assert [r.status for r in ws.apply([post_track(attributes=[{"external_id": "u1", "n": {"inc": 1}}])] * 6)
            ] == [201] * 6


def test_an_overtaken_batch_reads_ahead_again_from_its_spool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch given as a generator, overtaken by another writer's commit, runs again from the
    requests it spooled: its second attempt reads ahead again, over the newer store."""
    monkeypatch.setattr(batch_module, "TRACK_RUN_MAX", 2)
    monkeypatch.setattr(batch_module, "READ_AHEAD_MIN_ROWS", 0)
    ws, other = open_ws(tmp_path), open_ws(tmp_path)
    _users(ws, 10)
    commit, attempts = ws.store.commit, []

    def overtaken_once(*args: Any, **kwargs: Any) -> None:
        attempts.append(1)
        if len(attempts) == 1:
            other.call("POST", "/users/track", {"attributes": [{"external_id": "u1", "n": {"inc": 1000}}]})
        commit(*args, **kwargs)

    monkeypatch.setattr(ws.store, "commit", overtaken_once)
    batch = (post_track(attributes=[{"external_id": f"u{i % 3}", "n": {"inc": 1}}]) for i in range(9))
    assert [r.status for r in ws.apply(batch)] == [201] * 9
    assert len(attempts) == 2
    got = open_ws(tmp_path).call("POST", "/users/export/ids", {"external_ids": ["u0", "u1", "u2"],
                                                                "fields_to_export": ["external_id", "custom_attributes"]})
    assert {u["external_id"]: u["custom_attributes"]["n"] for u in got.body["users"]} == {"u0": 3, "u1": 1004, "u2": 5}


def test_a_failed_read_ahead_fails_its_batch_and_leaves_the_store_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows are read in a thread of their own: its error reaches the batch, whose passes
    wait for them, and nothing of the batch is stored."""
    monkeypatch.setattr(batch_module, "TRACK_RUN_MAX", 2)
    monkeypatch.setattr(batch_module, "READ_AHEAD_MIN_ROWS", 0)
    ws = open_ws(tmp_path)
    _users(ws, 10)
    load = ahead.ReadAhead.load

    def failing(self: ahead.ReadAhead, name: str, column: str, values: pl.Series) -> pl.DataFrame:
        if name == "attributes":
            raise OSError("the disk went away")
        return load(self, name, column, values)

    batch = [post_track(attributes=[{"external_id": f"u{i}", "n": {"inc": 1}}]) for i in range(6)]
    with monkeypatch.context() as broken:
        broken.setattr(ahead.ReadAhead, "load", failing)
        with pytest.raises(Exception, match="the disk went away"):
            ws.apply(copy.deepcopy(batch))
    export = {"external_ids": ["u1"], "fields_to_export": ["custom_attributes"]}
    assert ws.call("POST", "/users/export/ids", export).body["users"][0]["custom_attributes"]["n"] == 1
    assert [r.status for r in ws.apply(batch)] == [201] * 6
    assert ws.call("POST", "/users/export/ids", export).body["users"][0]["custom_attributes"]["n"] == 2


def test_a_window_names_about_as_many_users_as_hold_read_ahead_max_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows read ahead are held until their window's passes are done: a window ends once its
    users hold about `READ_AHEAD_MAX_ROWS` attribute rows (here 2 users of 2 rows each, the
    text searched a request at a time), and the batch answers and ends as before."""
    monkeypatch.setattr(batch_module, "TRACK_RUN_MAX", 2)
    monkeypatch.setattr(batch_module, "READ_AHEAD_CHUNK_BYTES", 1)
    monkeypatch.setattr(batch_module, "READ_AHEAD_MAX_ROWS", 4)
    loads = _counted_loads(monkeypatch)
    batch = [post_track(attributes=[{"external_id": f"u{i}", "n": {"inc": 1}}]) for i in range(10)]
    results = _with_and_without(tmp_path, monkeypatch, batch)
    assert results[True] == results[False]
    ids = [n for name, n in loads if name == "external_ids"]
    assert len(ids) >= 3 and max(ids) <= 3  # the full pass's 2 users and 1 more a window
