"""Random requests (junk types, surrogates, huge integers, deep nesting, NaN) through `call` and
`apply`: nothing raises, every status is one the API knows, every body is strict JSON (issue 11)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.helpers import EXPORT, TRACK, assert_strict_json, event, open_ws, purchase, track_ok

from engagelake import Response, Workspace

STATUSES = {200, 201, 202, 204, 400, 404, 405, 409}
PATHS = [
    TRACK, EXPORT, "/users/merge", "/users/identify", "/users/external_ids/rename", "/users/external_ids/remove",
    "/users/alias/new", "/users/alias/update", "/users/delete", "/catalogs", "/catalogs/c/items",
    "/catalogs/nope/items", "/scim/v2/Users", "/scim/v2/Users/x", "/preference_center/v1/list",
    "/preference_center/v1/x", "/campaigns/translations", "//[", "/users/\ud800", "", "?", "/users/track?x=\udfff",
]
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "post", "", "\ud800"]
KEYS = ["external_id", "attributes", "events", "purchases", "name", "time", "price", "items", "id", "n",
        "merge_updates", "external_ids", "fields_to_export", "user_aliases", "alias_name", "properties",
        "userName", "catalogs", "\ud800", "$x", ""]
QUERY_KEYS = ["filter", "campaign_id", "message_variation_id", "cursor", "startIndex", "count", "locale_id",
              "external_id", "preference_center_api_id", "\ud800"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(["\ud800", "u1", "guest", "2026-01-01T00:00:00Z", "1e999", "12", "USD", "true"]),
)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=4),
    max_leaves=20,
)
deep = st.integers(min_value=40, max_value=300).map(lambda n: _nest(n))
bodies = st.one_of(
    values, deep,
    st.sampled_from(['{"x": 1e999}', "{", b"\xff", '{"attributes": [{"external_id": "u1", "v": 1e999}]}', ""]),
    st.fixed_dictionaries({}, optional={a: st.lists(st.dictionaries(st.sampled_from(KEYS), values, max_size=5),
                                                    max_size=3) | values for a in ("attributes", "events", "purchases")}),
)
requests = st.builds(
    lambda method, path, body, query: {"method": method, "path": path, "body": body, "query": query},
    st.sampled_from(METHODS), st.sampled_from(PATHS), bodies,
    st.none() | st.dictionaries(st.sampled_from(QUERY_KEYS), scalars | values, max_size=2) | scalars,
)


def _nest(n: int) -> Any:
    value: Any = 1.0
    for i in range(n):
        value = [value] if i % 2 else {"external_id": value}
    return {"attributes": [{"external_id": "u1", "deep": value}]}


def check(responses: list[Response]) -> None:
    for r in responses:
        assert r.status in STATUSES, r
        assert_strict_json(r)


@pytest.fixture(scope="module")
def fuzz_ws(tmp_path_factory) -> Workspace:
    ws = open_ws(tmp_path_factory.mktemp("fuzz"))
    track_ok(ws, attributes=[{"external_id": "u1", "n": 1}], events=[event(external_id="u1")],
             purchases=[purchase(external_id="u1")])
    fields = [{"name": "id", "type": "string"}, {"name": "n", "type": "number"}, {"name": "a", "type": "array"}]
    assert ws.call("POST", "/catalogs", {"catalogs": [{"name": "c", "description": "d", "fields": fields}]}).status == 201
    return ws


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(request=requests)
def test_a_random_request_answers_in_the_api_shapes(fuzz_ws: Workspace, request: dict[str, Any]) -> None:
    check([fuzz_ws.call(request["method"], request["path"], request["body"], request["query"])])


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=st.lists(requests, min_size=1, max_size=6))
def test_a_random_batch_answers_every_request(fuzz_ws: Workspace, batch: list[dict[str, Any]]) -> None:
    responses = fuzz_ws.apply(batch)
    assert len(responses) == len(batch)
    check(responses)


def test_bodies_are_strict_json_across_endpoints(ws: Workspace) -> None:
    """Values JSON text cannot carry never come back: stored numbers, times and echoes."""
    track_ok(ws, attributes=[{"external_id": "u1", "big": 1.7976931348623157e308, "tiny": 5e-324, "dob": "2000-01-01",
                              "when": "2026-01-01T00:00:00Z", "list": [1.5, -0.0]}],
             events=[event(external_id="u1", properties={"p": 1e308})],
             purchases=[purchase(external_id="u1", price=1e308)])
    fields = [{"name": "id", "type": "string"}, {"name": "n", "type": "number"}, {"name": "t", "type": "time"}]
    responses = [
        ws.call("POST", EXPORT, {"external_ids": ["u1", "nobody"], "fields_to_export": ["custom_attributes",
                 "custom_events", "purchases", "total_revenue", "dob", "created_at"]}),
        ws.call("POST", "/catalogs", {"catalogs": [{"name": "c", "description": "d", "fields": fields}]}),
        ws.call("PUT", "/catalogs/c/items", {"items": [{"id": "a", "n": 1e308, "t": "2026-01-01"}]}),
        ws.call("GET", "/catalogs"),
        ws.call("POST", "/scim/v2/Users", {"userName": "a@b.co", "name": {"givenName": "\ud800"}}),
        ws.call("GET", "/scim/v2/Users", query={"filter": 'userName eq "\ud800"'}),
        ws.call("GET", "/campaigns/translations", query={"campaign_id": "\ud800"}),
        ws.call("POST", TRACK, {"attributes": [{"external_id": "u1", "x": float("nan")}]}),
        ws.call("GET", "/preference_center/v1/\ud800"),
    ]
    check(responses)
    assert responses[0].status == 200
    users = responses[0].body["users"]
    assert users[0]["total_revenue"] == 1e308 and not any(isinstance(v, float) and not math.isfinite(v)
                                                          for v in users[0]["custom_attributes"].values())
