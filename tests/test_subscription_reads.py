"""GET /subscription/status/get and GET /subscription/user/status (issue 53): through
`Workspace.call` and over HTTP, with the states `/users/track` writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.test_api_server import bearer, send, served

from engagelake import Response, Workspace
from engagelake.resources import subscriptions as S

STATUS = "/subscription/status/get"
GROUPS = "/subscription/user/status"
E = "same@example.com"


def group(gid: str, state: str) -> dict[str, str]:
    return {"subscription_group_id": gid, "subscription_state": state}


def track(ws: Workspace, *attributes: dict[str, Any]) -> None:
    r = ws.call("POST", "/users/track", {"attributes": list(attributes)})
    assert r.status == 201 and "errors" not in r.body, r


def status(ws: Workspace, gid: str, **query: Any) -> dict[str, str]:
    r = ws.call("GET", STATUS, query={"subscription_group_id": gid, **query})
    assert r.status == 200 and r.body["message"] == "success", r
    assert set(r.body) == {"status", "message"}
    got: dict[str, str] = r.body["status"]
    return got


def groups_of(ws: Workspace, **query: Any) -> list[dict[str, Any]]:
    r = ws.call("GET", GROUPS, query=query)
    assert r.status == 200 and r.body["message"] == "success" and r.body["success"] is True, r
    users: list[dict[str, Any]] = r.body["users"]
    return users


def states(user: dict[str, Any]) -> dict[str, str]:
    return {g["subscription_group_id"]: g["subscription_status"] for g in user["subscription_groups"]}


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    """x1 and x2 share E (x2 with other casing); a1 is an alias user with E; p has a phone."""
    ws = Workspace.open(tmp_path / "s")
    track(ws, {"external_id": "x1", "email": E}, {"external_id": "x2", "email": "Same@Example.com"},
          {"user_alias": {"alias_name": "a1", "alias_label": "crm"}, "_update_existing_only": False, "email": E},
          {"external_id": "p", "phone": "+1 (555) 111-2222"}, {"external_id": "quiet", "email": "quiet@example.com"})
    return ws


# --- GET /subscription/status/get -------------------------------------------------------------------
def test_status_follows_track_and_same_email_propagation(ws: Workspace) -> None:
    assert status(ws, "g1", external_id="x1") == {"x1": "Unknown"}
    track(ws, {"external_id": "x1", "subscription_groups": [group("g1", "subscribed"), group("g2", "unsubscribed")]})
    # x1 wrote it; x2 and the alias user hold the same email: it reached them too
    assert status(ws, "g1", external_id=["x1", "x2", "quiet", "ghost"]) == {
        "x1": "Subscribed", "x2": "Subscribed", "quiet": "Unknown", "ghost": "Unknown"}
    assert status(ws, "g2", external_id="x1,x2") == {"x1": "Unsubscribed", "x2": "Unsubscribed"}
    assert status(ws, "g3", external_id="x1") == {"x1": "Unknown"}  # a group the user never had
    track(ws, {"external_id": "x2", "subscription_groups": [group("g1", "unsubscribed")]})
    assert status(ws, "g1", external_id="x1") == {"x1": "Unsubscribed"}


def test_several_users_repeated_as_the_hosted_api_or_comma_separated(ws: Workspace) -> None:
    track(ws, {"external_id": "x1", "subscription_groups": [group("g1", "subscribed")]},
          {"external_id": "p", "subscription_groups": [group("g1", "unsubscribed")]})
    want = {"p": "Unsubscribed", "x1": "Subscribed", "ghost": "Unknown"}
    assert status(ws, "g1", **{"external_id[]": ["p", "x1", "ghost"]}) == want
    assert status(ws, "g1", external_id=" p , x1,ghost") == want
    assert status(ws, "g1", external_id="p", **{"external_id[]": ["x1", "ghost", "p"]}) == want  # each once
    assert list(status(ws, "g1", external_id="ghost,x1,p")) == ["ghost", "x1", "p"]  # in request order
    assert ws.call("GET", f"{STATUS}?subscription_group_id=g1&external_id=p,x1").body["status"] == {
        "p": "Unsubscribed", "x1": "Subscribed"}


def test_status_by_email_and_phone(ws: Workspace) -> None:
    track(ws, {"external_id": "x1", "subscription_groups": [group("g1", "subscribed")]},
          {"external_id": "p", "subscription_groups": [group("sms", "subscribed")]})
    # normalized as in track, answered under the address as sent
    assert status(ws, "g1", email="SAME@example.com ") == {"SAME@example.com": "Subscribed"}
    assert status(ws, "g1", email="quiet@example.com,nobody@example.com,not-an-email") == {
        "quiet@example.com": "Unknown", "nobody@example.com": "Unknown", "not-an-email": "Unknown"}
    # a phone as its E.164 form: a `+` sent unescaped in a URL reads as a space
    assert status(ws, "sms", phone="+15551112222") == {"+15551112222": "Subscribed"}
    assert status(ws, "sms", phone=" 15551112222") == {"+15551112222": "Subscribed"}
    assert status(ws, "sms", phone="+15550000000") == {"+15550000000": "Unknown"}
    # with external IDs, only they are looked up
    assert status(ws, "sms", external_id="x1", phone="+15551112222", email=E) == {"x1": "Unknown"}


def test_an_address_shared_by_users_who_disagree_is_unsubscribed(ws: Workspace) -> None:
    track(ws, {"external_id": "x1", "subscription_groups": [group("g1", "subscribed")]})
    assert status(ws, "g1", email=E) == {E: "Subscribed"}
    # by alias: no propagation, the alias user alone unsubscribes
    track(ws, {"user_alias": {"alias_name": "a1", "alias_label": "crm"}, "subscription_groups": [group("g1", "unsubscribed")]})
    assert status(ws, "g1", external_id="x1,x2") == {"x1": "Subscribed", "x2": "Subscribed"}
    assert status(ws, "g1", email=E) == {E: "Unsubscribed"}


def test_deleted_and_merged_users_are_unknown(ws: Workspace) -> None:
    track(ws, {"external_id": "x1", "subscription_groups": [group("g1", "subscribed")]},
          {"external_id": "p", "subscription_groups": [group("g1", "subscribed")]})
    assert ws.call("POST", "/users/delete", {"external_ids": ["x1"]}).body == {"deleted": 1, "message": "success"}
    assert status(ws, "g1", external_id="x1,x2") == {"x1": "Unknown", "x2": "Subscribed"}
    assert status(ws, "g1", email=E) == {E: "Subscribed"}  # x2 and the alias user still hold it
    track(ws, {"external_id": "keep"})
    r = ws.call("POST", "/users/merge", {"merge_updates": [{"identifier_to_merge": {"external_id": "p"},
                                                           "identifier_to_keep": {"external_id": "keep"}}]})
    assert r.status == 202, r
    # the merged profile's groups are dropped and its external ID resolves no more
    assert status(ws, "g1", external_id="p,keep") == {"p": "Unknown", "keep": "Unknown"}
    assert status(ws, "g1", phone="+15551112222") == {"+15551112222": "Unknown"}  # the phone moved: no state


def test_a_renamed_external_id_still_answers_under_the_name_asked(ws: Workspace) -> None:
    track(ws, {"external_id": "x1", "subscription_groups": [group("g1", "subscribed")]})
    r = ws.call("POST", "/users/external_ids/rename",
                {"external_id_renames": [{"current_external_id": "x1", "new_external_id": "x1-new"}]})
    assert r.status == 200, r
    assert status(ws, "g1", external_id="x1,x1-new") == {"x1": "Subscribed", "x1-new": "Subscribed"}


def test_a_batch_reads_what_its_earlier_requests_wrote(ws: Workspace) -> None:
    track_g1 = {"method": "POST", "path": "/users/track",
                "body": {"attributes": [{"external_id": "x1", "subscription_groups": [group("g1", "subscribed")]}]}}
    get = {"method": "GET", "path": STATUS, "query": {"subscription_group_id": "g1", "external_id": "x1"}}
    before, _, after = ws.apply([get, track_g1, get])
    assert (before.body["status"], after.body["status"]) == ({"x1": "Unknown"}, {"x1": "Subscribed"})


def refused(r: Response) -> str:
    assert r.status == 400 and set(r.body) == {"message"}, r
    message: str = r.body["message"]
    return message


@pytest.mark.parametrize(("query", "message"), [
    ({"external_id": "x1"}, S.ERR_GROUP),
    ({"subscription_group_id": "", "external_id": "x1"}, S.ERR_GROUP),
    ({"subscription_group_id": 5, "external_id": "x1"}, S.ERR_GROUP),
    ({"subscription_group_id": "g1"}, S.ERR_NO_USER),
    ({"subscription_group_id": "g1", "external_id": []}, S.ERR_NO_USER),
    ({"subscription_group_id": "g1", "email": E, "phone": "+15551112222"}, S.ERR_EMAIL_AND_PHONE),
    ({"subscription_group_id": "g1", "external_id": ""}, S.ERR_VALUE.format(kind="external_id")),
    ({"subscription_group_id": "g1", "external_id": "a,,b"}, S.ERR_VALUE.format(kind="external_id")),
    ({"subscription_group_id": "g1", "external_id": 7}, S.ERR_VALUE.format(kind="external_id")),
    ({"subscription_group_id": "g1", "email": [E, None]}, S.ERR_VALUE.format(kind="email")),
    ({"subscription_group_id": "g1", "external_id": ",".join(f"u{i}" for i in range(51))},
     S.ERR_TOO_MANY.format(kind="external_id", most=50, count=51)),
])
def test_status_refusals(ws: Workspace, query: dict[str, Any], message: str) -> None:
    assert refused(ws.call("GET", STATUS, query=query)) == message


def test_fifty_users_are_allowed(ws: Workspace) -> None:
    ids = [f"u{i}" for i in range(49)] + ["x1"]
    assert status(ws, "g1", external_id=ids) == dict.fromkeys(ids, "Unknown")


# --- GET /subscription/user/status ------------------------------------------------------------------
def test_user_groups_list_the_states_the_user_has(ws: Workspace) -> None:
    assert groups_of(ws, external_id="x1") == [
        {"external_id": "x1", "email": E, "phone": None, "subscription_groups": []}]
    track(ws, {"external_id": "x1", "subscription_groups": [group("g2", "unsubscribed"), group("g1", "subscribed")]})
    assert groups_of(ws, external_id="x1")[0]["subscription_groups"] == [  # by group ID
        {"subscription_group_id": "g1", "subscription_status": "subscribed"},
        {"subscription_group_id": "g2", "subscription_status": "unsubscribed"}]
    # several users, in request order; an unknown one is left out, as export leaves it
    listed = groups_of(ws, external_id=["ghost", "p", "x2"])
    assert [(u["external_id"], states(u)) for u in listed] == [
        ("p", {}), ("x2", {"g1": "subscribed", "g2": "unsubscribed"})]
    assert listed[0]["phone"] == "+15551112222"
    assert groups_of(ws, external_id="ghost") == []


def test_user_groups_by_email_list_every_user_holding_it(ws: Workspace) -> None:
    track(ws, {"external_id": "x1", "subscription_groups": [group("g1", "subscribed")]})
    listed = groups_of(ws, email="same@EXAMPLE.com")
    assert [(u["external_id"], u["email"], states(u)) for u in listed] == [
        ("x1", E, {"g1": "subscribed"}), ("x2", E, {"g1": "subscribed"}), (None, E, {"g1": "subscribed"})]
    # email and phone together: the users of both, each once
    both = groups_of(ws, email=E, phone="+15551112222,+15550000000")
    assert [u["external_id"] for u in both] == ["x1", "x2", None, "p"]
    assert [u["external_id"] for u in groups_of(ws, external_id="p", email=E)] == ["p"]  # external IDs first
    assert [u["external_id"] for u in groups_of(ws, external_id="x1", **{"external_id[]": ["x1"]})] == ["x1"]


def test_user_groups_page_by_limit_and_offset(ws: Workspace) -> None:
    names = [f"g{i:03}" for i in range(120)]
    track(ws, {"external_id": "p", "subscription_groups": [group(g, "subscribed") for g in names]})
    track(ws, {"external_id": "x1", "subscription_groups": [group("g000", "unsubscribed")]})

    def page(**query: Any) -> list[str]:
        (user,) = groups_of(ws, external_id="p", **query)
        return [g["subscription_group_id"] for g in user["subscription_groups"]]

    assert page() == names[:100]  # default limit 100
    assert page(offset="100") == names[100:]
    assert page(limit="7", offset="3") == names[3:10]
    assert page(limit=1, offset=119) == names[119:]
    assert page(offset="500") == []
    # each user's list is paged: x1 has one group
    two = groups_of(ws, external_id="x1,p", limit="2", offset="0")
    assert [(u["external_id"], len(u["subscription_groups"])) for u in two] == [("x1", 1), ("p", 2)]
    assert [states(u) for u in groups_of(ws, external_id="x1,p", limit="2", offset="1")] == [
        {}, {"g001": "subscribed", "g002": "subscribed"}]


def test_user_groups_leave_deleted_users_out(ws: Workspace) -> None:
    track(ws, {"external_id": "x1", "subscription_groups": [group("g1", "subscribed")]})
    assert ws.call("POST", "/users/delete", {"external_ids": ["x2"]}).body == {"deleted": 1, "message": "success"}
    assert [u["external_id"] for u in groups_of(ws, email=E)] == ["x1", None]
    assert groups_of(ws, external_id="x2") == []


@pytest.mark.parametrize(("query", "message"), [
    ({}, S.ERR_NO_USER),
    ({"limit": "10"}, S.ERR_NO_USER),
    ({"external_id": "x1", "limit": "0"}, S.ERR_LIMIT.format(most=100)),
    ({"external_id": "x1", "limit": "101"}, S.ERR_LIMIT.format(most=100)),
    ({"external_id": "x1", "limit": "ten"}, S.ERR_LIMIT.format(most=100)),
    ({"external_id": "x1", "limit": True}, S.ERR_LIMIT.format(most=100)),
    ({"external_id": "x1", "offset": "-1"}, S.ERR_OFFSET),
    ({"external_id": "x1", "offset": 1.5}, S.ERR_OFFSET),
    ({"phone": ""}, S.ERR_VALUE.format(kind="phone")),
    ({"email": ",".join(f"u{i}@example.com" for i in range(51))}, S.ERR_TOO_MANY.format(kind="email", most=50, count=51)),
])
def test_user_groups_refusals(ws: Workspace, query: dict[str, Any], message: str) -> None:
    assert refused(ws.call("GET", GROUPS, query=query)) == message


# --- over HTTP ----------------------------------------------------------------------------------------
def test_over_http_as_through_call(ws: Workspace) -> None:
    track(ws, {"external_id": "x1", "subscription_groups": [group("g1", "subscribed")]},
          {"external_id": "p", "subscription_groups": [group("sms", "unsubscribed")]})
    reader = ws.credentials.create_key("reader", ["subscription.status.get", "subscription.groups.get"])
    status_only = ws.credentials.create_key("status-only", ["subscription.status.get"])
    tracker = ws.credentials.create_key("tracker", ["users.track"])
    with served(ws) as client:
        for path, query in [(STATUS, {"subscription_group_id": "g1", "external_id": "x1,x2,ghost"}),
                            (STATUS, {"subscription_group_id": "sms", "phone": "+15551112222"}),
                            (STATUS, {"subscription_group_id": "g1", "email": E}),
                            (STATUS, {"external_id": "x1"}),
                            (GROUPS, {"external_id": "x1,p", "limit": "1"}),
                            (GROUPS, {"email": E, "offset": "0"}),
                            (GROUPS, {"external_id": "x1", "limit": "500"})]:
            got = send(client, "GET", path, None, bearer(reader), query)
            want = ws.call("GET", path, query=query)
            assert (got.status_code, got.json()) == (want.status, want.body), (path, query)
        # the hosted API's own examples: `external_id[]`, and a phone's `+` unescaped in the URL
        one = client.get(f"{STATUS}?subscription_group_id=g1&external_id[]=x1", headers=bearer(reader))
        assert one.json() == {"status": {"x1": "Subscribed"}, "message": "success"}
        assert one.headers["X-RateLimit-Limit"] == "250000"
        several = client.get(f"{STATUS}?subscription_group_id=g1&external_id[]=x1&external_id[]=ghost",
                             headers=bearer(reader))
        assert several.json() == {"status": {"x1": "Subscribed", "ghost": "Unknown"}, "message": "success"}
        # and as a path's query through `Workspace.call`, alike
        assert ws.call("GET", f"{STATUS}?subscription_group_id=g1&external_id[]=x1&external_id[]=ghost").body \
            == several.json()
        raw = client.get(f"{STATUS}?subscription_group_id=sms&phone=+15551112222", headers=bearer(reader))
        assert raw.json() == {"status": {"+15551112222": "Unsubscribed"}, "message": "success"}
        missing = send(client, "GET", GROUPS, None, bearer(reader), {"limit": "5"})
        assert (missing.status_code, missing.json()) == (400, {"message": S.ERR_NO_USER})
        # each endpoint needs its own permission
        lacking = send(client, "GET", GROUPS, None, bearer(status_only), {"external_id": "x1"})
        assert (lacking.status_code, lacking.json()) == (401, {
            "message": "Invalid API key: key 'status-only' lacks the permission 'subscription.groups.get' "
                       f"that GET {GROUPS} needs"})
        lacking = send(client, "GET", STATUS, None, bearer(tracker), {"subscription_group_id": "g1", "external_id": "x1"})
        assert (lacking.status_code, lacking.json()) == (401, {
            "message": "Invalid API key: key 'tracker' lacks the permission 'subscription.status.get' "
                       f"that GET {STATUS} needs"})
        assert send(client, "GET", STATUS, None, None, {"subscription_group_id": "g1"}).status_code == 401
        assert send(client, "POST", STATUS, {}, bearer(reader)).status_code == 405


# --- the library's object and the CLI ----------------------------------------------------------------
def test_the_library_and_the_cli_answer_as_the_endpoints(ws: Workspace, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from engagelake.cli import app
    from engagelake.errors import RequestError

    track(ws, {"external_id": "x1", "subscription_groups": [group("g1", "subscribed"), group("g2", "unsubscribed")]})
    assert ws.subscriptions.status("g1", external_ids=["x1", "ghost"]) == {"x1": "Subscribed", "ghost": "Unknown"}
    assert ws.subscriptions.status("g1", emails=[E]) == status(ws, "g1", email=E)
    assert [(u["external_id"], states(u)) for u in ws.subscriptions.of_users(external_ids=["x1"], limit=1)] \
        == [("x1", {"g1": "subscribed"})]
    with pytest.raises(RequestError, match="give at least one user"):
        ws.subscriptions.status("g1")
    ws.close()
    store = str(tmp_path / "s")
    runner = CliRunner()
    printed = runner.invoke(app, ["subscriptions", "status", "--store", store, "--group", "g2",
                                  "--external-id", "x1", "--external-id", "quiet"])
    assert printed.exit_code == 0 and printed.stdout.splitlines() == ["x1\tUnsubscribed", "quiet\tUnknown"]
    printed = runner.invoke(app, ["subscriptions", "user", "--store", store, "--external-id", "x1",
                                  "--external-id", "quiet"])
    assert printed.exit_code == 0 and printed.stdout.splitlines() == [
        "x1\tsame@example.com\tg1\tsubscribed", "x1\tsame@example.com\tg2\tunsubscribed",
        "quiet\tquiet@example.com\t-\t-"]
    refused = runner.invoke(app, ["subscriptions", "status", "--store", store, "--group", "g1"])
    assert refused.exit_code == 1 and "give at least one user" in refused.stderr
    too_many = runner.invoke(app, ["subscriptions", "status", "--store", store, "--group", "g1",
                                   *[arg for i in range(51) for arg in ("--external-id", f"u{i}")]])
    assert too_many.exit_code == 1 and "too many external_id values: at most 50" in too_many.stderr
