"""POST /subscription/status/set and POST /v2/subscription/status/set (issue 53): through
`Workspace.call`/`apply`, over HTTP, and as `ws.subscriptions.set`; the states read back with
`GET /subscription/status/get` and export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.test_api_server import bearer, send, served

from engagelake import Response, Workspace
from engagelake.resources import subscription_writes as W
from engagelake.rules import messages as M

SET, SET_V2, STATUS = W.STATUS_SET, W.STATUS_SET_V2, "/subscription/status/get"
E = "same@example.com"


def track(ws: Workspace, *attributes: dict[str, Any]) -> None:
    r = ws.call("POST", "/users/track", {"attributes": list(attributes)})
    assert r.status == 201 and "errors" not in r.body, r


def status(ws: Workspace, gid: str, **query: Any) -> dict[str, str]:
    r = ws.call("GET", STATUS, query={"subscription_group_id": gid, **query})
    assert r.status == 200, r
    got: dict[str, str] = r.body["status"]
    return got


def set_state(ws: Workspace, gid: str, state: str, **users: Any) -> None:
    r = ws.call("POST", SET, {"subscription_group_id": gid, "subscription_state": state, **users})
    assert (r.status, r.body) == (201, {"message": "success"}), r


def users_in_store(ws: Workspace) -> int:
    return len(ws.export_users(["external_id"]))


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    """x1 and x2 share E (x2 with other casing); a1 is an alias user with E; p has a phone."""
    ws = Workspace.open(tmp_path / "s")
    track(ws, {"external_id": "x1", "email": E}, {"external_id": "x2", "email": "Same@Example.com"},
          {"user_alias": {"alias_name": "a1", "alias_label": "crm"}, "_update_existing_only": False, "email": E},
          {"external_id": "p", "phone": "+1 (555) 111-2222"}, {"external_id": "quiet", "email": "quiet@example.com"})
    return ws


# --- v1 -------------------------------------------------------------------------------------------
def test_by_external_id_as_track_does_with_same_email_propagation(ws: Workspace) -> None:
    set_state(ws, "g1", "subscribed", external_id="x1")
    # as /users/track by x1: the state reaches x2 and the alias user, who hold the same email
    assert status(ws, "g1", external_id="x1,x2,quiet,p") == {
        "x1": "Subscribed", "x2": "Subscribed", "quiet": "Unknown", "p": "Unknown"}
    assert status(ws, "g1", email=E) == {E: "Subscribed"}
    set_state(ws, "g1", "unsubscribed", external_id=["x2"])
    assert status(ws, "g1", external_id="x1,x2") == {"x1": "Unsubscribed", "x2": "Unsubscribed"}
    # a text alone is one ID, never split at commas
    before = users_in_store(ws)
    set_state(ws, "g1", "subscribed", external_id="x1,x2")
    assert status(ws, "g1", external_id="x1") == {"x1": "Unsubscribed"}
    assert users_in_store(ws) == before


def test_the_state_is_written_by_the_track_rules(ws: Workspace) -> None:
    """The same row track writes: one state per user and group, with its time and counter."""
    track(ws, {"external_id": "quiet", "subscription_groups": [
        {"subscription_group_id": "g1", "subscription_state": "subscribed"}]})
    rows = ws.sql("SELECT service_id, group_id, state FROM subscriptions ORDER BY group_id").rows()
    set_state(ws, "g1", "unsubscribed", external_id="quiet")
    after = ws.sql("SELECT service_id, group_id, state FROM subscriptions ORDER BY group_id").rows()
    assert [(g, s) for _, g, s in rows] == [("g1", "subscribed")]
    assert after == [(rows[0][0], "g1", "unsubscribed")]


def test_by_email_names_every_holder_and_by_phone_its_holder(ws: Workspace) -> None:
    set_state(ws, "g1", "subscribed", email="SAME@example.com ")  # normalized as in track
    assert status(ws, "g1", external_id="x1,x2,quiet") == {"x1": "Subscribed", "x2": "Subscribed", "quiet": "Unknown"}
    # the alias user holds it too
    set_state(ws, "g1", "unsubscribed", email=[E])
    assert status(ws, "g1", email=E) == {E: "Unsubscribed"}
    assert status(ws, "g1", external_id="x1") == {"x1": "Unsubscribed"}
    set_state(ws, "sms", "subscribed", phone="+15551112222", use_double_opt_in_logic=True)  # no SMS: no workflow
    assert status(ws, "sms", external_id="p,x1") == {"p": "Subscribed", "x1": "Unknown"}
    # external IDs and an email together: the users of both, each once
    set_state(ws, "g2", "subscribed", external_id=["quiet", "p"], email="same@example.com")
    assert status(ws, "g2", external_id="x1,x2,quiet,p") == dict.fromkeys(["x1", "x2", "quiet", "p"], "Subscribed")


def test_unknown_deleted_and_merged_users_are_not_created(ws: Workspace) -> None:
    before = users_in_store(ws)
    set_state(ws, "g1", "subscribed", external_id=["ghost", "quiet"], email=["nobody@example.com", "not-an-email"])
    assert users_in_store(ws) == before
    assert status(ws, "g1", external_id="ghost,quiet") == {"ghost": "Unknown", "quiet": "Subscribed"}
    assert ws.call("POST", "/users/delete", {"external_ids": ["quiet"]}).body == {"deleted": 1, "message": "success"}
    set_state(ws, "g2", "subscribed", external_id="quiet")
    assert users_in_store(ws) == before - 1
    track(ws, {"external_id": "keep"})
    r = ws.call("POST", "/users/merge", {"merge_updates": [{"identifier_to_merge": {"external_id": "p"},
                                                           "identifier_to_keep": {"external_id": "keep"}}]})
    assert r.status == 202, r
    set_state(ws, "g3", "subscribed", external_id="p")  # merged away: names no one
    assert status(ws, "g3", external_id="p,keep") == {"p": "Unknown", "keep": "Unknown"}


def test_a_renamed_external_id_writes_to_its_user(ws: Workspace) -> None:
    r = ws.call("POST", "/users/external_ids/rename",
                {"external_id_renames": [{"current_external_id": "p", "new_external_id": "p-new"}]})
    assert r.status == 200, r
    set_state(ws, "g1", "subscribed", external_id="p")  # the deprecated ID names the user still
    assert status(ws, "g1", external_id="p-new") == {"p-new": "Subscribed"}
    assert users_in_store(ws) == 5


def test_fifty_of_each_kind(ws: Workspace) -> None:
    ids = [f"u{i}" for i in range(50)]
    track(ws, *({"external_id": i} for i in ids))
    set_state(ws, "g1", "subscribed", external_id=ids, email=[f"n{i}@example.com" for i in range(50)])
    assert status(ws, "g1", external_id=ids) == dict.fromkeys(ids, "Subscribed")
    # more than the 75 one track request takes: written in several
    holders = [f"h{i}" for i in range(80)]
    track(ws, *({"external_id": h, "email": "shared@example.com"} for h in holders[:40]))
    track(ws, *({"external_id": h, "email": "shared@example.com"} for h in holders[40:]))
    set_state(ws, "g2", "subscribed", email="shared@example.com")
    assert status(ws, "g2", external_id=holders[:50]) == dict.fromkeys(holders[:50], "Subscribed")
    assert status(ws, "g2", external_id=holders[50:]) == dict.fromkeys(holders[50:], "Subscribed")


def refused(r: Response) -> str:
    assert r.status == 400 and set(r.body) == {"message"}, r
    message: str = r.body["message"]
    return message


OK = {"subscription_group_id": "g1", "subscription_state": "subscribed"}


@pytest.mark.parametrize(("body", "message"), [
    ({"subscription_state": "subscribed", "external_id": "x1"}, W.ERR_GROUP.format(where="")),
    ({**OK, "subscription_group_id": " ", "external_id": "x1"}, W.ERR_GROUP.format(where="")),
    ({**OK, "subscription_group_id": 7, "external_id": "x1"}, W.ERR_GROUP.format(where="")),
    ({**OK, "subscription_state": "Subscribed", "external_id": "x1"}, W.ERR_STATE.format(where="")),
    ({**OK, "subscription_state": "opted_in", "external_id": "x1"}, W.ERR_STATE.format(where="")),
    ({"subscription_group_id": "g1", "external_id": "x1"}, W.ERR_STATE.format(where="")),
    (OK, W.ERR_NO_USER.format(where="", fields="external_id, email, phone")),
    ({**OK, "external_id": []}, W.ERR_NO_USER.format(where="", fields="external_id, email, phone")),
    ({**OK, "email": E, "phone": "+15551112222"}, W.ERR_EMAIL_AND_PHONE),
    ({**OK, "external_id": ""}, W.ERR_VALUES.format(where="", field="external_id")),
    ({**OK, "external_id": ["x1", None]}, W.ERR_VALUES.format(where="", field="external_id")),
    ({**OK, "email": 5}, W.ERR_VALUES.format(where="", field="email")),
    ({**OK, "phone": [{"n": 1}]}, W.ERR_VALUES.format(where="", field="phone")),
    ({**OK, "external_id": [f"u{i}" for i in range(51)]},
     W.ERR_TOO_MANY.format(where="", field="external_id", most=50, count=51)),
    ({**OK, "external_id": "x1", "use_double_opt_in_logic": "yes"}, W.ERR_DOUBLE_OPT_IN.format(where="")),
    ([OK], M.BODY_NOT_OBJECT),
])
def test_v1_refusals_write_nothing(ws: Workspace, body: Any, message: str) -> None:
    before = ws.sql("SELECT count(*) FROM subscriptions").rows()
    assert refused(ws.call("POST", SET, body)) == message
    assert ws.sql("SELECT count(*) FROM subscriptions").rows() == before


# --- v2 -------------------------------------------------------------------------------------------
def entry(gid: str, state: str, **users: Any) -> dict[str, Any]:
    return {"subscription_group_id": gid, "subscription_state": state, **users}


def test_v2_sets_several_groups_in_order(ws: Workspace) -> None:
    r = ws.call("POST", SET_V2, {"subscription_groups": [
        entry("g1", "subscribed", external_ids=["x1"]),
        entry("sms", "subscribed", phones=["+15551112222"]),
        entry("g2", "unsubscribed", emails=["quiet@example.com"], external_ids=["p"]),
        entry("g1", "unsubscribed", external_ids=["x2"]),  # later: wins for x1 and x2 by propagation
    ]})
    assert (r.status, r.body) == (201, {"message": "success"}), r
    assert status(ws, "g1", external_id="x1,x2") == {"x1": "Unsubscribed", "x2": "Unsubscribed"}
    assert status(ws, "sms", external_id="p") == {"p": "Subscribed"}
    assert status(ws, "g2", external_id="quiet,p,x1") == {"quiet": "Unsubscribed", "p": "Unsubscribed", "x1": "Unknown"}


def test_v2_checks_every_entry_before_writing_any(ws: Workspace) -> None:
    body = {"subscription_groups": [entry("g1", "subscribed", external_ids=["x1"]),
                                    entry("g2", "subscribed", emails=[E], phones=["+15551112222"])]}
    assert refused(ws.call("POST", SET_V2, body)) == W.ERR_EMAIL_AND_PHONE
    body = {"subscription_groups": [entry("g1", "subscribed", external_ids=["x1"]), entry("g2", "maybe", external_ids=["x1"])]}
    assert refused(ws.call("POST", SET_V2, body)) == W.ERR_STATE.format(where="subscription_groups[1]: ")
    assert status(ws, "g1", external_id="x1") == {"x1": "Unknown"}


@pytest.mark.parametrize(("body", "message"), [
    ({}, W.ERR_ENTRIES.format(most=50)),
    ({"subscription_groups": []}, W.ERR_ENTRIES.format(most=50)),
    ({"subscription_groups": {"subscription_group_id": "g1"}}, W.ERR_ENTRIES.format(most=50)),
    ({"subscription_groups": [entry("g1", "subscribed", external_ids=["x1"])] * 51}, W.ERR_ENTRIES.format(most=50)),
    ({"subscription_groups": ["g1"]}, W.ERR_ENTRY.format(index=0)),
    ({"subscription_groups": [entry("g1", "subscribed", external_id=["x1"])]},  # v1's field name
     W.ERR_NO_USER.format(where="subscription_groups[0]: ", fields="external_ids, emails, phones")),
    ({"subscription_groups": [entry("g1", "subscribed", emails=[""])]},
     W.ERR_VALUES.format(where="subscription_groups[0]: ", field="emails")),
    ({"subscription_groups": [entry("", "subscribed", emails=[E])]}, W.ERR_GROUP.format(where="subscription_groups[0]: ")),
])
def test_v2_refusals(ws: Workspace, body: Any, message: str) -> None:
    assert refused(ws.call("POST", SET_V2, body)) == message


# --- a batch, over HTTP, the library, the CLI -------------------------------------------------------
def test_apply_of_a_batch_equals_calling_its_requests_one_by_one(tmp_path: Path) -> None:
    requests = [
        {"method": "POST", "path": "/users/track", "body": {"attributes": [{"external_id": "a", "email": E},
                                                                            {"external_id": "b", "email": E}]}},
        {"method": "POST", "path": SET, "body": entry("g1", "subscribed", external_id="a")},
        {"method": "GET", "path": STATUS, "query": {"subscription_group_id": "g1", "external_id": "a,b"}},
        {"method": "POST", "path": SET_V2, "body": {"subscription_groups": [entry("g1", "unsubscribed", emails=[E]),
                                                                            entry("g2", "subscribed", external_ids=["b"])]}},
        {"method": "POST", "path": SET, "body": entry("g1", "subscribed")},  # refused, in the middle
        {"method": "POST", "path": "/users/track", "body": {"attributes": [{"external_id": "c", "email": E}]}},
        {"method": "POST", "path": SET, "body": entry("g3", "subscribed", email=E)},
        {"method": "GET", "path": STATUS, "query": {"subscription_group_id": "g1", "external_id": "a,b,c"}},
    ]
    batched, one_by_one = Workspace.open(tmp_path / "batched"), Workspace.open(tmp_path / "sequential")
    answers = [(r.status, r.body) for r in batched.apply(requests)]
    assert answers == [(r.status, r.body) for r in (one_by_one.call(q["method"], q["path"], q.get("body"), q.get("query"))
                                                    for q in requests)]
    assert answers[2][1]["status"] == {"a": "Subscribed", "b": "Subscribed"}
    assert answers[4][0] == 400 and answers[7][1]["status"] == {"a": "Unsubscribed", "b": "Unsubscribed", "c": "Unknown"}
    query = "SELECT e.external_id, s.group_id, s.state FROM subscriptions s JOIN profiles e USING (service_id) ORDER BY 1, 2"
    assert batched.sql(query).rows() == one_by_one.sql(query).rows()


def test_over_http_with_its_permission_and_limit(ws: Workspace) -> None:
    setter = ws.credentials.create_key("setter", ["subscription.status.set"])
    reader = ws.credentials.create_key("reader", ["subscription.status.get"])
    with served(ws) as client:
        got = send(client, "POST", SET, entry("g1", "subscribed", external_id="x1"), bearer(setter))
        assert (got.status_code, got.json()) == (201, {"message": "success"})
        assert got.headers["X-RateLimit-Limit"] == "5000"
        got = send(client, "POST", SET_V2, {"subscription_groups": [entry("g2", "subscribed", phones=["+15551112222"])]},
                   bearer(setter))
        assert (got.status_code, got.json()) == (201, {"message": "success"})
        assert got.headers["X-RateLimit-Limit"] == "5000"
        bad = send(client, "POST", SET, entry("g1", "subscribed"), bearer(setter))
        assert (bad.status_code, bad.json()) == (400, {"message": W.ERR_NO_USER.format(
            where="", fields="external_id, email, phone")})
        for path in (SET, SET_V2):
            lacking = send(client, "POST", path, entry("g1", "subscribed", external_id="x1"), bearer(reader))
            assert (lacking.status_code, lacking.json()) == (401, {
                "message": f"Invalid API key: key 'reader' lacks the permission 'subscription.status.set' "
                           f"that POST {path} needs"})
        assert send(client, "GET", SET, None, bearer(setter)).status_code == 405
    assert status(ws, "g1", external_id="x1,x2") == {"x1": "Subscribed", "x2": "Subscribed"}
    assert status(ws, "g2", external_id="p") == {"p": "Subscribed"}


def test_the_library_and_the_cli_set_as_the_endpoints(ws: Workspace, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from engagelake.cli import app
    from engagelake.errors import RequestError

    ws.subscriptions.set("g1", "subscribed", external_ids=["x1"])
    ws.subscriptions.set_many([entry("g2", "subscribed", phones=["+15551112222"]),
                               entry("g1", "unsubscribed", emails=["quiet@example.com"])])
    assert status(ws, "g1", external_id="x2,quiet") == {"x2": "Subscribed", "quiet": "Unsubscribed"}
    assert status(ws, "g2", external_id="p") == {"p": "Subscribed"}
    with pytest.raises(RequestError, match="invalid subscription_state"):
        ws.subscriptions.set("g1", "yes", external_ids=["x1"])
    with pytest.raises(RequestError, match="give at least one user"):
        ws.subscriptions.set("g1", "subscribed")
    ws.close()
    store = str(tmp_path / "s")
    runner = CliRunner()
    done = runner.invoke(app, ["subscriptions", "set", "--store", store, "--group", "g3", "--state", "subscribed",
                               "--email", E, "--external-id", "p"])
    assert done.exit_code == 0 and done.stdout.splitlines() == ["g3: subscribed"], done.output
    printed = runner.invoke(app, ["subscriptions", "status", "--store", store, "--group", "g3",
                                  "--external-id", "x2", "--external-id", "p", "--external-id", "quiet"])
    assert printed.stdout.splitlines() == ["x2\tSubscribed", "p\tSubscribed", "quiet\tUnknown"]
    bad = runner.invoke(app, ["subscriptions", "set", "--store", store, "--group", "g3", "--state", "on",
                              "--external-id", "p"])
    assert bad.exit_code == 1 and "invalid subscription_state" in bad.stderr
    none = runner.invoke(app, ["subscriptions", "set", "--store", store, "--group", "g3", "--state", "subscribed"])
    assert none.exit_code == 1 and "give at least one user" in none.stderr
