"""Bad input answers in the specification's error shape and never raises or costs the other
requests of a batch their place (issue 11)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import orjson
import pytest
from tests.helpers import (
    EXPORT,
    TRACK,
    assert_strict_json,
    custom_attributes,
    event,
    exists,
    export,
    open_ws,
    post,
    purchase,
    state_snapshot,
    track_ok,
)

from engagelake import Response
from engagelake.errors import ConfigError
from engagelake.rules import messages as M
from engagelake.rules.messages import BAD_JSON, BAD_QUERY, NON_FINITE_NUMBER, NOT_FOUND


@pytest.mark.parametrize("query", [[1], "a=1", 5, {1: "x"}, True])
def test_a_query_that_is_not_an_object_is_400(ws, query: Any) -> None:
    r = ws.call("GET", "/catalogs", query=query)
    assert r == Response(400, {"message": BAD_QUERY.format(kind=type(query).__name__)})
    r = ws.apply([{"method": "POST", "path": TRACK, "body": {}, "query": query}])[0]
    assert r.status == 400


@pytest.mark.parametrize("path", ["//[", "/[", "//]", "http://[::1", "//users/[/track"])
def test_a_path_a_url_parser_refuses_is_404(ws, path: str) -> None:
    r = ws.call("GET", path)
    assert r.status == 404
    assert r.body is not None and set(r.body) == {"message"}


def test_a_path_is_never_read_as_a_host(ws) -> None:
    track_ok(ws, attributes=[{"external_id": "u1"}])
    r = ws.call("POST", "//users/export/ids", {"external_ids": ["u1"], "fields_to_export": ["external_id"]})
    assert r.status == 200 and r.body["users"] == [{"external_id": "u1"}]


def test_a_lone_surrogate_in_the_path_is_escaped_in_the_404(ws) -> None:
    r = ws.call("GET", "/users/\ud800")
    assert r == Response(404, {"message": NOT_FOUND.format(method="GET", path="/users/\\ud800")})
    assert_strict_json(r)


def test_a_bad_request_keeps_the_others_of_its_batch(tmp_path) -> None:
    ws = open_ws(tmp_path)
    responses = ws.apply([
        post(TRACK, {"attributes": [{"external_id": "u1"}]}),
        {"method": "GET", "path": "/users/\ud800"},
        {"method": "POST", "path": "/users/\udfff", "body": {"x": "\ud800"}},
        post(TRACK, {"attributes": [{"external_id": "u2"}]}),
    ])
    assert [r.status for r in responses] == [201, 404, 404, 201]
    for r in responses:
        assert_strict_json(r)
    assert exists(ws, "u1") and exists(ws, "u2")
    # the ledger stored what the batch answered: the store opens again and reads
    again = open_ws(tmp_path)
    assert exists(again, "u1") and exists(again, "u2")


def test_a_lone_surrogate_in_a_body_answers_with_the_batch(tmp_path) -> None:
    ws = open_ws(tmp_path)
    responses = ws.apply([
        post(TRACK, {"attributes": [{"external_id": "u1"}]}),
        post(TRACK, {"attributes": [{"external_id": "\ud800"}]}),
        post(EXPORT, {"external_ids": ["\udc00"], "fields_to_export": ["external_id"]}),
        post(TRACK, {"attributes": [{"external_id": "u2"}]}),
    ])
    assert [r.status for r in responses][0] == 201 and responses[-1].status == 201
    for r in responses:
        assert_strict_json(r)
    assert exists(ws, "u1") and exists(ws, "u2")


# --- numbers JSON cannot carry (items 3 and 4) ----------------------------------------------------
CATALOG = {"catalogs": [{"name": "c", "description": "d", "fields": [
    {"name": "id", "type": "string"}, {"name": "n", "type": "number"}, {"name": "s", "type": "string"},
    {"name": "a", "type": "array"}]}]}
COERCE = "unable-to-coerce-value"


@pytest.mark.parametrize(("field", "value"), [
    ("n", "123456789012345678901234567890"), ("n", "-9223372036854775809"), ("n", "1e999"), ("n", "-1e999"),
    ("n", float("inf")), ("n", float("nan")), ("s", float("-inf")), ("a", [1, [float("nan")]]),
])
def test_a_catalog_value_beyond_64_bits_cannot_be_coerced(ws, field: str, value: Any) -> None:
    assert ws.call("POST", "/catalogs", CATALOG).status == 201
    r = ws.call("PUT", "/catalogs/c/items", {"items": [{"id": "x", field: value}]})
    assert r.status == 400, r
    assert [(e["id"], e["parameters"], e["parameter_values"]) for e in r.body["errors"]] == [(COERCE, [field], ["x"])]
    assert ws.call("PUT", "/catalogs/c/items", {"items": [{"id": "x", "n": "9223372036854775807"}]}).status == 202


def test_a_catalog_number_beyond_a_double_in_json_text_cannot_be_coerced(ws) -> None:
    assert ws.call("POST", "/catalogs", CATALOG).status == 201
    r = ws.call("PUT", "/catalogs/c/items", '{"items": [{"id": "x", "n": 1e999}]}')
    assert r.status == 400 and r.body["errors"][0]["id"] == COERCE


TRACKED = [
    ({"attributes": [{"external_id": "u", "score": float("inf")}]}, "attributes[0].score"),
    ('{"attributes": [{"external_id": "u", "nested": {"a": [1, -1e999]}}]}', "attributes[0].nested.a[1]"),
    ({"attributes": [{"external_id": "u", "score": {"inc": float("nan")}}]}, "attributes[0].score.inc"),
    ('{"events": [{"external_id": "u", "name": "e", "time": "2026-01-01T00:00:00Z", "properties": {"p": 1e999}}]}',
     "events[0].properties.p"),
    ({"purchases": [{"external_id": "u", "product_id": "p", "currency": "USD", "price": float("inf"),
                     "time": "2026-01-01T00:00:00Z"}]}, "purchases[0].price"),
    ('{"purchases": [{"external_id": "u", "product_id": "p", "currency": "USD", "price": 1, "quantity": 1e999, '
     '"time": "2026-01-01T00:00:00Z", "properties": {}}]}', "purchases[0].quantity"),
]


@pytest.mark.parametrize(("body", "where"), TRACKED)
def test_a_track_number_beyond_a_double_is_refused_not_stored_as_null(ws, body: Any, where: str) -> None:
    track_ok(ws, attributes=[{"external_id": "u", "score": 5, "nested": 1}])
    message = NON_FINITE_NUMBER.format(where=where)
    assert ws.call("POST", TRACK, body) == Response(400, {"message": message, "errors": [message]})
    assert custom_attributes(ws, "u") == {"score": 5, "nested": 1}  # null would have removed them


@pytest.mark.parametrize("body", ['{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}'])
def test_nan_and_infinity_literals_are_not_json(ws, body: str) -> None:
    assert ws.call("POST", TRACK, body) == Response(400, {"message": BAD_JSON})


def test_other_endpoints_refuse_a_number_beyond_a_double(ws) -> None:
    body = {"merge_updates": [{"identifier_to_merge": {"external_id": float("inf")},
                               "identifier_to_keep": {"external_id": "k"}}]}
    message = NON_FINITE_NUMBER.format(where="merge_updates[0].identifier_to_merge.external_id")
    assert ws.call("POST", "/users/merge", body) == Response(400, {"message": message})


# --- a refused request leaves no trace (item 6) -------------------------------------------------------
FIRST = post(TRACK, {"attributes": [{"external_id": "u1", "a": 1}], "events": [event(external_id="u1")]})
SECOND = post(TRACK, {"attributes": [{"external_id": "u2", "b": 2}, {"external_id": "u1", "a": 3}],
                      "purchases": [purchase(external_id="u2")]})
REFUSED = [
    post(TRACK, {"attributes": [{"external_id": "r1", "c": 1}, {"external_id": "guest"}]}),  # blocked ID
    post(TRACK, {"attributes": [{"external_id": "r2"}] * 76}),  # too many objects
    post(TRACK, {"events": [event(external_id="r3")], "purchases": {"x": 1}}),  # not an array
    post(TRACK, {"attributes": [{"external_id": "r4"}, 5]}),  # an element not an object
    post("/users/merge", {"merge_updates": "x"}),
    post("/users/identify", {"aliases_to_identify": [{"external_id": "u1"}] * 60}),
    post("/users/delete", {"external_ids": ["u1"] * 51}),
]


def stored_state(ws) -> dict[str, Any]:
    return {**state_snapshot(ws), "next_update_seq": ws.store.head.next_update_seq,
            "next_profile_n": ws.store.head.next_profile_n}


@pytest.fixture(scope="module")
def want(tmp_path_factory) -> dict[str, Any]:
    """The stored state of FIRST and SECOND without the refused request between them (the same
    for every case: built once)."""
    expected = open_ws(tmp_path_factory.mktemp("expected"))
    expected.apply([FIRST, SECOND])
    return stored_state(expected)


@pytest.mark.parametrize("refused", REFUSED)
def test_a_refused_track_request_leaves_no_trace(tmp_path, refused: dict[str, Any], want: dict[str, Any]) -> None:
    calls = open_ws(tmp_path, "calls")
    statuses = [calls.call(r["method"], r["path"], r["body"]).status for r in (FIRST, refused, SECOND)]
    batch = open_ws(tmp_path, "batch")
    assert [r.status for r in batch.apply([FIRST, refused, SECOND])] == statuses == [201, 400, 201]
    assert stored_state(calls) == want
    assert stored_state(batch) == want


# --- issue 56: what cannot be parsed answers its own 400, never fails the batch ---------------------
def _nested(n: int) -> str:
    return "[" * n + "]" * n


def test_deep_nesting_after_a_number_beyond_a_double_is_a_400_not_a_recursion_error(tmp_path) -> None:
    """`1e999` sends the text to `json.loads`, which recursed into the nesting (RecursionError):
    the request answers 400, and its neighbours in the batch are applied."""
    ws = open_ws(tmp_path)
    deep = '{"attributes": [{"external_id": "u", "n": 1e999, "deep": ' + _nested(5000) + "}]}"
    message = M.BODY_TOO_DEEP.format(most=M.MAX_BODY_DEPTH)
    assert ws.call("POST", TRACK, deep) == Response(400, {"message": message, "errors": [message]})
    assert ws.call("POST", "/catalogs", '{"catalogs": [1e999, ' + _nested(5000) + "]}") == Response(
        400, {"message": message})
    responses = ws.apply([post(TRACK, {"attributes": [{"external_id": "u1"}]}), post(TRACK, deep),
                          post(TRACK, {"attributes": [{"external_id": "u2"}]})])
    assert [r.status for r in responses] == [201, 400, 201]
    assert exists(ws, "u1") and exists(ws, "u2")


@pytest.mark.parametrize("depth", [255, 1000, 1025, 100_000])
def test_a_body_nested_too_deep_says_so(ws, depth: int) -> None:
    message = M.BODY_TOO_DEEP.format(most=M.MAX_BODY_DEPTH)
    text = '{"attributes": [{"external_id": "u", "deep": ' + _nested(depth) + "}]}"
    assert ws.call("POST", TRACK, text) == Response(400, {"message": message, "errors": [message]})
    value: Any = 1
    for _ in range(depth):
        value = [value]
    assert ws.call("POST", TRACK, {"attributes": [{"external_id": "u", "deep": value}]}).body["message"] == message
    assert ws.call("POST", "/catalogs", {"catalogs": value}) == Response(400, {"message": message})


def test_an_unroutable_deep_request_in_a_keyed_batch_is_answered(tmp_path) -> None:
    """The digest of a keyed batch writes a request that routes nowhere as its repr, which
    recursed on a deep one."""
    ws = open_ws(tmp_path)
    value: Any = 1
    for _ in range(5000):
        value = [value]
    responses = ws.apply([post(TRACK, {"attributes": [{"external_id": "u1"}]}),
                          {"method": "POST", "path": 5, "body": value}], idempotency_key="deep-1")
    assert [r.status for r in responses] == [201, 400]
    assert exists(ws, "u1")


# --- issue 56: Python values in bodies and queries ------------------------------------------------
PYTHON_VALUES = {"attributes": [{"external_id": "u", "seen": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
                                 "born": date(2000, 1, 2), "score": Decimal("12.50"), "count": Decimal("7"),
                                 "gone": None}],
                 "purchases": [{"external_id": "u", "product_id": "p", "currency": "USD", "price": Decimal("9.99"),
                                "time": datetime(2026, 11, 20, 10, 0, tzinfo=UTC), "properties": {"k": None}}]}
# the same body as an HTTP client would send it
AS_TEXT = ('{"attributes": [{"external_id": "u", "seen": "2026-01-02T03:04:05+00:00", "born": "2000-01-02", '
           '"score": 12.50, "count": 7, "gone": null}], "purchases": [{"external_id": "u", "product_id": "p", '
           '"currency": "USD", "price": 9.99, "time": "2026-11-20T10:00:00+00:00", "properties": {"k": null}}]}')


def test_datetimes_dates_and_decimals_are_sent_as_the_rest_api_receives_them(tmp_path) -> None:
    python, text = open_ws(tmp_path, "python"), open_ws(tmp_path, "text")
    assert python.call("POST", TRACK, PYTHON_VALUES) == text.call("POST", TRACK, AS_TEXT) == Response(
        201, {"message": "success", "attributes_processed": 1, "purchases_processed": 1})
    fields = ["custom_attributes", "purchases", "total_revenue"]
    assert export(python, fields, external_ids=["u"]) == export(text, fields, external_ids=["u"])
    assert custom_attributes(python, "u") == {"seen": "2026-01-02T03:04:05+00:00", "born": "2000-01-02",
                                              "score": 12.5, "count": 7}


def test_python_values_in_a_handler_body_are_sent_as_json(ws) -> None:
    fields = [{"name": "id", "type": "string"}, {"name": "n", "type": "number"}, {"name": "t", "type": "time"},
              {"name": "a", "type": "array"}]
    assert ws.call("POST", "/catalogs", {"catalogs": [{"name": "c", "description": "d", "fields": fields}]}).status == 201
    item = {"id": "x", "n": Decimal("12.5"), "t": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "a": (1, date(2000, 1, 2))}
    assert ws.call("PUT", "/catalogs/c/items", {"items": [item]}) == Response(202, {"message": "success"})
    [stored] = ws.catalogs.items("c").to_dicts()
    assert (stored["n"], stored["t"], orjson.loads(stored["a"])) == (
        12.5, datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), [1, "2000-01-02"])
    # a decimal that is not a finite number is one, for the handler that checks numbers itself
    r = ws.call("PUT", "/catalogs/c/items", {"items": [{"id": "y", "n": Decimal("Infinity")}]})
    assert r.status == 400 and r.body["errors"][0]["id"] == COERCE
    message = NON_FINITE_NUMBER.format(where="attributes[0].n")
    assert ws.call("POST", TRACK, {"attributes": [{"external_id": "u", "n": Decimal("NaN")}]}) == Response(
        400, {"message": message, "errors": [message]})


@pytest.mark.parametrize(("value", "kind"), [(range(3), "range"), ({1, 2}, "set"), (b"x", "bytes"),
                                              (frozenset(), "frozenset"), (object(), "object")])
def test_a_value_json_cannot_hold_is_a_400_naming_its_place(ws, value: Any, kind: str) -> None:
    message = M.VALUE_NOT_JSON.format(where="attributes[1].v[2]", kind=kind)
    body = {"attributes": [{"external_id": "u"}, {"external_id": "u", "v": [1, None, value]}]}
    assert ws.call("POST", TRACK, body) == Response(400, {"message": message, "errors": [message]})
    message = M.VALUE_NOT_JSON.format(where="items[0].n", kind=kind)
    assert ws.call("PUT", "/catalogs/c/items", {"items": [{"id": "x", "n": value}]}) == Response(400, {"message": message})
    message = M.VALUE_NOT_JSON.format(where="query.filter", kind=kind)
    assert ws.call("GET", "/scim/v2/Users", query={"filter": value}) == Response(400, {"message": message})
    if kind != "bytes":  # a body of bytes is JSON text
        message = M.VALUE_NOT_JSON.format(where="body", kind=kind)
        assert ws.call("POST", EXPORT, value) == Response(400, {"message": message})


def test_keys_and_integers_json_cannot_hold_name_their_place(ws) -> None:
    r = ws.call("POST", TRACK, {"attributes": [{"external_id": "u", "o": {1: "x"}}]})
    assert r.status == 400 and r.body["message"] == M.KEY_NOT_TEXT.format(where="attributes[0].o", key="1", kind="int")
    r = ws.call("POST", "/users/merge", {"merge_updates": [{"n": 2**70}]})
    assert r == Response(400, {"message": M.INTEGER_BEYOND_64_BITS.format(where="merge_updates[0].n")})


# --- issue 56: a lone surrogate in one request never aborts its batch -------------------------------
def test_a_lone_surrogate_in_one_request_is_its_400_naming_the_place(tmp_path) -> None:
    ws = open_ws(tmp_path)
    responses = ws.apply([
        post(TRACK, {"attributes": [{"external_id": "u1"}]}),
        post(TRACK, {"attributes": [{"external_id": "u", "name": "a\ud800b"}]}),
        post("/catalogs", {"catalogs": [{"name": "c", "description": "d", "fields": [{"name": "id\udfff"}]}]}),
        post(TRACK, {"attributes": [{"external_id": "u", "k\udc00": 1}]}),
        {"method": "GET", "path": "/scim/v2/Users", "query": {"filter": {"\ud800": ["\udfff"]}}},
        post(TRACK, {"attributes": [{"external_id": "u2"}]}),
    ])
    assert [r.status for r in responses] == [201, 400, 400, 400, 400, 201]
    message = M.LONE_SURROGATE.format(where="attributes[0].name")
    assert responses[1].body == {"message": message, "errors": [message]}
    assert responses[2].body == {"message": M.LONE_SURROGATE.format(where="catalogs[0].fields[0].name")}
    assert responses[3].body["message"] == M.LONE_SURROGATE.format(where="attributes[0].k\\udc00")
    for r in responses:
        assert_strict_json(r)
    again = open_ws(tmp_path)
    assert exists(again, "u1") and exists(again, "u2")


@pytest.mark.parametrize("key", ["", "   ", "k\ud800", 5])
def test_an_idempotency_key_that_is_empty_or_not_text_is_refused(tmp_path, key: Any) -> None:
    ws = open_ws(tmp_path)
    with pytest.raises(ConfigError, match="idempotency key"):
        ws.apply([post(TRACK, {"attributes": [{"external_id": "u1"}]})], idempotency_key=key)
    assert not exists(ws, "u1")
    with pytest.raises(ConfigError, match="idempotency key"):
        ws.batch_committed_at(key)


def test_a_request_file_whose_name_is_not_utf8_is_keyed_by_its_escape(tmp_path) -> None:
    """Its key was the name read as lone surrogates, which the ledger could not store."""
    import os

    from engagelake.files import read_request_file
    from engagelake.ingest import apply_requests

    ws = open_ws(tmp_path)
    path = tmp_path / os.fsdecode(b"night\xff.ndjson")
    path.write_bytes(orjson.dumps(post(TRACK, {"attributes": [{"external_id": "u1"}]})) + b"\n")
    batch = read_request_file(path)
    assert batch.idempotency_key.startswith("night\\udcff.ndjson:")
    assert [r.status for r in apply_requests(ws, batch)] == [201]  # type: ignore[union-attr]
    assert ws.batch_committed_at(batch.idempotency_key) is not None


def test_a_number_beyond_a_double_inside_a_tuple_is_refused(ws) -> None:
    """A tuple is an array: the walk that finds where a number was lost looked into lists only,
    so `(inf,)` was stored as null."""
    track_ok(ws, attributes=[{"external_id": "u", "t": [1]}])
    message = NON_FINITE_NUMBER.format(where="attributes[0].t[0]")
    assert ws.call("POST", TRACK, {"attributes": [{"external_id": "u", "t": (float("inf"),)}]}) == Response(
        400, {"message": message, "errors": [message]})
    assert custom_attributes(ws, "u") == {"t": [1]}


def test_a_planted_partial_link_is_not_written_through(tmp_path) -> None:
    """A request folder another user can write to holds `.<name>.partial` linked to a file of
    ours (issue 56): writing the responses must leave that file as it was."""
    from pathlib import Path

    from engagelake.files import write_bytes_atomically

    victim = Path(tmp_path) / "victim.txt"
    victim.write_bytes(b"kept")
    target = Path(tmp_path) / "batch.responses.ndjson"
    (Path(tmp_path) / f".{target.name}.partial").symlink_to(victim)
    write_bytes_atomically(target, b"answers\n")
    assert victim.read_bytes() == b"kept"
    assert target.read_bytes() == b"answers\n" and not target.is_symlink()
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == [f".{target.name}.partial", target.name, "victim.txt"]
