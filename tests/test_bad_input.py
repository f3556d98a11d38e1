"""Bad input answers in the specification's error shape and never raises or costs the other
requests of a batch their place (issue 11)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.helpers import (
    EXPORT,
    TRACK,
    assert_strict_json,
    custom_attributes,
    event,
    exists,
    open_ws,
    post,
    purchase,
    state_snapshot,
    track_ok,
)

from engagelake import Response
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
