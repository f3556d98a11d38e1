"""SCIM 2.0 dashboard users end to end through `Workspace.call` / `apply`, and the company
directory their permissions refer to (tests/data/company_directory.json)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import NOW, open_ws

from engagelake import Response, Workspace
from engagelake.errors import ConfigError
from engagelake.resources.scim import ScimError

DIRECTORY_FILE = Path(__file__).parent / "data" / "company_directory.json"
USERS = "/scim/v2/Users"
USER_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:User"
LIST_SCHEMA = "urn:ietf:params:scim:api:messages:2.0:ListResponse"
ERROR_SCHEMA = "urn:ietf:params:scim:api:messages:2.0:Error"
NOT_FOUND = {"schemas": [ERROR_SCHEMA], "detail": "User not found", "status": 404}
ALL_PERMISSIONS = ("admin, basic_access, export_user_data, manage_company_settings, manage_teams, "
                   "publish_cards, send_campaigns_canvases, view_reports")

SENDERS = {"appGroupPermissionSetName": "Campaign senders", "appGroupPermissionSetId": "set-senders",
           "permissions": ["basic_access", "send_campaigns_canvases"]}
READ_ONLY = {"appGroupPermissionSetName": "Read only", "appGroupPermissionSetId": "set-read",
             "permissions": ["basic_access"]}
MARKETER = {"roleName": "Marketer", "roleId": "role-marketer", "appGroup": [
    {"appGroupName": "Production", "appGroupId": "ws-prod", "appGroupPermissions": ["basic_access"],
     "team": [], "appGroupPermissionSets": [SENDERS]}]}
AUDITOR = {"roleName": "Auditor", "roleId": "role-auditor", "appGroup": [
    {"appGroupName": "Staging", "appGroupId": "ws-staging", "appGroupPermissions": ["view_reports"],
     "team": [], "appGroupPermissionSets": []}]}

PERMISSIONS_IN = {
    "companyPermissions": ["admin"],
    "roles": [{"roleName": "Marketer"}],
    "appGroup": [{"appGroupName": "Production", "appGroupPermissions": ["view_reports"],
                  "team": [{"teamName": "EMEA", "teamPermissions": ["basic_access"]}],
                  "appGroupPermissionSets": [{"appGroupPermissionSetName": "Campaign senders"}]}],
}
PERMISSIONS_OUT = {
    "companyPermissions": ["admin"],
    "roles": [MARKETER],
    "appGroup": [{"appGroupName": "Production", "appGroupId": "ws-prod",
                  "appGroupPermissions": ["view_reports"],
                  "team": [{"teamName": "EMEA", "teamId": "team-emea", "teamPermissions": ["basic_access"]}],
                  "appGroupPermissionSets": [SENDERS]}],
}


def user_id(n: int, seed: str = "t") -> str:
    """The ID of the n-th dashboard user created in a store (n from 0), as documented."""
    h = hashlib.sha256(f"{seed}:scim-user:{n}".encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def new_user(email: str = "ann@example.com", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"schemas": [USER_SCHEMA], "userName": email,
                            "name": {"givenName": "Ann", "familyName": "Lee"},
                            "department": "marketing", "permissions": PERMISSIONS_IN}
    body.update(overrides)
    return body


def user_out(uid: str, email: str = "ann@example.com", *, permissions: Any = None,
             given: str = "Ann", family: str = "Lee", department: str = "marketing",
             last_sign_in: str | None = None) -> dict[str, Any]:
    return {"schemas": [USER_SCHEMA], "id": uid, "userName": email,
            "name": {"givenName": given, "familyName": family}, "department": department,
            "lastSignInAt": last_sign_in,
            "permissions": PERMISSIONS_OUT if permissions is None else permissions}


def scim_error(status: int, detail: str, scim_type: str | None = None) -> Response:
    body: dict[str, Any] = {"schemas": [ERROR_SCHEMA], "detail": detail, "status": status}
    if scim_type is not None:
        body["scimType"] = scim_type
    return Response(status, body)


def listing(*users: dict[str, Any]) -> Response:
    return Response(200, {"schemas": [LIST_SCHEMA], "totalResults": len(users), "Resources": list(users)})


def fresh(tmp_path: Path, name: str = "store") -> Workspace:
    ws = open_ws(tmp_path, name)
    ws.scim.load_directory(DIRECTORY_FILE)
    return ws


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """One store for the cases that write nothing: the sample directory and one user."""
    ws = fresh(tmp_path_factory.mktemp("scim"))
    assert ws.call("POST", USERS, body=new_user("taken@example.com")).status == 201
    return ws


TAKEN = user_id(0)


# --- success shapes ------------------------------------------------------------------------------
def test_create_answers_201_with_the_user_and_ids(tmp_path: Path) -> None:
    ws = fresh(tmp_path)
    assert ws.call("POST", USERS, body=new_user()) == Response(201, user_out(user_id(0)))
    assert ws.call("GET", f"{USERS}/{user_id(0)}") == Response(200, user_out(user_id(0)))


def test_references_by_id_and_names_case_insensitively(shared: Workspace) -> None:
    """A request may name entries by ID, by name in any case, or both when they agree."""
    body = new_user("byid@example.com", permissions={
        "roles": [{"roleId": "role-auditor"}, {"roleName": "MARKETER", "roleId": "role-marketer"}],
        "appGroup": [{"appGroupId": "ws-staging", "team": [{"teamId": "team-qa"}],
                      "appGroupPermissionSets": [{"appGroupPermissionSetId": "set-read"}]}]})
    r = shared.apply([{"method": "POST", "path": USERS, "body": body}])[0]
    assert r.status == 201
    assert r.body["permissions"] == {
        "companyPermissions": [],
        "roles": [AUDITOR, MARKETER],
        "appGroup": [{"appGroupName": "Staging", "appGroupId": "ws-staging", "appGroupPermissions": [],
                      "team": [{"teamName": "QA", "teamId": "team-qa", "teamPermissions": []}],
                      "appGroupPermissionSets": [READ_ONLY]}]}
    assert shared.call("DELETE", f"{USERS}/{r.body['id']}").status == 204  # the shared store keeps one user


def test_empty_permissions_and_repeated_strings(tmp_path: Path) -> None:
    ws = fresh(tmp_path)
    r = ws.call("POST", USERS, body=new_user(permissions={"companyPermissions": ["admin", "admin"],
                                                           "roles": None}))
    assert r == Response(201, user_out(user_id(0), permissions={
        "companyPermissions": ["admin"], "roles": [], "appGroup": []}))


def test_filter_by_user_name(shared: Workspace) -> None:
    taken = user_out(TAKEN, "taken@example.com")
    encoded = f"{USERS}?filter=userName%20eq%20%22Taken%40Example.com%22"
    assert shared.call("GET", encoded) == listing(taken)
    assert shared.call("GET", USERS, query={"filter": 'USERNAME EQ "taken@example.com"'}) == listing(taken)
    assert shared.call("GET", USERS, query={"filter": 'userName eq "nobody@example.com"'}) == listing()
    assert shared.call("GET", USERS) == listing(taken)  # no filter: every user


def test_put_replaces_name_department_and_permissions(tmp_path: Path) -> None:
    ws = fresh(tmp_path)
    uid = ws.call("POST", USERS, body=new_user()).body["id"]
    put = {"schemas": [USER_SCHEMA], "userName": "ANN@example.com",  # same name, other case: fine
           "name": {"givenName": "Annie", "familyName": "Lee-Park"}, "department": "finance",
           "permissions": {"companyPermissions": ["export_user_data"], "roles": [{"roleName": "Auditor"}]}}
    expected = user_out(uid, given="Annie", family="Lee-Park", department="finance", permissions={
        "companyPermissions": ["export_user_data"], "roles": [AUDITOR], "appGroup": []})
    assert ws.call("PUT", f"{USERS}/{uid}", body=put) == Response(200, expected)
    assert ws.call("GET", f"{USERS}/{uid}") == Response(200, expected)


def test_put_accepts_the_body_a_get_returned(tmp_path: Path) -> None:
    """GET, change a field, PUT back: the echoed IDs and read-only parts are accepted."""
    ws = fresh(tmp_path)
    uid = ws.call("POST", USERS, body=new_user()).body["id"]
    got = ws.call("GET", f"{USERS}/{uid}").body
    assert ws.call("PUT", f"{USERS}/{uid}", body={**got, "department": "sales"}) == Response(
        200, user_out(uid, department="sales"))


def test_last_sign_in_is_null_until_a_sign_in_is_recorded(tmp_path: Path) -> None:
    ws = fresh(tmp_path)
    uid = ws.scim.create_user("ann@example.com", given_name="Ann", family_name="Lee",
                              department="marketing", permissions=PERMISSIONS_IN)["id"]
    assert ws.scim.get_user(uid)["lastSignInAt"] is None  # type: ignore[index]
    signed = ws.scim.record_sign_in(uid, datetime(2026, 11, 20, 8, 30, 1, 250000, tzinfo=UTC))
    assert signed == user_out(uid, last_sign_in="2026-11-20T08:30:01.250Z")
    assert ws.scim.record_sign_in(uid)["lastSignInAt"] == "2026-11-22T12:00:00.000Z"  # the clock
    with pytest.raises(ScimError) as caught:
        ws.scim.record_sign_in("nope")
    assert caught.value.body == NOT_FOUND


# --- the round trip --------------------------------------------------------------------------------
def test_round_trip_create_get_update_filter_delete(tmp_path: Path) -> None:
    ws = fresh(tmp_path)
    uid = user_id(0)
    assert ws.call("POST", USERS, body=new_user()) == Response(201, user_out(uid))
    assert ws.call("GET", f"{USERS}/{uid}") == Response(200, user_out(uid))
    put = {**new_user(), "department": "product"}
    del put["userName"]
    assert ws.call("PUT", f"{USERS}/{uid}", body=put) == Response(200, user_out(uid, department="product"))
    flt = f"{USERS}?filter=userName+eq+%22ann%40example.com%22"
    assert ws.call("GET", flt) == listing(user_out(uid, department="product"))
    assert ws.call("DELETE", f"{USERS}/{uid}") == Response(204, None)
    assert ws.call("GET", f"{USERS}/{uid}") == Response(404, NOT_FOUND)
    assert ws.call("PUT", f"{USERS}/{uid}", body=put) == Response(404, NOT_FOUND)
    assert ws.call("DELETE", f"{USERS}/{uid}") == Response(404, NOT_FOUND)
    assert ws.call("GET", flt) == listing()
    # the email is free again; the new user gets a new ID
    assert ws.call("POST", USERS, body=new_user()) == Response(201, user_out(user_id(1)))
    assert ws.table("scim_user_log").collect()["op"].to_list() == ["create", "update", "delete", "create"]


def test_friendly_methods(tmp_path: Path) -> None:
    ws = fresh(tmp_path)
    created = ws.scim.create_user("ann@example.com", given_name="Ann", family_name="Lee",
                                  department="marketing", permissions=PERMISSIONS_IN)
    uid = created["id"]
    assert created == user_out(uid)
    assert ws.scim.get_user(uid) == created
    assert ws.scim.find_user("ANN@example.com") == created
    assert ws.scim.find_user("bob@example.com") is None
    assert ws.scim.update_user(uid, department="engineering") == user_out(uid, department="engineering")
    assert ws.scim.list_users() == [user_out(uid, department="engineering")]
    with pytest.raises(ScimError) as caught:
        ws.scim.create_user("Ann@Example.com", given_name="A", family_name="B", department="other")
    assert caught.value.status == 409 and caught.value.body["scimType"] == "uniqueness"
    ws.scim.delete_user(uid)
    assert ws.scim.get_user(uid) is None
    with pytest.raises(ScimError, match="404: User not found"):
        ws.scim.delete_user(uid)
    with pytest.raises(ScimError, match="404: User not found"):
        ws.scim.update_user(uid, department="sales")


# --- errors ----------------------------------------------------------------------------------------
def without(key: str) -> dict[str, Any]:
    body = new_user("new@example.com")
    del body[key]
    return body


def with_permissions(**permissions: Any) -> dict[str, Any]:
    return new_user("new@example.com", permissions=permissions)


def in_production(**workspace: Any) -> dict[str, Any]:
    return with_permissions(appGroup=[{"appGroupName": "Production", **workspace}])


CREATE_ERRORS = [
    ([1, 2], "The request body must be a JSON object (a SCIM User resource).", "invalidSyntax"),
    (without("schemas"), "Missing required attribute 'schemas'; send it in the request body.", "invalidValue"),
    (new_user("new@example.com", schemas=["urn:other"]),
     f"Attribute 'schemas' must be an array containing '{USER_SCHEMA}'.", "invalidValue"),
    (without("userName"), "Missing required attribute 'userName'; send it in the request body.", "invalidValue"),
    (new_user("ann"), 'userName "ann" is not an email address; userName must be the user\'s email.',
     "invalidValue"),
    (new_user(42), "userName 42 is not an email address; userName must be the user's email.", "invalidValue"),  # type: ignore[arg-type]
    (without("name"), "Missing required attribute 'name'; send it in the request body.", "invalidValue"),
    (new_user("new@example.com", name="Ann Lee"),
     "Attribute 'name' must be an object {givenName, familyName}.", "invalidValue"),
    (new_user("new@example.com", name={"familyName": "Lee"}),
     "Missing required attribute 'name.givenName'; send it in the request body.", "invalidValue"),
    (new_user("new@example.com", name={"givenName": "Ann", "familyName": " "}),
     "Attribute 'name.familyName' must be a non-empty string.", "invalidValue"),
    (without("department"), "Missing required attribute 'department'; send it in the request body.",
     "invalidValue"),
    (new_user("new@example.com", department="Marketing"),
     'Unknown department "Marketing"; use one of: agency, c_suite, engineering, finance, marketing, '
     "operations, product, sales, other.", "invalidValue"),
    (without("permissions"), "Missing required attribute 'permissions'; send it in the request body.",
     "invalidValue"),
    (new_user("new@example.com", permissions=["admin"]), "Attribute 'permissions' must be an object.",
     "invalidValue"),
    (with_permissions(companyPermissions="admin"),
     "Attribute 'permissions.companyPermissions' must be an array of permission strings.", "invalidValue"),
    (with_permissions(companyPermissions=["admin", "fly"]),
     f'Unknown permission "fly" at permissions.companyPermissions[1]; known permissions: {ALL_PERMISSIONS}.',
     "invalidValue"),
    (with_permissions(roles=[{"roleName": "Boss"}]),
     'Unknown role "Boss" at permissions.roles[0]; known roles: Auditor, Marketer.', "invalidValue"),
    (with_permissions(roles=[{"roleId": "role-boss"}]),
     'Unknown role "role-boss" at permissions.roles[0]; known roles: Auditor, Marketer.', "invalidValue"),
    (with_permissions(roles=[{"name": "Marketer"}]),
     "permissions.roles[0] needs 'roleName' or 'roleId'.", "invalidValue"),
    (with_permissions(roles=[{"roleName": "Marketer", "roleId": "role-auditor"}]),
     'permissions.roles[0]: roleName "Marketer" and roleId "role-auditor" name different roles; '
     "send one of them, or both of the same role.", "invalidValue"),
    (with_permissions(roles=[{"roleName": "Marketer"}, {"roleId": "role-marketer"}]),
     'role "Marketer" appears twice in permissions.roles; list it once.', "invalidValue"),
    (with_permissions(appGroup=[{"appGroupName": "Dev"}]),
     'Unknown workspace (appGroup) "Dev" at permissions.appGroup[0]; known workspaces: Production, Staging.',
     "invalidValue"),
    (with_permissions(appGroup=[{"appGroupId": "ws-dev"}]),
     'Unknown workspace (appGroup) "ws-dev" at permissions.appGroup[0]; known workspaces: Production, '
     "Staging.", "invalidValue"),
    (with_permissions(appGroup=[{"appGroupName": "Staging"}, {"appGroupName": "staging"}]),
     'workspace (appGroup) "Staging" appears twice in permissions.appGroup; list it once.', "invalidValue"),
    (in_production(appGroupPermissions=["basic_access", "fly"]),
     'Unknown permission "fly" at permissions.appGroup[0].appGroupPermissions[1]; known permissions: '
     f"{ALL_PERMISSIONS}.", "invalidValue"),
    (in_production(team=[{"teamName": "QA"}]),  # a team of another workspace
     'Unknown team "QA" in workspace "Production" at permissions.appGroup[0].team[0]; known teams: APAC, EMEA.',
     "invalidValue"),
    (in_production(team=[{"teamName": "EMEA", "teamPermissions": ["fly"]}]),
     'Unknown permission "fly" at permissions.appGroup[0].team[0].teamPermissions[0]; known permissions: '
     f"{ALL_PERMISSIONS}.", "invalidValue"),
    (in_production(appGroupPermissionSets=[{"appGroupPermissionSetName": "Read only"}]),
     'Unknown permission set "Read only" in workspace "Production" at '
     "permissions.appGroup[0].appGroupPermissionSets[0]; known permission sets: Campaign senders.",
     "invalidValue"),
    (in_production(appGroupPermissionSets=[{"appGroupPermissionSetId": ""}]),
     "Attribute 'permissions.appGroup[0].appGroupPermissionSets[0].appGroupPermissionSetId' must be a "
     "non-empty string.", "invalidValue"),
]


@pytest.mark.parametrize(("body", "detail", "scim_type"), CREATE_ERRORS)
def test_create_refuses_invalid_bodies(shared: Workspace, body: Any, detail: str, scim_type: str) -> None:
    assert shared.call("POST", USERS, body=body) == scim_error(400, detail, scim_type)
    assert shared.table("scim_users").collect().height == 1  # nothing written


@pytest.mark.parametrize("email", ["taken@example.com", "TAKEN@Example.COM"])
def test_create_refuses_a_taken_user_name(shared: Workspace, email: str) -> None:
    assert shared.call("POST", USERS, body=new_user(email)) == scim_error(
        409, f'userName "{email}" is already taken by user {TAKEN}; update that user with PUT instead.',
        "uniqueness")


def test_invalid_body_is_reported_before_a_taken_user_name(shared: Workspace) -> None:
    body = new_user("taken@example.com", department="hr")
    assert shared.call("POST", USERS, body=body).status == 400


def put_body(**overrides: Any) -> dict[str, Any]:
    body = new_user("taken@example.com", **overrides)
    del body["userName"]
    return body


@pytest.mark.parametrize(("body", "response"), [
    ({**put_body(), "userName": "other@example.com"}, scim_error(
        400, 'userName cannot be changed (stored "taken@example.com", sent "other@example.com"); leave '
        "userName out of the PUT body or send the stored value.", "mutability")),
    (put_body(department="legal"), scim_error(
        400, 'Unknown department "legal"; use one of: agency, c_suite, engineering, finance, marketing, '
        "operations, product, sales, other.", "invalidValue")),
    ({k: v for k, v in put_body().items() if k != "name"},
     scim_error(400, "Missing required attribute 'name'; send it in the request body.", "invalidValue")),
    (put_body(permissions={"appGroup": [{"appGroupName": "Staging", "team": [{"teamName": "EMEA"}]}]}),
     scim_error(400, 'Unknown team "EMEA" in workspace "Staging" at permissions.appGroup[0].team[0]; '
                "known teams: QA.", "invalidValue")),
])
def test_put_refuses_invalid_bodies(shared: Workspace, body: dict[str, Any], response: Response) -> None:
    assert shared.call("PUT", f"{USERS}/{TAKEN}", body=body) == response
    assert shared.call("GET", f"{USERS}/{TAKEN}") == Response(200, user_out(TAKEN, "taken@example.com"))


@pytest.mark.parametrize(("method", "body"), [("GET", None), ("PUT", put_body()), ("PUT", {"x": 1}),
                                              ("DELETE", None)])
def test_unknown_id_is_404_user_not_found(shared: Workspace, method: str, body: Any) -> None:
    assert shared.call(method, f"{USERS}/no-such-id", body=body) == Response(404, NOT_FOUND)


@pytest.mark.parametrize("flt", [
    'userName co "taken"', 'emails eq "taken@example.com"', "userName eq taken@example.com",
    'userName eq "taken@example.com" and title eq "x"', "", 'userName eq "bad\\escape"', 5,
])
def test_bad_filter_is_400_invalid_filter(shared: Workspace, flt: Any) -> None:
    assert shared.call("GET", USERS, query={"filter": flt}) == scim_error(
        400, f'Unsupported filter {json.dumps(flt)}; the only supported filter is userName eq "<email>" '
        "(URL-encoded in the query string).", "invalidFilter")


# --- batches and persistence -----------------------------------------------------------------------
def scim_batch() -> list[dict[str, Any]]:
    first, second = user_id(0), user_id(1)
    return [
        {"method": "POST", "path": USERS, "body": new_user()},
        {"method": "POST", "path": USERS, "body": new_user("bob@example.com", department="sales")},
        {"method": "POST", "path": USERS, "body": new_user("BOB@example.com")},  # 409
        {"method": "PUT", "path": f"{USERS}/{second}", "body": put_body(department="agency")},
        {"method": "GET", "path": f"{USERS}?filter=userName%20eq%20%22bob%40example.com%22"},
        {"method": "DELETE", "path": f"{USERS}/{first}"},
        {"method": "GET", "path": f"{USERS}/{first}"},
        {"method": "POST", "path": USERS, "body": new_user()},  # the email is free again
        {"method": "GET", "path": USERS, "query": {"filter": "bogus"}},
        {"method": "GET", "path": USERS},
    ]


def test_apply_equals_call_one_by_one(tmp_path: Path) -> None:
    batched, single = fresh(tmp_path, "batched"), fresh(tmp_path, "single")
    responses = batched.apply(scim_batch())
    assert responses == [single.call(r["method"], r["path"], r.get("body"), r.get("query")) for r in scim_batch()]
    assert [r.status for r in responses] == [201, 201, 409, 200, 200, 204, 404, 201, 400, 200]
    assert responses[-1] == listing(user_out(user_id(1), "bob@example.com", department="agency"),
                                    user_out(user_id(2)))
    assert batched.table("scim_users").collect().sort("id").equals(single.table("scim_users").collect().sort("id"))
    assert batched.table("scim_user_log").collect().equals(single.table("scim_user_log").collect())


def test_reopened_store_sees_users_and_directory(tmp_path: Path) -> None:
    ws = fresh(tmp_path)
    uid = ws.call("POST", USERS, body=new_user()).body["id"]
    ws.scim.record_sign_in(uid)
    directory = ws.scim.directory()
    again = Workspace.open(tmp_path / "store", clock=lambda: NOW)
    assert again.call("GET", f"{USERS}/{uid}") == Response(
        200, user_out(uid, last_sign_in="2026-11-22T12:00:00.000Z"))
    assert again.scim.directory() == directory
    assert again.call("POST", USERS, body=new_user("bob@example.com")).body["id"] == user_id(1)


# --- the directory -----------------------------------------------------------------------------------
def test_directory_loaded_from_the_json_file(shared: Workspace) -> None:
    assert shared.scim.directory() == {
        "permissions": ALL_PERMISSIONS.split(", "),
        "workspaces": [
            {"id": "ws-prod", "name": "Production",
             "teams": [{"id": "team-apac", "name": "APAC"}, {"id": "team-emea", "name": "EMEA"}],
             "permission_sets": [{"id": "set-senders", "name": "Campaign senders",
                                  "permissions": ["basic_access", "send_campaigns_canvases"]}]},
            {"id": "ws-staging", "name": "Staging", "teams": [{"id": "team-qa", "name": "QA"}],
             "permission_sets": [{"id": "set-read", "name": "Read only", "permissions": ["basic_access"]}]},
        ],
        "roles": [{"id": "role-auditor", "name": "Auditor", "appGroup": AUDITOR["appGroup"]},
                  {"id": "role-marketer", "name": "Marketer", "appGroup": MARKETER["appGroup"]}],
    }
    assert shared.sql("select name from scim_teams where app_group_id = 'ws-prod' order by name")[
        "name"].to_list() == ["APAC", "EMEA"]


def derived(kind: str, *names: str) -> str:
    key = ":".join(("t", "scim", kind, *(n.casefold() for n in names)))
    return hashlib.sha256(key.encode()).hexdigest()[:24]


YAML_DIRECTORY = """\
permissions: [view_reports]
workspaces:
  - name: Web
    teams: [Growth]
    permission_sets:
      - name: Viewers
        permissions: [view_reports]
roles:
  - name: Analyst
    appGroup:
      - appGroupName: Web
        team: [{teamName: Growth, teamPermissions: [view_reports]}]
"""


def test_directory_from_yaml_gets_stable_derived_ids(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    path = tmp_path / "directory.yaml"
    path.write_text(YAML_DIRECTORY)
    web, growth = derived("workspace", "Web"), derived("team", derived("workspace", "Web"), "Growth")
    viewers = derived("permission_set", web, "Viewers")
    first = ws.scim.load_directory(path)
    assert first["workspaces"] == [{"id": web, "name": "Web", "teams": [{"id": growth, "name": "Growth"}],
                                    "permission_sets": [{"id": viewers, "name": "Viewers",
                                                         "permissions": ["view_reports"]}]}]
    assert first["roles"] == [{"id": derived("role", "Analyst"), "name": "Analyst", "appGroup": [
        {"appGroupName": "Web", "appGroupId": web, "appGroupPermissions": [],
         "team": [{"teamName": "Growth", "teamId": growth, "teamPermissions": ["view_reports"]}],
         "appGroupPermissionSets": []}]}]
    assert ws.scim.load_directory(path) == first  # loading twice changes nothing
    assert ws.scim.load_directory(first) == first  # the described directory loads back as it is


def test_directory_from_a_dict_adds_and_renames_by_id(tmp_path: Path) -> None:
    ws = fresh(tmp_path)
    uid = ws.call("POST", USERS, body=new_user()).body["id"]
    ws.scim.load_directory({"workspaces": [{"id": "ws-prod", "name": "Live", "teams": ["Nordics"]}]})
    user = ws.call("GET", f"{USERS}/{uid}").body
    assert [g["appGroupName"] for g in user["permissions"]["appGroup"]] == ["Live"]
    assert user["permissions"]["roles"][0]["appGroup"][0]["appGroupName"] == "Live"
    teams = ws.scim.directory()["workspaces"][0]["teams"]
    assert teams == [{"id": "team-apac", "name": "APAC"}, {"id": "team-emea", "name": "EMEA"},
                     {"id": derived("team", "ws-prod", "Nordics"), "name": "Nordics"}]
    body = in_production(team=[{"teamName": "Nordics"}])
    assert ws.call("POST", USERS, body=body).status == 400  # "Production" is now called "Live"
    body["permissions"]["appGroup"][0]["appGroupName"] = "live"
    assert ws.call("POST", USERS, body=body).status == 201


@pytest.mark.parametrize(("directory", "message"), [
    ({"groups": []}, "directory: unknown keys groups; allowed: permissions, workspaces, roles"),
    ({"permissions": "admin"}, "directory permissions: expected an array"),
    ({"permissions": [""]}, "directory permissions[0]: permission strings must be non-empty strings"),
    ({"workspaces": [{"id": "x"}]},
     "directory workspaces[0]: expected a name string or an object with a non-empty 'name'"),
    ({"workspaces": [{"name": "W", "id": 3}]}, "directory workspaces[0]: 'id' must be a non-empty string"),
    ({"workspaces": [{"name": "W", "permission_sets": [{"name": "S", "permissions": ["fly"]}]}]},
     'directory workspaces[0].permission_sets[0].permissions[0]: unknown permission "fly"; '
     "list it under 'permissions'"),
    ({"workspaces": ["Web", "web"]},
     'directory workspaces[1]: "web" repeats workspaces[0] (same id or name); list it once'),
    ({"workspaces": [{"name": "W", "teams": ["A", "a"]}]},
     'directory workspaces[0].teams[1]: "a" repeats workspaces[0].teams[0] (same id or name); list it once'),
    ({"roles": [{"name": "R", "id": "r1"}, {"name": "S", "id": "r1"}]},
     'directory roles[1]: "S" repeats roles[0] (same id or name); list it once'),
    ({"workspaces": [{"name": "Production", "teams": [{"name": "emea", "id": "team-new"}]}]},
     'directory: two teams are named "emea" in workspace "Production"; names must be unique'),
    ({"workspaces": [{"name": "Staging", "id": "other-staging"}]},
     'directory: two workspaces are named "Staging"; names must be unique'),
    ({"roles": [{"name": "R", "appGroup": [{"appGroupName": "Dev"}]}]},
     'directory roles[0] ("R"): Unknown workspace (appGroup) "Dev" at appGroup[0]; '
     "known workspaces: Production, Staging."),
])
def test_invalid_directory_changes_nothing(shared: Workspace, directory: dict[str, Any], message: str) -> None:
    before = shared.scim.directory()
    with pytest.raises(ConfigError) as caught:
        shared.scim.load_directory(directory)
    assert str(caught.value) == message
    assert shared.scim.directory() == before


def test_unreadable_directory_files(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    with pytest.raises(ConfigError, match="cannot read it"):
        ws.scim.load_directory(tmp_path / "missing.yaml")
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected an object with permissions, workspaces and roles"):
        ws.scim.load_directory(listed)
    broken = tmp_path / "broken.json"
    broken.write_text('{"workspaces": [')
    with pytest.raises(ConfigError, match="cannot read it"):
        ws.scim.load_directory(broken)
