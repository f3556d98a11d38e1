"""Dispatch: unknown paths, wrong methods and unreadable bodies answer a status, never raise."""

from __future__ import annotations

import dataclasses

import pytest
from tests.helpers import EXPORT, TRACK, custom_attributes, exists, profile_count

from engagelake import Response
from engagelake.rules.messages import (
    BAD_JSON,
    EXPORT_BODY_NOT_OBJECT,
    FATAL_BODY_NOT_OBJECT,
    METHOD_NOT_ALLOWED,
    NOT_FOUND,
)


@pytest.mark.parametrize("path", ["/users/nope", "/nothing", "/users/track/extra", "/"])
def test_unknown_path_is_404(ws, path):
    r = ws.call("POST", path, body={"attributes": [{"external_id": "u1"}]})
    assert r == Response(404, {"message": NOT_FOUND.format(method="POST", path=path)})
    assert profile_count(ws) == 0


def test_unknown_path_with_get_is_404(ws):
    r = ws.call("GET", "/users/nope")
    assert r.status == 404
    assert r.body == {"message": NOT_FOUND.format(method="GET", path="/users/nope")}


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
@pytest.mark.parametrize("path", [TRACK, EXPORT])
def test_wrong_method_is_405(ws, method, path):
    r = ws.call(method, path, body={"attributes": [{"external_id": "u1", "a": 1}]})
    assert r.status == 405
    assert r.body == {
        "message": METHOD_NOT_ALLOWED.format(method=method, path=path, allowed="POST")
    }
    assert profile_count(ws) == 0


@pytest.mark.parametrize("body", ["{not json", "", "{'single': 'quotes'}", b"\xff\xfe", b"[1,"])
@pytest.mark.parametrize("path", [TRACK, EXPORT])
def test_body_that_is_not_json_is_400(ws, path, body):
    r = ws.call("POST", path, body=body)
    assert r == Response(400, {"message": BAD_JSON})


@pytest.mark.parametrize("body", [None, [], [{"external_id": "u1"}], 5, True, 2.5])
def test_track_body_not_an_object_is_fatal(ws, body):
    r = ws.call("POST", TRACK, body=body)
    assert r == Response(400, {"message": FATAL_BODY_NOT_OBJECT, "errors": [FATAL_BODY_NOT_OBJECT]})


@pytest.mark.parametrize("body", ["[1, 2]", '"text"', "42", "null", b"[]"])
def test_track_json_text_that_is_not_an_object_is_fatal(ws, body):
    r = ws.call("POST", TRACK, body=body)
    assert r == Response(400, {"message": FATAL_BODY_NOT_OBJECT, "errors": [FATAL_BODY_NOT_OBJECT]})


@pytest.mark.parametrize("body", [None, [], ["u1"], 5])
def test_export_body_not_an_object_is_400(ws, body):
    r = ws.call("POST", EXPORT, body=body)
    assert r == Response(400, {"message": EXPORT_BODY_NOT_OBJECT})


@pytest.mark.parametrize("as_bytes", [False, True])
def test_json_text_body_is_parsed(ws, as_bytes):
    text = '{"attributes": [{"external_id": "u1", "tier": "gold"}]}'
    r = ws.call("POST", TRACK, body=text.encode() if as_bytes else text)
    assert r == Response(201, {"message": "success", "attributes_processed": 1})
    assert custom_attributes(ws, "u1") == {"tier": "gold"}


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("", TRACK, {}),
        ("POST", "", {}),
        ("POST", "users/track", {}),
        ("post", "/users/nope", {}),
        ("POST", TRACK, {"attributes": [{"external_id": ["a"]}]}),
        ("POST", TRACK, {"attributes": [{"external_id": {"x": 1}, "a": 1}]}),
        ("POST", TRACK, {"attributes": [{"user_alias": []}]}),
        ("POST", TRACK, {"events": [{"external_id": "u", "name": [], "time": {}}]}),
        ("POST", TRACK, {"purchases": [{"external_id": "u", "price": float("nan")}]}),
        ("POST", TRACK, {"attributes": [{"external_id": "u", "x": {"inc": None}}]}),
        ("POST", TRACK, {"attributes": [{"external_id": "u", "x": {"add": None}}]}),
        ("POST", EXPORT, {"external_ids": None, "fields_to_export": None}),
        ("POST", EXPORT, {"user_aliases": [None], "fields_to_export": ["email"]}),
        ("POST", EXPORT, {"external_ids": [[]], "fields_to_export": [None]}),
        ("POST", TRACK, b"\x00\x01"),
        ("POST", TRACK, bytearray(b"{}")),
        ("POST", TRACK, 3.5),
        ("POST", TRACK, {1: 2}),
        ("POST", TRACK, {"attributes": [{"external_id": "u", 1: 2}]}),
    ],
)
def test_odd_requests_answer_without_raising(ws, method, path, body):
    r = ws.call(method, path, body=body)
    assert isinstance(r, Response)
    assert isinstance(r.status, int)
    assert r.body is None or isinstance(r.body, dict)
    # whatever the odd request did, the workspace still answers normal requests
    ok = ws.call("POST", TRACK, body={"attributes": [{"external_id": "after", "a": 1}]})
    assert ok.status == 201
    assert exists(ws, "after")


def test_apply_answers_every_request_in_order(ws):
    rs = ws.apply(
        [
            {"method": "POST", "path": "/users/nope", "body": {}},
            {"method": "POST", "path": TRACK, "body": "{broken"},
            {"method": "GET", "path": TRACK},
            {"method": "POST", "path": TRACK, "body": {"attributes": [{"external_id": "u1", "a": 1}]}},
            {"method": "POST", "path": TRACK, "body": []},
        ]
    )
    assert [r.status for r in rs] == [404, 400, 405, 201, 400]
    assert rs[1].body == {"message": BAD_JSON}
    assert rs[4].body == {"message": FATAL_BODY_NOT_OBJECT, "errors": [FATAL_BODY_NOT_OBJECT]}
    assert custom_attributes(ws, "u1") == {"a": 1}


def test_response_is_a_frozen_dataclass(ws):
    r = ws.call("POST", "/users/nope", body={})
    assert dataclasses.is_dataclass(r)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.status = 200  # type: ignore[misc]
