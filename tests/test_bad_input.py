"""Bad input answers in the specification's error shape and never raises or costs the other
requests of a batch their place (issue 11)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.helpers import EXPORT, TRACK, assert_strict_json, exists, open_ws, post, track_ok

from engagelake import Response
from engagelake.rules.messages import BAD_QUERY, NOT_FOUND


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
