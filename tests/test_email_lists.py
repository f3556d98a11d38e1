"""The email lists (issue 53): POST /email/status, /email/blocklist, /email/bounce/remove,
/email/spam/remove and GET /email/unsubscribes, /email/hard_bounces, through `Workspace.call`
and `apply`, over HTTP, as `ws.emails`, and against deletion."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.test_api_server import bearer, send, served

from engagelake import Response, Workspace
from engagelake.resources import email_lists as E
from engagelake.rules import messages as M

DAY1 = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
ALL = {"start_date": "2026-01-01", "end_date": "2027-01-01"}


class Clock:
    def __init__(self) -> None:
        self.now = DAY1

    def __call__(self) -> datetime:
        return self.now

    def days(self, n: int) -> None:
        self.now += timedelta(days=n)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ws(tmp_path: Path, clock: Clock) -> Workspace:
    """a and b share ann@ (b with other casing); c holds cy@; al is an alias user with ann@."""
    ws = Workspace.open(tmp_path / "s", clock=clock)
    track(ws, {"external_id": "a", "email": "ann@example.com"}, {"external_id": "b", "email": "ANN@example.com"},
          {"external_id": "c", "email": "cy@example.com"},
          {"user_alias": {"alias_name": "al", "alias_label": "crm"}, "_update_existing_only": False,
           "email": "ann@example.com"})
    return ws


def track(ws: Workspace, *attributes: dict[str, Any]) -> None:
    r = ws.call("POST", "/users/track", {"attributes": list(attributes)})
    assert r.status == 201 and "errors" not in r.body, r


def post(ws: Workspace, path: str, body: Any) -> None:
    r = ws.call("POST", path, body)
    assert (r.status, r.body) == (201, {"message": "success"}), r


def listed(ws: Workspace, path: str, **query: Any) -> list[tuple[str, str]]:
    r = ws.call("GET", path, query=query or ALL)
    assert r.status == 200 and r.body["message"] == "success" and set(r.body) == {"emails", "message"}, r
    column = "unsubscribed_at" if path == E.UNSUBSCRIBES else "hard_bounced_at"
    return [(e["email"], e[column]) for e in r.body["emails"]]


def states(ws: Workspace) -> dict[str, str | None]:
    return {u.get("external_id", "alias"): u.get("email_subscribe")
            for u in ws.export_users(["external_id", "email_subscribe"])}


def refused(r: Response) -> str:
    assert r.status == 400 and set(r.body) == {"message"}, r
    message: str = r.body["message"]
    return message


# --- POST /email/status ------------------------------------------------------------------------------
def test_status_sets_every_holder_of_the_address(ws: Workspace) -> None:
    post(ws, E.STATUS, {"email": " Ann@Example.com", "subscription_state": "opted_in"})
    assert states(ws) == {"a": "opted_in", "b": "opted_in", "c": None, "alias": "opted_in"}
    post(ws, E.STATUS, {"email": ["cy@example.com", "ann@example.com"], "subscription_state": "unsubscribed"})
    assert states(ws) == {"a": "unsubscribed", "b": "unsubscribed", "c": "unsubscribed", "alias": "unsubscribed"}
    post(ws, E.STATUS, {"email": ["ann@example.com"], "subscription_state": "subscribed"})
    assert states(ws) == {"a": "subscribed", "b": "subscribed", "c": "unsubscribed", "alias": "subscribed"}


def test_status_of_an_address_nobody_holds_is_kept_and_listed(ws: Workspace, clock: Clock) -> None:
    before = len(ws.export_users(["external_id"]))
    post(ws, E.STATUS, {"email": "lone@example.com", "subscription_state": "unsubscribed"})
    assert len(ws.export_users(["external_id"])) == before  # nobody created
    assert listed(ws, E.UNSUBSCRIBES) == [("lone@example.com", "2026-03-01 09:30:00 +0000")]
    clock.days(1)
    post(ws, E.STATUS, {"email": "lone@example.com", "subscription_state": "subscribed"})
    assert listed(ws, E.UNSUBSCRIBES) == []
    assert ws.sql("SELECT email, state FROM email_addresses").rows() == [("lone@example.com", "subscribed")]


@pytest.mark.parametrize(("body", "message"), [
    ({"subscription_state": "subscribed"}, E.ERR_EMAIL.format(most=50)),
    ({"email": [], "subscription_state": "subscribed"}, E.ERR_EMAIL.format(most=50)),
    ({"email": "ann@example.com"}, E.ERR_STATE),
    ({"email": "ann@example.com", "subscription_state": "Subscribed"}, E.ERR_STATE),
    ({"email": "not-an-email", "subscription_state": "subscribed"}, E.ERR_EMAIL_VALUE.format(value="'not-an-email'")),
    ({"email": ["ann@example.com", 5], "subscription_state": "subscribed"}, E.ERR_EMAIL_VALUE.format(value="5")),
    ({"email": [f"u{i}@example.com" for i in range(51)], "subscription_state": "subscribed"},
     E.ERR_TOO_MANY.format(most=50, count=51)),
    (["ann@example.com"], M.BODY_NOT_OBJECT),
])
def test_status_refusals_write_nothing(ws: Workspace, body: Any, message: str) -> None:
    assert refused(ws.call("POST", E.STATUS, body)) == message
    assert set(states(ws).values()) == {None}
    assert ws.sql("SELECT count(*) FROM email_addresses").rows() == [(0,)]


def test_fifty_addresses_the_same_one_counted_once(ws: Workspace) -> None:
    emails = [f"u{i}@example.com" for i in range(50)]
    post(ws, E.STATUS, {"email": [*emails, "U0@example.com"], "subscription_state": "unsubscribed"})
    assert len(listed(ws, E.UNSUBSCRIBES, **ALL, limit="500")) == 50


# --- GET /email/unsubscribes ---------------------------------------------------------------------------
def test_unsubscribes_come_from_track_status_and_blocklist_with_their_times(ws: Workspace, clock: Clock) -> None:
    track(ws, {"external_id": "c", "email_subscribe": "unsubscribed"})  # day 1, 09:30
    clock.now = DAY1.replace(hour=23, minute=59, second=59)
    # by external ID: propagated to every holder of ann@, as track does
    track(ws, {"external_id": "a", "email_subscribe": "unsubscribed"})
    clock.days(1)
    post(ws, E.BLOCKLIST, {"email": "bl@example.com"})
    assert listed(ws, E.UNSUBSCRIBES) == [  # newest first
        ("bl@example.com", "2026-03-02 23:59:59 +0000"), ("ann@example.com", "2026-03-01 23:59:59 +0000"),
        ("cy@example.com", "2026-03-01 09:30:00 +0000")]
    assert listed(ws, E.UNSUBSCRIBES, **ALL, sort_direction="asc")[0][0] == "cy@example.com"
    # a day runs from its midnight (UTC) to the next: end_date's own day is left out
    assert [e for e, _ in listed(ws, E.UNSUBSCRIBES, start_date="2026-03-01", end_date="2026-03-02")] == [
        "ann@example.com", "cy@example.com"]
    assert listed(ws, E.UNSUBSCRIBES, start_date="2026-03-02", end_date="2026-03-02") == []
    assert [e for e, _ in listed(ws, E.UNSUBSCRIBES, start_date="2026-03-02", end_date="2026-03-03")] == [
        "bl@example.com"]
    # one address, whatever the dates; normalized as track normalizes it
    assert listed(ws, E.UNSUBSCRIBES, email="ANN@example.com ") == [("ann@example.com", "2026-03-01 23:59:59 +0000")]
    assert listed(ws, E.UNSUBSCRIBES, email="nobody@example.com", start_date="2020-01-01") == []
    # paged by limit and offset, as the hosted reference tells clients to page
    assert [e for e, _ in listed(ws, E.UNSUBSCRIBES, **ALL, limit="2")] == ["bl@example.com", "ann@example.com"]
    assert [e for e, _ in listed(ws, E.UNSUBSCRIBES, **ALL, limit=2, offset=2)] == ["cy@example.com"]
    assert listed(ws, E.UNSUBSCRIBES, **ALL, offset="3") == []


def test_an_address_is_listed_while_any_holder_is_unsubscribed_since_the_last_one(ws: Workspace, clock: Clock) -> None:
    # by alias: no propagation, the alias user alone unsubscribes
    track(ws, {"user_alias": {"alias_name": "al", "alias_label": "crm"}, "email_subscribe": "unsubscribed"})
    clock.days(1)
    track(ws, {"external_id": "b", "email": "ann@example.com", "email_subscribe": "subscribed"})  # by ID: everyone
    assert listed(ws, E.UNSUBSCRIBES) == []
    track(ws, {"external_id": "c", "email_subscribe": "unsubscribed"})
    clock.days(1)
    # already unsubscribed: its time stays that of the change
    track(ws, {"external_id": "c", "email_subscribe": "unsubscribed", "first_name": "Cy"})
    assert listed(ws, E.UNSUBSCRIBES) == [("cy@example.com", "2026-03-02 09:30:00 +0000")]
    # an address's own state counts only while nobody holds it
    post(ws, E.STATUS, {"email": "cy@example.com", "subscription_state": "unsubscribed"})
    track(ws, {"external_id": "c", "email_subscribe": "opted_in"})
    assert listed(ws, E.UNSUBSCRIBES) == []


@pytest.mark.parametrize(("query", "message"), [
    ({}, E.ERR_RANGE),
    ({"start_date": "2026-01-01"}, E.ERR_RANGE),
    ({"end_date": "2026-01-01"}, E.ERR_RANGE),
    ({"start_date": "2026-02-01", "end_date": "2026-01-01"}, E.ERR_ORDER),
    ({"start_date": "2026/01/01", "end_date": "2026-02-01"}, E.ERR_DATE.format(name="start_date")),
    ({"start_date": "2026-01-01", "end_date": "20260201"}, E.ERR_DATE.format(name="end_date")),
    ({"start_date": "2026-01-01", "end_date": "2026-02-30"}, E.ERR_DATE.format(name="end_date")),
    ({**ALL, "limit": "501"}, E.ERR_LIMIT.format(most=500)),
    ({**ALL, "limit": "0"}, E.ERR_LIMIT.format(most=500)),
    ({**ALL, "offset": "-1"}, E.ERR_OFFSET),
    ({**ALL, "sort_direction": "up"}, E.ERR_SORT),
    ({"email": "nope"}, E.ERR_EMAIL_VALUE.format(value="'nope'")),
])
def test_unsubscribes_refusals(ws: Workspace, query: dict[str, Any], message: str) -> None:
    assert refused(ws.call("GET", E.UNSUBSCRIBES, query=query)) == message


# --- blocklist, hard bounces, spam ----------------------------------------------------------------------
def test_blocklist_unsubscribes_and_bounces_and_bounce_remove_takes_it_off(ws: Workspace, clock: Clock) -> None:
    post(ws, E.BLOCKLIST, {"email": ["ann@example.com", "lone@example.com"]})
    assert states(ws) == {"a": "unsubscribed", "b": "unsubscribed", "c": None, "alias": "unsubscribed"}
    first = "2026-03-01T09:30:00.000Z"
    assert listed(ws, E.HARD_BOUNCES) == [("ann@example.com", first), ("lone@example.com", first)]
    clock.days(1)
    post(ws, E.BLOCKLIST, {"email": "ann@example.com"})  # bounced already: since the first time
    post(ws, E.BLOCKLIST, {"email": "cy@example.com"})
    assert listed(ws, E.HARD_BOUNCES) == [("cy@example.com", "2026-03-02T09:30:00.000Z"),
                                          ("ann@example.com", first), ("lone@example.com", first)]
    assert listed(ws, E.HARD_BOUNCES, email="Lone@example.com") == [("lone@example.com", first)]
    assert listed(ws, E.HARD_BOUNCES, start_date="2026-03-02", end_date="2026-03-03") == [
        ("cy@example.com", "2026-03-02T09:30:00.000Z")]
    post(ws, E.BOUNCE_REMOVE, {"email": ["ann@example.com", "never@example.com"]})
    assert [e for e, _ in listed(ws, E.HARD_BOUNCES)] == ["cy@example.com", "lone@example.com"]
    # off the bounce list, still unsubscribed
    assert "ann@example.com" in [e for e, _ in listed(ws, E.UNSUBSCRIBES)]
    # spam: the store receives no ESP reports, so its list holds nothing; removing is accepted
    post(ws, E.SPAM_REMOVE, {"email": "ann@example.com"})
    assert refused(ws.call("POST", E.SPAM_REMOVE, {"email": "x"})) == E.ERR_EMAIL_VALUE.format(value="'x'")
    assert refused(ws.call("GET", E.HARD_BOUNCES, query={"end_date": "2026-01-01"})) == E.ERR_RANGE
    # an address with nothing left to say leaves the table
    post(ws, E.BOUNCE_REMOVE, {"email": "lone@example.com"})
    post(ws, E.STATUS, {"email": "lone@example.com", "subscription_state": "subscribed"})
    assert ("lone@example.com", "subscribed") in ws.sql("SELECT email, state FROM email_addresses").rows()


def test_a_deleted_user_leaves_the_lists(ws: Workspace) -> None:
    post(ws, E.BLOCKLIST, {"email": ["cy@example.com", "ann@example.com"]})
    r = ws.call("POST", "/users/delete", {"external_ids": ["c", "a"]})
    assert r.body == {"deleted": 2, "message": "success"}
    # cy@ had one holder: gone from every list; ann@ is held by b and the alias user still
    assert [e for e, _ in listed(ws, E.UNSUBSCRIBES)] == ["ann@example.com"]
    assert [e for e, _ in listed(ws, E.HARD_BOUNCES)] == ["ann@example.com"]
    assert ws.sql("SELECT email FROM email_addresses").rows() == [("ann@example.com",)]


def test_apply_of_a_batch_equals_calling_its_requests_one_by_one(tmp_path: Path) -> None:
    requests = [
        {"method": "POST", "path": "/users/track", "body": {"attributes": [
            {"external_id": "a", "email": "ann@example.com"}, {"external_id": "b", "email": "bo@example.com"}]}},
        {"method": "POST", "path": E.STATUS, "body": {"email": "ann@example.com", "subscription_state": "unsubscribed"}},
        {"method": "GET", "path": E.UNSUBSCRIBES, "query": ALL},
        {"method": "POST", "path": E.BLOCKLIST, "body": {"email": ["bo@example.com", "x@example.com"]}},
        {"method": "POST", "path": E.STATUS, "body": {"email": "bad", "subscription_state": "unsubscribed"}},
        {"method": "POST", "path": "/users/track", "body": {"attributes": [
            {"external_id": "a", "email_subscribe": "subscribed"}]}},
        {"method": "POST", "path": E.BOUNCE_REMOVE, "body": {"email": "x@example.com"}},
        {"method": "POST", "path": "/users/delete", "body": {"external_ids": ["b"]}},
        {"method": "GET", "path": E.UNSUBSCRIBES, "query": ALL},
        {"method": "GET", "path": E.HARD_BOUNCES, "query": ALL},
    ]
    batched = Workspace.open(tmp_path / "batched", clock=lambda: DAY1, seed="s")
    one_by_one = Workspace.open(tmp_path / "sequential", clock=lambda: DAY1, seed="s")
    answers = [(r.status, r.body) for r in batched.apply(requests)]
    assert answers == [(r.status, r.body) for r in (one_by_one.call(q["method"], q["path"], q.get("body"), q.get("query"))
                                                    for q in requests)]
    assert answers[2][1]["emails"] == [{"email": "ann@example.com", "unsubscribed_at": "2026-03-01 09:30:00 +0000"}]
    assert answers[4][0] == 400
    assert answers[8][1]["emails"] == [{"email": "x@example.com", "unsubscribed_at": "2026-03-01 09:30:00 +0000"}]
    assert answers[9][1]["emails"] == []
    query = "SELECT * FROM email_addresses ORDER BY email"
    assert batched.sql(query).rows() == one_by_one.sql(query).rows()
    assert batched.export_users() == one_by_one.export_users()


# --- over HTTP, the library --------------------------------------------------------------------------
def test_over_http_with_each_permission_and_the_shared_limit(ws: Workspace) -> None:
    permissions = {E.STATUS: "email.status", E.BLOCKLIST: "email.blacklist", E.BOUNCE_REMOVE: "email.bounce.remove",
                   E.SPAM_REMOVE: "email.spam.remove", E.UNSUBSCRIBES: "email.unsubscribe",
                   E.HARD_BOUNCES: "email.hard_bounces"}
    key = ws.credentials.create_key("emails", sorted(set(permissions.values())))
    tracker = ws.credentials.create_key("tracker", ["users.track"])
    with served(ws) as client:
        calls = [("POST", E.STATUS, {"email": "ann@example.com", "subscription_state": "unsubscribed"}, None),
                 ("POST", E.BLOCKLIST, {"email": ["cy@example.com"]}, None),
                 ("POST", E.SPAM_REMOVE, {"email": "cy@example.com"}, None),
                 ("GET", E.UNSUBSCRIBES, None, {**ALL, "limit": "500", "offset": "0", "sort_direction": "desc"}),
                 ("GET", E.HARD_BOUNCES, None, ALL),
                 ("POST", E.BOUNCE_REMOVE, {"email": "cy@example.com"}, None),
                 ("GET", E.HARD_BOUNCES, None, {"email": "cy@example.com"}),
                 ("GET", E.UNSUBSCRIBES, None, {"start_date": "2026-01-01"})]
        for method, path, body, query in calls:
            got = send(client, method, path, body, bearer(key), query)
            assert got.headers["X-RateLimit-Limit"] == "250000"
            if method == "GET":  # a read answers alike from the served store
                want = ws.call(method, path, body, query)
                assert (got.status_code, got.json()) == (want.status, want.body), path
            else:
                assert (got.status_code, got.json()) == (201, {"message": "success"}), path
        assert [e for e, _ in listed(ws, E.UNSUBSCRIBES)] == ["ann@example.com", "cy@example.com"]
        for path, permission in permissions.items():
            method = "GET" if path in (E.UNSUBSCRIBES, E.HARD_BOUNCES) else "POST"
            lacking = send(client, method, path, None if method == "GET" else {}, bearer(tracker), ALL)
            assert (lacking.status_code, lacking.json()) == (401, {
                "message": f"Invalid API key: key 'tracker' lacks the permission {permission!r} "
                           f"that {method} {path} needs"})


def test_the_library_pages_through_every_list(ws: Workspace) -> None:
    emails = [f"u{i:03}@example.com" for i in range(520)]
    for start in range(0, 520, 50):
        ws.emails.set_status(emails[start:start + 50], "unsubscribed")
    ws.emails.blocklist(["ann@example.com"])
    got = ws.emails.unsubscribes("2026-01-01", "2027-01-01", sort_direction="asc")
    assert len(got) == 521 and {e["email"] for e in got} == {*emails, "ann@example.com"}
    assert ws.emails.hard_bounces(email="ann@example.com") == [
        {"email": "ann@example.com", "hard_bounced_at": "2026-03-01T09:30:00.000Z"}]
    ws.emails.remove_bounces(["ann@example.com"])
    ws.emails.remove_spam(["ann@example.com"])
    assert ws.emails.hard_bounces("2026-01-01", "2027-01-01") == []
    from engagelake.errors import RequestError
    with pytest.raises(RequestError, match="invalid subscription_state"):
        ws.emails.set_status(["ann@example.com"], "maybe")


def test_the_cli_sets_and_lists(ws: Workspace, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from engagelake.cli import app

    ws.close()
    store, runner = str(tmp_path / "s"), CliRunner()
    done = runner.invoke(app, ["emails", "status", "--store", store, "--state", "unsubscribed", "--email", "ann@example.com"])
    assert done.exit_code == 0 and done.stdout.splitlines() == ["ann@example.com\tunsubscribed"], done.output
    done = runner.invoke(app, ["emails", "blocklist", "--store", store, "--email", "cy@example.com"])
    assert done.exit_code == 0 and done.stdout.splitlines() == ["cy@example.com\tblocklisted"], done.output
    # the clock is the machine's here: a range around today
    today = datetime.now(UTC).date()
    start, end = (today - timedelta(days=1)).isoformat(), (today + timedelta(days=1)).isoformat()
    printed = runner.invoke(app, ["emails", "unsubscribes", "--store", store, "--start", start, "--end", end])
    assert printed.exit_code == 0 and sorted(line.split("\t")[0] for line in printed.stdout.splitlines()) == [
        "ann@example.com", "cy@example.com"]
    printed = runner.invoke(app, ["emails", "hard-bounces", "--store", store, "--email", "CY@example.com"])
    assert printed.exit_code == 0 and [line.split("\t")[0] for line in printed.stdout.splitlines()] == ["cy@example.com"]
    refused = runner.invoke(app, ["emails", "unsubscribes", "--store", store, "--start", start])
    assert refused.exit_code == 1 and "give --start and --end" in refused.stderr
    refused = runner.invoke(app, ["emails", "status", "--store", store, "--state", "gone", "--email", "a@b.co"])
    assert refused.exit_code == 1 and "invalid subscription_state" in refused.stderr


def test_a_user_taking_an_address_takes_its_state(ws: Workspace, clock: Clock) -> None:
    post(ws, E.STATUS, {"email": "lone@example.com", "subscription_state": "unsubscribed"})
    post(ws, E.STATUS, {"email": "opt@example.com", "subscription_state": "opted_in"})
    clock.days(1)
    track(ws, {"external_id": "n1", "email": "Lone@example.com"},  # a new user with the address
          {"external_id": "c", "email": "lone@example.com", "first_name": "Cy"},  # an existing one changing to it
          {"external_id": "a", "email": "opt@example.com", "email_subscribe": "subscribed"})  # its own value wins
    got = {u.get("external_id"): u.get("email_subscribe") for u in ws.export_users(["external_id", "email_subscribe"])}
    assert (got["n1"], got["c"], got["a"], got["b"]) == ("unsubscribed", "unsubscribed", "subscribed", None)
    # both hold it now: the address answers by its users, since they took it
    assert listed(ws, E.UNSUBSCRIBES) == [("lone@example.com", "2026-03-02 09:30:00 +0000")]
    # an object that leaves the address as it was changes nothing
    track(ws, {"external_id": "n1", "email_subscribe": "subscribed"}, {"external_id": "n1", "email": "lone@example.com"})
    # created by an email identifier (an event for an address nobody holds yet)
    r = ws.call("POST", "/users/track", {"events": [{"email": "opt@example.com", "name": "open", "time": "2026-03-02T00:00:00Z"}]})
    assert r.status == 201, r
    got = {u.get("external_id") or u.get("email"): u.get("email_subscribe")
           for u in ws.export_users(["external_id", "email", "email_subscribe"])}
    assert got["n1"] == "subscribed" and got["a"] == "subscribed"
    # the event named a's address: no one new, a keeps its own state
    post(ws, E.STATUS, {"email": "fresh@example.com", "subscription_state": "opted_in"})
    r = ws.call("POST", "/users/track", {"events": [{"email": "fresh@example.com", "name": "open", "time": "2026-03-02T00:00:00Z"}]})
    assert r.status == 201, r
    new = [u for u in ws.export_users(["external_id", "email", "email_subscribe"]) if u.get("email") == "fresh@example.com"]
    assert [u.get("email_subscribe") for u in new] == ["opted_in"]
