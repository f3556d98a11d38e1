"""The REST server, started for real (uvicorn on a free port, in a thread) and spoken to over
HTTP with httpx: every endpoint answers as `Workspace.call`, keys and permissions, SCIM tokens,
rate limits, bad HTTP input, group commit under concurrent clients."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import orjson
import pytest
import uvicorn
from tests.helpers import NOW, open_ws

from engagelake import Workspace
from engagelake.api import create_app
from engagelake.api.limits import DEFAULT_LIMITS, LIMITED, PER_ADDRESS, PER_LINK, Limit
from engagelake.link_keys import LINK_KEYS_ENV
from engagelake.permissions import ENDPOINT_PERMISSIONS, KEY_PERMISSIONS, SCIM, SIGNED_LINK
from engagelake.resources.scim import ERROR_SCHEMA
from engagelake.routes import ROUTE_TABLE

ORIGIN = "https://idp.example.com"


@contextmanager
def served(ws: Workspace, **options: Any) -> Iterator[httpx.Client]:
    """The app over `ws` under a real uvicorn server; a client with its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(ws, **options)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            client.writer = app.state.writer  # type: ignore[attr-defined]  # for the group-commit test
            yield client
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def scim_headers(token: str, origin: str = ORIGIN) -> dict[str, str]:
    return {**bearer(token), "X-Request-Origin": origin}


def send(client: httpx.Client, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
         query: dict[str, str] | None = None) -> httpx.Response:
    content = None if body is None else orjson.dumps(body)
    return client.request(method, path, content=content, params=query,
                          headers={"Content-Type": "application/json", **(headers or {})})


def body_of(response: httpx.Response) -> Any:
    if not response.content:
        return None
    if response.headers["content-type"].startswith("text/html"):
        return response.text
    return response.json()


# one request per endpoint, in an order where most succeed (later ones use what earlier made)
SCRIPT: list[tuple[str, str, Any, dict[str, str] | None]] = [
    ("POST", "/users/track", {"attributes": [{"external_id": "ann", "email": "ann@example.com", "visits": {"inc": 2}},
                                             {"external_id": "bob", "email": "bob@example.com"}],
                              "events": [{"external_id": "ann", "name": "open", "time": "2026-11-20T10:00:00Z"}]},
     None),
    ("POST", "/users/export/ids", {"external_ids": ["ann"], "fields_to_export": ["email", "custom_attributes"]}, None),
    ("POST", "/users/alias/new", {"user_aliases": [{"external_id": "ann", "alias_name": "a1", "alias_label": "crm"}]},
     None),
    ("POST", "/users/alias/update", {"alias_updates": [{"alias_label": "crm", "old_alias_name": "a1",
                                                        "new_alias_name": "a2"}]}, None),
    ("POST", "/users/identify", {"aliases_to_identify": [{"external_id": "ann",
                                                           "user_alias": {"alias_name": "a2", "alias_label": "crm"}}]},
     None),
    ("POST", "/users/external_ids/rename", {"external_id_renames": [{"current_external_id": "bob",
                                                                      "new_external_id": "robert"}]}, None),
    ("POST", "/users/external_ids/remove", {"external_ids": ["bob"]}, None),
    ("POST", "/users/merge", {"merge_updates": [{"identifier_to_merge": {"external_id": "robert"},
                                                 "identifier_to_keep": {"external_id": "ann"}}]}, None),
    ("POST", "/users/delete", {"external_ids": ["nobody"]}, None),
    ("POST", "/catalogs", {"catalogs": [{"name": "shoes", "description": "Shoes",
                                         "fields": [{"name": "id", "type": "string"},
                                                    {"name": "price", "type": "number"}]}]}, None),
    ("GET", "/catalogs", None, None),
    ("PUT", "/catalogs/shoes/items", {"items": [{"id": "s1", "price": "12"}]}, None),
    ("DELETE", "/catalogs/shoes/items", {"items": [{"id": "s1"}]}, None),
    ("POST", "/preference_center/v1", {"name": "main", "preference_center_title": "Prefs",
                                       "preference_center_page_html": "<p>{{${email_address}}}</p>",
                                       "confirmation_page_html": "<p>done</p>"}, None),
    ("GET", "/preference_center/v1/list", None, None),
    ("PUT", "/preference_center/v1/public_url", {"public_url": "https://prefs.example.com"}, None),
    ("GET", "/campaigns/translations", None, {"campaign_id": "c1", "message_variation_id": "m1"}),
    ("GET", "/campaign/translations", None, {"campaign_id": "c1"}),
    ("GET", "/subscription/status/get", None, {"subscription_group_id": "g1", "external_id": "ann,robert"}),
    ("GET", "/subscription/user/status", None, {"external_id": "ann", "limit": "10"}),
    ("POST", "/subscription/status/set", {"subscription_group_id": "g1", "subscription_state": "subscribed",
                                          "external_id": ["ann", "ghost"]}, None),
    ("POST", "/v2/subscription/status/set", {"subscription_groups": [
        {"subscription_group_id": "g2", "subscription_state": "unsubscribed", "emails": ["ann@example.com"]}]}, None),
    ("POST", "/email/status", {"email": "ann@example.com", "subscription_state": "unsubscribed"}, None),
    ("POST", "/email/blocklist", {"email": ["bob@example.com", "nobody@example.com"]}, None),
    ("POST", "/email/bounce/remove", {"email": "nobody@example.com"}, None),
    ("POST", "/email/spam/remove", {"email": "bob@example.com"}, None),
    ("GET", "/email/unsubscribes", None, {"start_date": "2020-01-01", "end_date": "2100-01-01", "limit": "500"}),
    ("GET", "/email/hard_bounces", None, {"email": "bob@example.com"}),
    ("POST", "/scim/v2/Users", {"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"],
                                "userName": "ann@example.com", "name": {"givenName": "Ann", "familyName": "Lee"},
                                "department": "marketing", "permissions": {"companyPermissions": ["admin"]}}, None),
    ("GET", "/scim/v2/Users", None, {"filter": 'userName eq "ann@example.com"'}),
]


def test_every_endpoint_answers_over_http_as_workspace_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # one key file for both stores: their links and pages' submit URLs are signed alike
    monkeypatch.setenv(LINK_KEYS_ENV, str(tmp_path / "link-keys.json"))
    served_ws, twin = open_ws(tmp_path, "served"), open_ws(tmp_path, "twin")
    key = served_ws.credentials.create_key("all", ["all"])
    token = served_ws.credentials.create_scim_token(ORIGIN)
    script = list(SCRIPT)
    with served(served_ws) as client:
        seen: set[tuple[str, str]] = set()
        for method, path, body, query in script:
            got = send(client, method, path, body, scim_headers(token) if path.startswith("/scim") else bearer(key),
                       query)
            want = twin.call(method, path, body, query)
            assert (got.status_code, body_of(got)) == (want.status, want.body), (method, path)
            seen.add((method, path))
        # the endpoints that take IDs made by the script, once their IDs are known
        center = twin.call("GET", "/preference_center/v1/list").body["preference_centers"][0]["preference_center_api_id"]
        user = twin.call("GET", "/scim/v2/Users", query={"filter": 'userName eq "ann@example.com"'}).body
        uid = user["Resources"][0]["id"]
        later = [
            ("GET", f"/preference_center/v1/{center}", None, None),
            ("PUT", f"/preference_center/v1/{center}", {"name": "main", "preference_center_title": "New",
                                                        "preference_center_page_html": "<p>{{${email_address}}}</p>",
                                                        "confirmation_page_html": "<p>ok</p>"}, None),
            ("GET", f"/preference_center/v1/{center}/page", None, {"external_id": "ann"}),
            ("POST", f"/preference_center/v1/{center}/submit", {}, {"token": "forged"}),
            ("GET", f"/preference_center/v1/{center}/link", None, {"external_id": "ann"}),
            ("GET", f"/scim/v2/Users/{uid}", None, None),
            ("PUT", f"/scim/v2/Users/{uid}", {"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"],
                                              "name": {"givenName": "Ann", "familyName": "Li"},
                                              "department": "sales", "permissions": {}}, None),
            ("DELETE", f"/scim/v2/Users/{uid}", None, None),
        ]
        for method, path, body, query in later:
            got = send(client, method, path, body, scim_headers(token) if path.startswith("/scim") else bearer(key),
                       query)
            want = twin.call(method, path, body, query)
            assert (got.status_code, body_of(got)) == (want.status, want.body), (method, path)
        # a recipient's page and its form, by the link (the token is the only credential)
        link = twin.call("GET", f"/preference_center/v1/{center}/link", query={"external_id": "ann"}).body["url"]
        token = parse_qs(urlsplit(link).query)["token"][0]
        recipient = [("GET", f"/preferences/{center}", None, {"token": token}),
                     ("POST", f"/preferences/{center}", {}, {"token": token})]
        for method, path, body, query in recipient:
            got = send(client, method, path, body, None, query)
            want = twin.call(method, path, body, query)
            assert (got.status_code, body_of(got)) == (want.status, want.body), (method, path)
    patterns = {(m, p) for p, methods in ROUTE_TABLE.items() for m in methods}
    assert len(seen) + len(later) + len(recipient) == len(patterns)  # every endpoint, once
    assert served_ws.export_users(["external_id", "email"]) == twin.export_users(["external_id", "email"])


def test_the_permission_table_covers_every_route() -> None:
    assert {(m, p) for p, methods in ROUTE_TABLE.items() for m in methods} == set(ENDPOINT_PERMISSIONS)
    assert set(LIMITED) <= set(ENDPOINT_PERMISSIONS)
    # PER_LINK: the recipients' pages; PER_ADDRESS: requests refused for their credential
    assert set(LIMITED.values()) | {PER_LINK, PER_ADDRESS} == set(DEFAULT_LIMITS)
    # every route a key or SCIM token opens counts against a limit; the signed links', per link
    assert set(LIMITED) == {route for route, permission in ENDPOINT_PERMISSIONS.items() if permission != SIGNED_LINK}


def test_a_key_limit_holds_one_key_without_spending_the_others(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    greedy, other, third = (ws.credentials.create_key(name, ["all"]) for name in ("greedy", "other", "third"))
    clock = UnixClock(NOW.timestamp() + 1)
    export = {"external_ids": ["x1"], "fields_to_export": ["external_id"]}
    with served(ws, rate_limits={**DEFAULT_LIMITS, "export": Limit(5, 60)}, key_limits={"export": Limit(2, 60)},
                clock=clock) as client:
        first = send(client, "POST", "/users/export/ids", export, bearer(greedy))
        # the headers of the limit nearer its end: the key's (1 of 2 left), not the workspace's (4 of 5)
        assert (first.status_code, first.headers["X-RateLimit-Limit"], first.headers["X-RateLimit-Remaining"]) \
            == (200, "2", "1")
        assert send(client, "POST", "/users/export/ids", export, bearer(greedy)).status_code == 200
        over = send(client, "POST", "/users/export/ids", export, bearer(greedy))
        assert over.status_code == 429
        assert "rate limit of POST /users/export/ids for key 'greedy' exceeded (2 requests per 60 s)" \
            in over.json()["message"]
        # the refused request spent none of the workspace's limit: 3 of 5 left for the others,
        # each key held to its own 2 as well (the headers: whichever is nearer its end)
        for remaining in ("1", "0"):
            answered = send(client, "POST", "/users/export/ids", export, bearer(other))
            assert (answered.status_code, answered.headers["X-RateLimit-Remaining"]) == (200, remaining)
        answered = send(client, "POST", "/users/export/ids", export, bearer(third))
        assert (answered.status_code, answered.headers["X-RateLimit-Limit"]) == (200, "5")  # the last of 5
        # the workspace's own limit holds over every key: 5 answered in all, the sixth refused
        shared = send(client, "POST", "/users/export/ids", export, bearer(third))
        assert shared.status_code == 429 and "for key" not in shared.json()["message"]
        assert shared.headers["X-RateLimit-Limit"] == "5"
        # a limit a key has no own bound for counts only the workspace's
        assert send(client, "GET", "/catalogs", None, bearer(greedy)).headers["X-RateLimit-Limit"] == "50"
        clock.now += 60  # the next window: the greedy key may export again
        assert send(client, "POST", "/users/export/ids", export, bearer(greedy)).status_code == 200
    with pytest.raises(ValueError, match="anonymous not among"):
        create_app(ws, key_limits={"anonymous": Limit(1, 60)})


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, Workspace, dict[str, str]]]:
    """One served store with a key per permission (named after it), an `all` key and a SCIM token."""
    ws = open_ws(tmp_path_factory.mktemp("keyed"))
    keys = {permission: ws.credentials.create_key(permission, [permission]) for permission in KEY_PERMISSIONS}
    keys["all"] = ws.credentials.create_key("everything", ["all"])
    keys[SCIM] = ws.credentials.create_scim_token(ORIGIN)
    with served(ws, rate_limits=None, openapi=True) as client:
        yield client, ws, keys


def concrete(pattern: str) -> str:
    return pattern.replace("{catalog_name}", "shoes").replace("{preferenceCenterExternalID}", "x").replace("{id}", "x")


@pytest.mark.parametrize(("method", "pattern"), sorted(ENDPOINT_PERMISSIONS))
def test_permission_matrix(keyed: tuple[httpx.Client, Workspace, dict[str, str]], method: str, pattern: str) -> None:
    """A key without the endpoint's permission gets 401 naming it; one with it gets past auth."""
    client, _, keys = keyed
    permission = ENDPOINT_PERMISSIONS[(method, pattern)]
    path = concrete(pattern)
    body = None if method == "GET" else {}
    if permission in (SCIM, SIGNED_LINK):
        with_key = send(client, method, path, body, bearer(keys["all"]))
        if permission == SCIM:  # an API key is no SCIM token
            assert with_key.status_code == 401 and with_key.json()["schemas"] == [ERROR_SCHEMA]
        else:  # the signed link is the credential: no key needed, the server checks the token
            assert with_key.status_code != 401 and send(client, method, path, body).status_code != 401
        return
    for other, key in keys.items():
        if other in (permission, "all", SCIM):
            continue
        refused = send(client, method, path, body, bearer(key))
        assert refused.status_code == 401
        assert refused.json() == {"message": f"Invalid API key: key {other!r} lacks the permission {permission!r} "
                                             f"that {method} {pattern} needs"}
        break
    for allowed in (keys[permission], keys["all"]):
        assert send(client, method, path, body, bearer(allowed)).status_code != 401


def test_unauthenticated_requests_get_401_with_a_message(keyed: tuple[httpx.Client, Workspace, dict[str, str]]) -> None:
    client, _, keys = keyed
    track = {"attributes": [{"external_id": "x1"}]}
    cases = [
        ({}, "no key sent; send it in the Authorization: Bearer header"),
        (bearer("elk_nope_nope"), "the key is not known, or was revoked"),
        (bearer(keys["users.track"] + "x"), "the key is not known, or was revoked"),
        ({"Authorization": keys["users.track"]}, "no key sent; send it in the Authorization: Bearer header"),
        (bearer(keys[SCIM]), "the key is not known, or was revoked"),
    ]
    for headers, message in cases:
        r = send(client, "POST", "/users/track", track, headers)
        assert (r.status_code, r.json()) == (401, {"message": f"Invalid API key: {message}"})
    in_body = send(client, "POST", "/users/track", {**track, "api_key": keys["users.track"]})
    assert in_body.status_code == 401
    assert "Authorization: Bearer header, not in the request body" in in_body.json()["message"]
    # even with the header: a key in a body is refused, so that callers move it out
    assert send(client, "POST", "/users/track", {**track, "api_key": "x"}, bearer(keys["users.track"])).status_code == 401


def test_keys_are_checked_on_the_event_loop_within_their_ttl(tmp_path: Path) -> None:
    """Within its TTL the ring read last answers without a read of the store; past it, a key
    revoked by another process is refused."""
    ws = open_ws(tmp_path)
    key = ws.credentials.create_key("ingest", ["users.track"])
    track = {"attributes": [{"external_id": "x1"}]}
    with served(ws, credentials_ttl=0.5) as client:
        assert send(client, "POST", "/users/track", track, bearer(key)).status_code == 201
        Workspace.open(tmp_path / "store").credentials.revoke_key("ingest")
        deadline = time.monotonic() + 30
        while (status := send(client, "POST", "/users/track", track, bearer(key)).status_code) == 201:
            assert time.monotonic() < deadline, "a revoked key still worked long past its TTL"
            time.sleep(0.05)
        assert status == 401


def test_a_revoked_key_is_refused_at_once(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    key = ws.credentials.create_key("ingest", ["users.track"])
    track = {"attributes": [{"external_id": "x1"}]}
    with served(ws, credentials_ttl=0) as client:
        assert send(client, "POST", "/users/track", track, bearer(key)).status_code == 201
        other = Workspace.open(tmp_path / "store")  # another process's, as `engagelake keys revoke`
        other.credentials.revoke_key("ingest")
        r = send(client, "POST", "/users/track", track, bearer(key))
        assert (r.status_code, r.json()["message"]) == (401, "Invalid API key: the key is not known, or was revoked")
        again = other.credentials.create_key("ingest", ["users.track"])  # the name is free again
        assert send(client, "POST", "/users/track", track, bearer(again)).status_code == 201
    listed = ws.credentials.list_keys()
    assert sorted((k["name"], k["revoked_at"] is not None) for k in listed) == [("ingest", False), ("ingest", True)]
    assert all(key not in str(row) for row in ws.table("api_keys").collect().rows())  # only digests are stored


def test_scim_needs_its_token_and_origin(keyed: tuple[httpx.Client, Workspace, dict[str, str]]) -> None:
    client, _, keys = keyed
    cases = [
        ({"X-Request-Origin": ORIGIN}, "a valid SCIM token is required in the Authorization: Bearer header"),
        (scim_headers(keys[SCIM] + "x"), "a valid SCIM token is required in the Authorization: Bearer header"),
        (bearer(keys[SCIM]), "the X-Request-Origin header does not match this SCIM token's origin"),
        (scim_headers(keys[SCIM], "https://evil.example.com"),
         "the X-Request-Origin header does not match this SCIM token's origin"),
    ]
    for headers, detail in cases:
        r = send(client, "GET", "/scim/v2/Users/x", None, headers)
        assert (r.status_code, r.json()) == (401, {"schemas": [ERROR_SCHEMA], "detail": detail, "status": 401})
    assert send(client, "GET", "/scim/v2/Users/x", None, scim_headers(keys[SCIM])).status_code == 404


class UnixClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_rate_limits_count_per_window_and_answer_429(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    key = ws.credentials.create_key("all", ["all"])
    clock = UnixClock(NOW.timestamp() + 1)  # one second into a 3-second window
    limits = {**DEFAULT_LIMITS, "track": Limit(2, 3)}
    track = {"attributes": [{"external_id": "x1", "n": {"inc": 1}}]}
    with served(ws, rate_limits=limits, clock=clock) as client:
        reset = str(int(NOW.timestamp()) + 3)
        for remaining in ("1", "0"):
            r = send(client, "POST", "/users/track", track, bearer(key))
            assert r.status_code == 201
            assert (r.headers["X-RateLimit-Limit"], r.headers["X-RateLimit-Remaining"],
                    r.headers["X-RateLimit-Reset"]) == ("2", remaining, reset)
        over = send(client, "POST", "/users/track", track, bearer(key))
        assert over.status_code == 429 and "rate limit of POST /users/track exceeded" in over.json()["message"]
        assert (over.headers["X-RateLimit-Remaining"], over.headers["X-RateLimit-Reset"]) == ("0", reset)
        # other limits count apart, the hosted API's for the routes the specification leaves out
        export = send(client, "POST", "/users/export/ids", {"external_ids": ["x1"], "fields_to_export": ["external_id"]},
                      bearer(key))
        assert export.status_code == 200 and export.headers["X-RateLimit-Limit"] == "250"
        assert send(client, "GET", "/catalogs", None, bearer(key)).headers["X-RateLimit-Limit"] == "50"
        listed = send(client, "GET", "/preference_center/v1/list", None, bearer(key))
        assert (listed.headers["X-RateLimit-Limit"], listed.headers["X-RateLimit-Remaining"]) == ("1000", "999")
        # refused callers use up nothing
        assert send(client, "POST", "/users/export/ids", {}, bearer("elk_x_y")).status_code == 401
        assert send(client, "POST", "/users/export/ids", {"external_ids": ["x1"], "fields_to_export": ["email"]},
                    bearer(key)).headers["X-RateLimit-Remaining"] == "248"
        clock.now += 2  # the next window
        again = send(client, "POST", "/users/track", track, bearer(key))
        assert again.status_code == 201 and again.headers["X-RateLimit-Remaining"] == "1"
    # the refused request was not applied: two increments, then one
    custom = ws.call("POST", "/users/export/ids", {"external_ids": ["x1"], "fields_to_export": ["custom_attributes"]})
    assert custom.body["users"][0]["custom_attributes"] == {"n": 3}


def test_bad_http_input_gets_json_errors(keyed: tuple[httpx.Client, Workspace, dict[str, str]]) -> None:
    client, _, keys = keyed
    auth = bearer(keys["all"])
    cases = [
        (client.post("/users/track", content=b"{not json", headers=auth), 400, "request body is not valid JSON"),
        (client.get("/users/nothing", headers=auth), 404, "no such endpoint: GET /users/nothing"),
        (client.get("/", headers=auth), 404, "no such endpoint: GET /"),
        (client.get("/users/track", headers=auth), 405, "method GET not allowed on /users/track; allowed: POST"),
        (client.patch("/catalogs", headers=auth), 405, "method PATCH not allowed on /catalogs; allowed: GET, POST"),
    ]
    for response, status, message in cases:
        assert response.headers["content-type"] == "application/json"
        assert (response.status_code, response.json()) == (status, {"message": message})
    no_body = client.post("/users/track", content=b"", headers=auth)  # as `call` without a body
    assert (no_body.status_code, no_body.json()) == (400, Workspace.open(keyed[1].store.uri).call("POST", "/users/track").body)


def test_user_endpoints_take_at_most_4_mb_as_the_hosted_api(tmp_path: Path) -> None:
    """A bulk pass costs up to about 130 times its body (issue 56): `/users/*` bodies are
    bounded at the hosted API's 4 MB whatever `max_body_bytes` allows; other endpoints keep it."""
    ws = open_ws(tmp_path)
    key = ws.credentials.create_key("all", ["all"])
    with served(ws) as client:
        big = {"attributes": [{"external_id": "x1", "note": "y" * (5 << 20)}]}
        r = send(client, "POST", "/users/track", big, bearer(key))
        assert (r.status_code, r.json()) == (413, {"message": "request body over 4,194,304 bytes; split it into "
                                                              "smaller requests"})
        catalog = send(client, "PUT", "/catalogs/none/items", {"items": [{"id": "a", "note": "y" * (5 << 20)}]},
                       bearer(key))
        assert catalog.status_code != 413
    assert ws.export_users(["external_id"]) == []


def test_bodies_over_the_limit_get_413(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    key = ws.credentials.create_key("all", ["all"])
    with served(ws, max_body_bytes=1000) as client:
        big = {"attributes": [{"external_id": "x1", "note": "y" * 2000}]}
        r = send(client, "POST", "/users/track", big, bearer(key))
        assert (r.status_code, r.json()) == (413, {"message": "request body over 1,000 bytes; split it into smaller "
                                                              "requests"})

        def chunks() -> Iterator[bytes]:  # no Content-Length: the server stops reading at the limit
            yield orjson.dumps(big)

        streamed = client.post("/users/track", content=chunks(), headers=bearer(key))
        assert streamed.status_code == 413
        assert send(client, "POST", "/users/track", {"attributes": [{"external_id": "x1"}]}, bearer(key)).status_code == 201
    assert ws.export_users(["external_id", "custom_attributes"]) == [{"external_id": "x1"}]


def test_the_openapi_document_and_its_pages_are_off_unless_asked(tmp_path: Path) -> None:
    """They answer without a key and map every endpoint (issue 56): `serve --openapi` turns them on."""
    with served(open_ws(tmp_path)) as client:
        for path in ("/openapi.json", "/docs", "/redoc"):
            answer = client.get(path)
            assert answer.status_code == 404 and list(answer.json()) == ["message"], path


def test_link_tokens_are_redacted_in_the_access_log() -> None:
    import logging

    from engagelake.api import access_log

    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5000", "GET", "/preferences/main?token=abc.def&x=1", "1.1", 200), None)
    assert access_log.REDACTOR.filter(record)
    assert record.getMessage() == '127.0.0.1:5000 - "GET /preferences/main?token=<redacted>&x=1 HTTP/1.1" 200'
    assert access_log.redacted("/x?a=1&token=t#f") == "/x?a=1&token=<redacted>#f"


def test_openapi_lists_every_endpoint_with_its_permission(keyed: tuple[httpx.Client, Workspace, dict[str, str]]) -> None:
    client, _, _ = keyed
    spec = client.get("/openapi.json").json()
    listed = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
    assert listed == set(ENDPOINT_PERMISSIONS)
    track = spec["paths"]["/users/track"]["post"]
    assert "users.track" in track["description"] and "201" in track["responses"]
    assert track["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/TrackRequest"}
    assert {"AttributesObject", "EventObject", "PurchaseObject", "MergeRequest"} <= set(spec["components"]["schemas"])
    # the pages answer HTML; a recipient's page takes its token in the query
    page = spec["paths"]["/preferences/{preferenceCenterExternalID}"]
    for method in ("get", "post"):
        assert list(page[method]["responses"]["200"]["content"]) == ["text/html"]
        assert {"name": "token", "in": "query", "required": True, "schema": {"type": "string"}} in page[method]["parameters"]
    staff = spec["paths"]["/preference_center/v1/{preferenceCenterExternalID}/page"]["get"]
    assert list(staff["responses"]["200"]["content"]) == ["text/html"]
    assert list(track["responses"]["201"]["content"]) == ["application/json"]
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/docs").status_code == 200


CLIENTS, PER_CLIENT = 8, 200


@pytest.mark.slow  # 1,600 requests from 8 clients: a concurrency load test
def test_concurrent_clients_lose_nothing_and_commit_in_groups(tmp_path: Path) -> None:
    """8 clients x 200 track requests: every acknowledged object is stored, each client's own
    order holds (its last write wins), and the writer grouped requests into fewer batches."""
    ws = open_ws(tmp_path)
    key = ws.credentials.create_key("ingest", ["users.track", "users.export.ids"])
    with served(ws, rate_limits=None) as client:
        def run(c: int) -> list[int]:
            statuses = []
            with httpx.Client(base_url=str(client.base_url), timeout=60) as own:
                for i in range(PER_CLIENT):
                    body = {"attributes": [{"external_id": f"client-{c}", "last": i},
                                           {"external_id": "shared", "count": {"inc": 1}}],
                            "events": [{"external_id": "shared", "name": f"c{c}", "time": "2026-11-20T10:00:00Z"}]}
                    statuses.append(send(own, "POST", "/users/track", body, bearer(key)).status_code)
            return statuses

        with ThreadPoolExecutor(CLIENTS) as pool:
            statuses = [s for part in pool.map(run, range(CLIENTS)) for s in part]
        batches = client.writer.batches  # type: ignore[attr-defined]
        export = send(client, "POST", "/users/export/ids",
                      {"external_ids": ["shared", *(f"client-{c}" for c in range(CLIENTS))],
                       "fields_to_export": ["external_id", "custom_attributes", "custom_events"]}, bearer(key)).json()
    assert statuses == [201] * (CLIENTS * PER_CLIENT)
    assert batches < CLIENTS * PER_CLIENT  # requests that queued together were applied together
    users = {u["external_id"]: u for u in export["users"]}
    assert users["shared"]["custom_attributes"] == {"count": CLIENTS * PER_CLIENT}
    assert {e["name"]: e["count"] for e in users["shared"]["custom_events"]} == {f"c{c}": PER_CLIENT
                                                                                  for c in range(CLIENTS)}
    assert all(users[f"client-{c}"]["custom_attributes"] == {"last": PER_CLIENT - 1} for c in range(CLIENTS))


def test_a_failed_commit_answers_503_and_the_server_keeps_serving(tmp_path: Path) -> None:
    """A real failure: the next log entry of a table the commit writes is in the way (a folder
    of that name). The request answers 503 and writes nothing; once the way is clear, the next
    request is applied."""
    ws = open_ws(tmp_path)
    key = ws.credentials.create_key("all", ["all"])
    from deltalake import DeltaTable
    with served(ws) as client:
        assert send(client, "POST", "/users/track", {"attributes": [{"external_id": "before"}]}, bearer(key)).status_code == 201
        table = tmp_path / "store" / "external_ids"
        blocker = table / "_delta_log" / f"{DeltaTable(str(table)).version() + 1:020d}.json"
        blocker.mkdir()
        failed = send(client, "POST", "/users/track", {"attributes": [{"external_id": "lost"}]}, bearer(key))
        assert failed.status_code == 503 and "nothing of it was stored" in failed.json()["message"]
        blocker.rmdir()
        assert send(client, "POST", "/users/track", {"attributes": [{"external_id": "after"}]}, bearer(key)).status_code == 201
        export = send(client, "POST", "/users/export/ids", {"external_ids": ["before", "lost", "after"],
                                                            "fields_to_export": ["external_id"]}, bearer(key)).json()
    assert [u["external_id"] for u in export["users"]] == ["before", "after"]
    assert export["invalid_user_ids"] == ["lost"]


def test_sigterm_finishes_the_requests_in_flight_and_loses_nothing(tmp_path: Path) -> None:
    """`engagelake serve` as a process, 4 clients sending, SIGTERM mid-flight: the process exits
    cleanly and every acknowledged object is in the store."""
    import os
    import signal
    import subprocess
    import sys

    store = tmp_path / "store"
    key = open_ws(tmp_path).credentials.create_key("ingest", ["users.track"])
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    number = port.getsockname()[1]
    port.close()
    command = [str(Path(sys.executable).with_name("engagelake")), "serve", "--store", str(store), "--port", str(number)]
    log = tmp_path / "server.log"  # a file, not a pipe: a full pipe would stop the server
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log.open("wb"), env={**os.environ})
    base = f"http://127.0.0.1:{number}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{base}/healthz").status_code == 200:
                break
        except httpx.TransportError:
            assert time.monotonic() < deadline and server.poll() is None, log.read_text()
            time.sleep(0.1)
    acknowledged: list[str] = []
    stop = threading.Event()

    def run(c: int) -> None:
        with httpx.Client(base_url=base, timeout=60) as client:
            for i in range(10_000):
                if stop.is_set():
                    return
                ids = [f"c{c}-{i}-{j}" for j in range(5)]
                try:
                    r = send(client, "POST", "/users/track", {"attributes": [{"external_id": x} for x in ids]},
                             bearer(key))
                except httpx.TransportError:  # the server stopped taking requests
                    return
                if r.status_code == 201:
                    acknowledged.extend(ids)

    threads = [threading.Thread(target=run, args=(c,)) for c in range(4)]
    for t in threads:
        t.start()
    while len(acknowledged) < 40:
        time.sleep(0.05)
    server.send_signal(signal.SIGTERM)
    # uvicorn shuts down gracefully, then raises the signal again: the exit status is SIGTERM's
    assert server.wait(60) == -signal.SIGTERM
    assert "Application shutdown complete" in log.read_text()
    stop.set()
    for t in threads:
        t.join(60)
    ws = Workspace.open(store)
    for start in range(0, len(acknowledged), 50):
        part = acknowledged[start:start + 50]
        found = ws.call("POST", "/users/export/ids", {"external_ids": part, "fields_to_export": ["external_id"]})
        assert sorted(u["external_id"] for u in found.body["users"]) == sorted(part)


def test_a_request_whose_caller_is_gone_is_skipped_and_the_writer_lives_on(tmp_path: Path) -> None:
    """A cancelled future (its handler was cancelled) is neither applied nor answered; the
    requests queued beside it are."""
    from engagelake.api.writer import GroupCommitWriter

    ws = open_ws(tmp_path)
    writer = GroupCommitWriter(ws)
    track = {"method": "POST", "path": "/users/track"}
    gone = writer.submit({**track, "body": {"attributes": [{"external_id": "gone"}]}})
    kept = writer.submit({**track, "body": {"attributes": [{"external_id": "kept"}]}})
    assert gone.cancel()
    writer.start()
    try:
        assert kept.result(60).status == 201
        later = writer.submit({**track, "body": {"attributes": [{"external_id": "later"}]}})
        assert later.result(60).status == 201
    finally:
        writer.stop()
    assert [u["external_id"] for u in ws.export_users(["external_id"])] == ["kept", "later"]


def test_the_key_is_checked_before_the_body_is_read(tmp_path: Path) -> None:
    """A caller without a valid key cannot make the server read a big body: it is refused
    first (401, not 413), and its body is read only up to `PEEK_BYTES`, to tell a key sent in
    the body (its own message) from no key at all."""
    from engagelake.api.app import PEEK_BYTES

    ws = open_ws(tmp_path)
    key = ws.credentials.create_key("all", ["all"])
    with served(ws, max_body_bytes=1000) as client:
        big = {"attributes": [{"external_id": "x1", "note": "y" * 5000}]}
        assert send(client, "POST", "/users/track", big).json() == {
            "message": "Invalid API key: no key sent; send it in the Authorization: Bearer header"}
        assert send(client, "POST", "/users/track", big, bearer("elk_nobody_x")).status_code == 401
        assert send(client, "POST", "/users/track", big, bearer(key)).status_code == 413  # known key: then the size
        small = send(client, "POST", "/users/track", {"api_key": key, "attributes": []})
        assert "not in the request body" in small.json()["message"]
        past_peek = send(client, "POST", "/users/track", {"api_key": key, "pad": "y" * PEEK_BYTES})
        assert past_peek.json()["message"].endswith("no key sent; send it in the Authorization: Bearer header")
    assert ws.export_users(["external_id"]) == []


def test_a_full_queue_answers_503_and_stores_nothing(tmp_path: Path) -> None:
    from engagelake.api.writer import GroupCommitWriter, WriterBusy

    ws = open_ws(tmp_path)
    key = ws.credentials.create_key("all", ["all"])
    with served(ws, max_queued=0) as client:
        r = send(client, "POST", "/users/track", {"attributes": [{"external_id": "x1"}]}, bearer(key))
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "x-ratelimit-remaining" not in r.headers  # turned away before the limit counted it
        assert "nothing of this request was stored" in r.json()["message"]
    assert ws.export_users(["external_id"]) == []
    writer = GroupCommitWriter(ws, max_queued=2)  # not started: requests wait
    track = {"method": "POST", "path": "/users/track"}
    first, second = (writer.submit({**track, "body": {"attributes": [{"external_id": f"u{i}"}]}}) for i in (1, 2))
    with pytest.raises(WriterBusy, match="2 requests are waiting"):
        writer.submit({**track, "body": {"attributes": [{"external_id": "u3"}]}})
    writer.start()
    try:
        assert first.result(60).status == second.result(60).status == 201
        assert writer.submit({**track, "body": {"attributes": [{"external_id": "u4"}]}}).result(60).status == 201
    finally:
        writer.stop()
    assert [u["external_id"] for u in ws.export_users(["external_id"])] == ["u1", "u2", "u4"]


def _track(external_id: str, **attributes: Any) -> dict[str, Any]:
    return {"method": "POST", "path": "/users/track", "body": {"attributes": [{"external_id": external_id, **attributes}]}}


def test_a_batch_waits_for_the_clients_the_last_batch_answered(tmp_path: Path) -> None:
    """After a batch of 8, a lone request waits for the 7 sent just after it: one batch, not a
    batch of 1 and then one of 7 (the alternation the wait ends); arrival order holds."""
    from engagelake.api.writer import GroupCommitWriter

    ws = open_ws(tmp_path)
    writer = GroupCommitWriter(ws, linger_gap=30.0, linger_max=60.0)  # only the 8th request ends the wait
    first = [writer.submit(_track(f"u{i}")) for i in range(8)]
    writer.start()
    try:
        assert [f.result(60).status for f in first] == [201] * 8 and writer.batches == 1
        later = [writer.submit(_track("shared", last=0))]
        time.sleep(0.05)  # the writer has drawn the lone request by now
        later += [writer.submit(_track("shared", last=i)) for i in range(1, 8)]
        assert [f.result(60).status for f in later] == [201] * 8
        assert (writer.batches, writer.lingered) == (2, 1)
    finally:
        writer.stop()
    shared = ws.call("POST", "/users/export/ids", {"external_ids": ["shared"], "fields_to_export": ["custom_attributes"]})
    assert shared.body["users"] == [{"custom_attributes": {"last": 7}}]


def test_the_writer_reports_its_batches(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every `stats_every` seconds the writer logs (INFO) the batches since its last report:
    how many, how many requests, how long they took, how many waited, what is queued."""
    import logging

    from engagelake.api.writer import GroupCommitWriter

    ws = open_ws(tmp_path)
    writer = GroupCommitWriter(ws, stats_every=3600.0, linger_max=0.0)  # no wait: the count is 0
    first = [writer.submit(_track(f"u{i}")) for i in range(5)]
    caplog.set_level(logging.INFO, logger="engagelake.api")
    writer.start()
    try:
        assert [f.result(60).status for f in first] == [201] * 5
        assert not [r for r in caplog.records if r.name == "engagelake.api"]  # not due yet
        writer.stats_every = 0.0
        assert writer.submit(_track("u9")).result(60).status == 201
        writer.stats_every = 3600.0
        assert writer.submit(_track("u10")).result(60).status == 201
    finally:
        writer.stop()
    report, last = [r.getMessage() for r in caplog.records if r.name == "engagelake.api"]
    # the seconds since the last report are whole seconds: 1 on a loaded machine
    assert re.match(r"group commit, last \d+ s: requests 6, batches 2 \(3\.0 requests a batch, at most 5\); ", report)
    assert report.endswith("; batches that waited for requests on their way 0; queued now 0")
    assert re.match(r"group commit, last \d+ s: requests 1, batches 1 \(1\.0 requests a batch, at most 1\); ", last)


def test_two_groups_of_clients_taking_turns_become_one_batch(tmp_path: Path) -> None:
    """A batch of 8 ends with 4 more queued: 12 clients are busy. The next batch takes the 4
    and waits for the 8 just answered, instead of the groups taking turns for ever."""
    from engagelake.api.writer import GroupCommitWriter

    ws = open_ws(tmp_path)
    writer = GroupCommitWriter(ws, linger_gap=30.0, linger_max=60.0)  # only the 12th request ends the wait
    first = [writer.submit(_track(f"a{i}")) for i in range(8)]
    writer.start()
    try:
        _until_drawn(writer)  # the first batch is drawn: the next requests queue behind it
        second = [writer.submit(_track(f"b{i}")) for i in range(4)]
        assert [f.result(60).status for f in first] == [201] * 8
        third = [writer.submit(_track(f"c{i}")) for i in range(8)]  # the answered clients send again
        assert [f.result(60).status for f in second + third] == [201] * 12
        assert (writer.batches, writer.lingered) == (2, 1)
    finally:
        writer.stop()
    assert len(ws.export_users(["external_id"])) == 20


def _until_drawn(writer: Any) -> None:
    """Until the writer has drawn every queued request (and ended any wait for more)."""
    deadline = time.monotonic() + 60
    while writer.queued:
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_a_wait_that_gains_nothing_is_not_tried_again_at_once(tmp_path: Path) -> None:
    """Clients slower than the gap (far away, or slow to send): a wait that gained no request
    is not tried again for the next batches, where it would only add its gap."""
    from engagelake.api.writer import GroupCommitWriter

    ws = open_ws(tmp_path)
    writer = GroupCommitWriter(ws, linger_gap=0.05, linger_max=1.0)
    first = [writer.submit(_track(f"a{i}")) for i in range(4)]
    writer.start()
    try:
        _until_drawn(writer)
        lone = writer.submit(_track("b"))  # queued behind 4: 5 clients busy when they end
        _until_drawn(writer)  # drawn alone, and the 4 answered never send again: a wait for nothing
        later = writer.submit(_track("c"))  # queued behind "b": 2 busy when it ends
        assert [f.result(60).status for f in [*first, lone, later]] == [201] * 6
        assert (writer.batches, writer.lingered) == (3, 1)  # "c" did not wait for "b"'s client
    finally:
        writer.stop()


def test_a_lone_client_never_waits(tmp_path: Path) -> None:
    from engagelake.api.writer import GroupCommitWriter

    ws = open_ws(tmp_path)
    writer = GroupCommitWriter(ws, linger_gap=30.0, linger_max=60.0)
    writer.start()
    try:
        for i in range(4):  # each request waits for its answer before the next is sent
            assert writer.submit(_track("solo", n=i)).result(60).status == 201
    finally:
        writer.stop()
    assert (writer.batches, writer.lingered) == (4, 0)


def test_a_stop_ends_the_wait_and_answers_what_came_before(tmp_path: Path) -> None:
    from engagelake.api.writer import GroupCommitWriter

    ws = open_ws(tmp_path)
    writer = GroupCommitWriter(ws, linger_gap=60.0, linger_max=120.0)
    first = [writer.submit(_track(f"u{i}")) for i in range(4)]
    writer.start()
    assert [f.result(60).status for f in first] == [201] * 4
    lone = writer.submit(_track("lone"))
    time.sleep(0.05)  # drawn, and waiting for 3 more that never come
    stopping = threading.Thread(target=writer.stop)
    stopping.start()
    stopping.join(30)  # well within the 60 s gap the wait would otherwise run to
    assert not stopping.is_alive() and lone.result(0).status == 201
    assert (writer.batches, writer.lingered) == (2, 1)
