"""The server under hostile input (issue 56): a body that cannot be parsed, or a forged link on
the JSON submit route, is answered before it is queued; requests without a valid credential
count against a limit per client address; a failed batch is split in halves, not applied
request by request; a request that could not be applied answers a 503 that says nothing of
the server's inside."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tests.helpers import NOW, open_ws
from tests.test_api_server import UnixClock, bearer, send, served
from tests.test_preference_pages import seeded

from engagelake import Response, Workspace
from engagelake.api.limits import DEFAULT_LIMITS, Limit
from engagelake.api.writer import NOT_APPLIED, GroupCommitWriter
from engagelake.resources import preference_centers as P
from engagelake.rules import messages as M

DEEP = b'{"attributes": [{"external_id": "u", "n": 1e999, "deep": ' + b"[" * 5000 + b"]" * 5000 + b"}]}"


def test_a_body_that_cannot_be_parsed_is_answered_before_it_is_queued(tmp_path: Path) -> None:
    """`1e999` then deep nesting made `json.loads` raise RecursionError in the writer: the
    request answered 503 quoting it. The server parses the body first: 400, no batch."""
    ws = open_ws(tmp_path)
    key = ws.credentials.create_key("all", ["all"])
    message = M.BODY_TOO_DEEP.format(most=M.MAX_BODY_DEPTH)
    with served(ws) as client:
        before = client.writer.batches  # type: ignore[attr-defined]
        deep = client.post("/users/track", content=DEEP, headers=bearer(key))
        assert (deep.status_code, deep.json()) == (400, {"message": message, "errors": [message]})
        assert deep.headers["X-RateLimit-Limit"] == "3000"  # counted as any track request
        broken = client.post("/users/track", content=b"{not json", headers=bearer(key))
        assert (broken.status_code, broken.json()) == (400, {"message": M.BAD_JSON})
        beyond = client.post("/users/export/ids", content=b'{"external_ids": [1e999]}', headers=bearer(key))
        assert beyond.json() == {"message": M.NON_FINITE_NUMBER.format(where="external_ids[0]")}
        assert client.writer.batches == before  # type: ignore[attr-defined]
        # a catalog checks its numbers itself: what it answers comes from the handler, as before
        assert send(client, "POST", "/catalogs", {"catalogs": [{"name": "c", "description": "d", "fields": [
            {"name": "id", "type": "string"}, {"name": "n", "type": "number"}]}]}, bearer(key)).status_code == 201
        coerce = client.put("/catalogs/c/items", content=b'{"items": [{"id": "x", "n": 1e999}]}', headers=bearer(key))
        assert coerce.status_code == 400 and coerce.json()["errors"][0]["id"] == "unable-to-coerce-value"
        ok = send(client, "POST", "/users/track", {"attributes": [{"external_id": "u1"}]}, bearer(key))
        assert ok.status_code == 201
    assert ws.call("POST", "/users/track", DEEP).body["message"] == message  # as `call` answers


def test_a_forged_token_on_the_submit_route_is_refused_before_it_is_queued(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    center = seeded(ws)
    submit = f"{P.BASE}/{center}/submit"
    with served(ws) as client:
        before = client.writer.batches  # type: ignore[attr-defined]
        for query in ({"token": "forged"}, {}, {"token": "x.y"}):
            r = client.post(submit, params=query, json={"email_global_state": "unsubscribed"})
            assert (r.status_code, r.json()) == (403, {"message": P.ERR_TOKEN})
        other = client.post(f"{P.BASE}/nope/submit", params={"token": "forged"}, json={})
        assert (other.status_code, other.json()) == (403, {"message": P.ERR_TOKEN})
        assert client.writer.batches == before  # type: ignore[attr-defined]
    # the route itself checks the token first too, so `call` answers the same
    assert ws.call("POST", f"{P.BASE}/nope/submit", {}, {"token": "forged"}) == Response(403, {"message": P.ERR_TOKEN})
    signed = P.sign_token(ws.link_keys.signing_key(NOW), "nope", "sid", NOW, NOW + timedelta(days=1))
    assert ws.call("POST", f"{P.BASE}/nope/submit", {}, {"token": signed}).status == 404


def test_requests_without_a_valid_credential_are_limited_per_client_address(tmp_path: Path) -> None:
    """Forged links and missing or unknown keys count against `anonymous`, per client address:
    past it they answer 429. A valid key, and a valid link, from the same address still work."""
    ws = open_ws(tmp_path)
    center = seeded(ws)
    key = ws.credentials.create_key("all", ["all"])
    link = ws.preference_centers.link("main", "u1", base_url="https://prefs.example.com")
    token = link.split("token=")[1]
    clock = UnixClock(NOW.timestamp() + 1)
    limits = {**DEFAULT_LIMITS, "anonymous": Limit(3, 60)}
    submit = f"{P.BASE}/{center}/submit"
    with served(ws, rate_limits=limits, clock=clock) as client:
        refused = [client.post(submit, params={"token": "forged"}, json={}),
                   send(client, "POST", "/users/track", {}, None),
                   send(client, "POST", "/users/track", {}, bearer("elk_nobody_x"))]
        assert [r.status_code for r in refused] == [403, 401, 401]
        assert [r.headers["X-RateLimit-Remaining"] for r in refused] == ["2", "1", "0"]
        over = client.post(submit, params={"token": "forged"}, json={})
        assert over.status_code == 429 and "without a valid credential" in over.json()["message"]
        assert send(client, "POST", "/users/track", {}, None).status_code == 429
        page = client.get(f"/preferences/{center}", params={"token": "forged"})
        assert page.status_code == 429 and page.headers["content-type"].startswith("text/html")
        # credentials that hold still work from that address
        assert send(client, "POST", "/users/track", {"attributes": [{"external_id": "k"}]}, bearer(key)).status_code == 201
        assert client.post(submit, params={"token": token}, json={}).status_code == 200
        clock.now += 60  # the next window
        assert client.post(submit, params={"token": "forged"}, json={}).status_code == 403


class _FailingWorkspace:
    """A workspace whose `apply` fails for any batch holding a request marked bad, and records
    each batch it was given."""

    def __init__(self) -> None:
        self.store = SimpleNamespace(commit_errors=[], merge_errors=[])
        self.applied: list[list[int]] = []
        self.flush_errors: list[BaseException] = []  # as a layered workspace's

    def apply(self, requests: list[dict[str, Any]]) -> list[Response]:
        self.applied.append([r["n"] for r in requests])
        if any(r.get("bad") for r in requests):
            raise RuntimeError("/secret/path/_delta_log/00000000000000000007.json: disk on fire")
        return [Response(201, {"n": r["n"]}) for r in requests]


def test_a_failed_batch_is_split_in_halves(caplog: pytest.LogCaptureFixture) -> None:
    """One bad request among 64: about 2 log2(64) applies, not 64; every other request is
    answered once, in order; the bad one gets a 503 that says nothing internal, and the log
    has the error."""
    fake = _FailingWorkspace()
    writer = GroupCommitWriter(fake, linger_max=0.0)  # type: ignore[arg-type]
    futures: list[Future[Response]] = [writer.submit({"n": n, "bad": n == 37}) for n in range(64)]
    caplog.set_level(logging.WARNING, logger="engagelake.api")
    writer.start()
    try:
        answers = [f.result(60) for f in futures]
    finally:
        writer.stop()
    assert len(fake.applied) <= 1 + 2 * 6
    good = [n for batch in fake.applied if 37 not in batch for n in batch]
    assert good == [n for n in range(64) if n != 37]  # each once, in arrival order
    assert [a.body for a in answers if a.status == 201] == [{"n": n} for n in range(64) if n != 37]
    assert answers[37] == Response(503, {"message": NOT_APPLIED})
    assert "disk on fire" in caplog.text


def test_a_failed_commit_answers_a_503_that_says_nothing_internal(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    ws = open_ws(tmp_path)
    key = ws.credentials.create_key("all", ["all"])
    with served(ws) as client:
        assert send(client, "POST", "/users/track", {"attributes": [{"external_id": "a"}]}, bearer(key)).status_code == 201
        table = tmp_path / "store" / "external_ids"
        blocker = table / "_delta_log" / f"{DeltaTable(str(table)).version() + 1:020d}.json"
        blocker.mkdir()
        failed = send(client, "POST", "/users/track", {"attributes": [{"external_id": "lost"}]}, bearer(key))
        blocker.rmdir()
    assert (failed.status_code, failed.json()) == (503, {"message": NOT_APPLIED})
    assert "nothing of it was stored" in NOT_APPLIED
    assert [u["external_id"] for u in Workspace.open(tmp_path / "store").export_users(["external_id"])] == ["a"]
