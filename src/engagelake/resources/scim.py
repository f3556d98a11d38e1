"""SCIM 2.0 dashboard users (`/scim/v2/Users`) and the company directory their permissions name.

A user's permissions are validated against the directory (roles, workspaces, teams, permission
sets, permission strings), stored by ID, and rendered with the directory's current names.
Handlers read `ctx.state` and write through `ctx.write`, so `apply` equals one-by-one calls;
IDs are derived from the store's seed, so a replay gives the same IDs.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import yaml

from engagelake.errors import ConfigError, RequestError
from engagelake.routing import Client, Context, Handler, Request, Response
from engagelake.rules.formats import EMAIL_MAX, EMAIL_RE
from engagelake.rules.state import Changes, State
from engagelake.tables.scim import SCHEMAS

USERS_PATH = "/scim/v2/Users"
USER_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:User"
LIST_SCHEMA = "urn:ietf:params:scim:api:messages:2.0:ListResponse"
ERROR_SCHEMA = "urn:ietf:params:scim:api:messages:2.0:Error"
DEPARTMENTS = ("agency", "c_suite", "engineering", "finance", "marketing", "operations",
               "product", "sales", "other")
# The permission strings the specification names are known to every company; a directory adds more.
BUILTIN_PERMISSIONS = ("manage_company_settings", "basic_access", "send_campaigns_canvases",
                       "publish_cards", "export_user_data", "admin")
KNOWN_SHOWN_MAX = 20  # error texts list at most this many known values

# --- error texts (SCIM `detail`) ---------------------------------------------------------------
USER_NOT_FOUND = "User not found"
BODY_NOT_OBJECT = "The request body must be a JSON object (a SCIM User resource)."
MISSING_ATTRIBUTE = "Missing required attribute '{field}'; send it in the request body."
WRONG_TYPE = "Attribute '{field}' must be {expected}."
SCHEMAS_WITHOUT_USER = f"Attribute 'schemas' must be an array containing '{USER_SCHEMA}'."
USER_NAME_NOT_EMAIL = "userName {value} is not an email address; userName must be the user's email."
USER_NAME_TAKEN = "userName {value} is already taken by user {id}; update that user with PUT instead."
USER_NAME_IMMUTABLE = ("userName cannot be changed (stored {stored}, sent {sent}); leave userName "
                       "out of the PUT body or send the stored value.")
UNKNOWN_DEPARTMENT = "Unknown department {value}; use one of: " + ", ".join(DEPARTMENTS) + "."
UNKNOWN_PERMISSION = "Unknown permission {value} at {where}; {known}"
UNKNOWN_ENTRY = "Unknown {label} {value}{scope} at {where}; {known}"
MISSING_REFERENCE = "{where} needs '{name_key}' or '{id_key}'."
NAME_ID_MISMATCH = ("{where}: {name_key} {name} and {id_key} {id} name different {label}s; "
                    "send one of them, or both of the same {label}.")
DUPLICATE_ENTRY = "{label} {value} appears twice in {where}; list it once."
KNOWN_VALUES = "known {plural}: {values}."
NO_KNOWN_VALUES = "the directory has no {plural}{scope}; add them with ws.scim.load_directory(...)."
BAD_FILTER = ('Unsupported filter {value}; the only supported filter is userName eq "<email>" '
              '(URL-encoded in the query string).')
# library-level (directory files)
DIRECTORY_NOT_MAPPING = "directory {source}: expected an object with permissions, workspaces and roles"
DIRECTORY_UNKNOWN_KEYS = "directory: unknown keys {keys}; allowed: permissions, workspaces, roles"
DIRECTORY_BAD_FILE = "directory {source}: cannot read it ({reason}); give a .json, .yaml or .yml file"
DIRECTORY_BAD_ENTRY = "directory {where}: expected a name string or an object with a non-empty 'name'"
DIRECTORY_BAD_ID = "directory {where}: 'id' must be a non-empty string"
DIRECTORY_BAD_LIST = "directory {where}: expected an array"
DIRECTORY_BAD_PERMISSION = "directory {where}: permission strings must be non-empty strings"
DIRECTORY_UNKNOWN_PERMISSION = "directory {where}: unknown permission {value}; list it under 'permissions'"
DIRECTORY_REPEATED = "directory {where}: {name} repeats {first} (same id or name); list it once"
DIRECTORY_DUPLICATE_NAME = "directory: two {plural} are named {name}{scope}; names must be unique"
DIRECTORY_BAD_ROLE = "directory roles[{index}] ({name}): {detail}"


class ScimError(RequestError):
    """A SCIM request answered with an error; `status` and `body` are the SCIM error response."""

    def __init__(self, response: Response):
        super().__init__(f"{response.status}: {response.body['detail']}", response.status, response.body)


class _Refused(Exception):
    """Raised inside a handler to answer with a SCIM error body."""

    def __init__(self, status: int, detail: str, scim_type: str | None = None):
        super().__init__(detail)
        body: dict[str, Any] = {"schemas": [ERROR_SCHEMA], "detail": detail, "status": status}
        if scim_type is not None:
            body["scimType"] = scim_type
        self.response = Response(status, body)


def invalid_value(detail: str) -> _Refused:
    return _Refused(400, detail, "invalidValue")


def quote(value: Any) -> str:
    return orjson.dumps(value).decode()


# --- the company directory ------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    """One directory entry: a workspace, team, permission set or role."""

    id: str
    name: str
    scope: str | None = None  # the workspace (app group) ID of a team or permission set
    permissions: tuple[str, ...] = ()  # a permission set's permission strings
    app_groups: tuple[dict[str, Any], ...] = ()  # a role's workspaces, stored form (by ID)


@dataclass(frozen=True)
class Kind:
    """How the API names one kind of directory entry."""

    label: str
    plural: str
    name_key: str
    id_key: str


ROLE = Kind("role", "roles", "roleName", "roleId")
WORKSPACE = Kind("workspace (appGroup)", "workspaces", "appGroupName", "appGroupId")
TEAM = Kind("team", "teams", "teamName", "teamId")
PERMISSION_SET = Kind("permission set", "permission sets", "appGroupPermissionSetName",
                      "appGroupPermissionSetId")


@dataclass
class Directory:
    """The company directory as plain Python values (it is small)."""

    permissions: set[str] = field(default_factory=lambda: set(BUILTIN_PERMISSIONS))
    workspaces: dict[str, Entry] = field(default_factory=dict)
    teams: dict[str, Entry] = field(default_factory=dict)
    permission_sets: dict[str, Entry] = field(default_factory=dict)
    roles: dict[str, Entry] = field(default_factory=dict)

    @staticmethod
    def from_state(state: State) -> Directory:
        d = Directory()
        d.permissions.update(state["scim_permissions"]["permission"].to_list())
        for r in state["scim_workspaces"].iter_rows(named=True):
            d.workspaces[r["app_group_id"]] = Entry(r["app_group_id"], r["name"])
        for r in state["scim_teams"].iter_rows(named=True):
            d.teams[r["team_id"]] = Entry(r["team_id"], r["name"], r["app_group_id"])
        for r in state["scim_permission_sets"].iter_rows(named=True):
            d.permission_sets[r["permission_set_id"]] = Entry(
                r["permission_set_id"], r["name"], r["app_group_id"], tuple(orjson.loads(r["permissions"])))
        for r in state["scim_roles"].iter_rows(named=True):
            d.roles[r["role_id"]] = Entry(r["role_id"], r["name"], app_groups=tuple(orjson.loads(r["app_groups"])))
        return d


def known_text(values: list[str], plural: str, scope: str = "") -> str:
    if not values:
        return NO_KNOWN_VALUES.format(plural=plural, scope=scope)
    shown = sorted(values)[:KNOWN_SHOWN_MAX]
    more = ", ..." if len(values) > KNOWN_SHOWN_MAX else ""
    return KNOWN_VALUES.format(plural=plural, values=", ".join(shown) + more)


# --- requests to stored form ----------------------------------------------------------------------
def as_list(raw: Any, where: str, expected: str) -> list[Any]:
    """`raw` as a list; a missing or null value is an empty list (nothing granted)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid_value(WRONG_TYPE.format(field=where, expected=expected))
    return raw


def parse_permission_strings(raw: Any, known: set[str], where: str) -> list[str]:
    """Known permission strings in request order, each once."""
    out: list[str] = []
    for i, value in enumerate(as_list(raw, where, "an array of permission strings")):
        if not isinstance(value, str):
            raise invalid_value(WRONG_TYPE.format(field=f"{where}[{i}]", expected="a permission string"))
        if value not in known:
            raise invalid_value(UNKNOWN_PERMISSION.format(
                value=quote(value), where=f"{where}[{i}]", known=known_text(list(known), "permissions")))
        if value not in out:
            out.append(value)
    return out


def resolve_entry(item: Any, entries: dict[str, Entry], kind: Kind, where: str,
                  scope: Entry | None = None) -> Entry:
    """The directory entry a request names by name (case-insensitive) or ID, or refuse."""
    if not isinstance(item, dict):
        raise invalid_value(WRONG_TYPE.format(field=where, expected="an object"))
    name, ident = item.get(kind.name_key), item.get(kind.id_key)
    if name is None and ident is None:
        raise invalid_value(MISSING_REFERENCE.format(where=where, name_key=kind.name_key, id_key=kind.id_key))
    for key, value in ((kind.name_key, name), (kind.id_key, ident)):
        if value is not None and not (isinstance(value, str) and value):
            raise invalid_value(WRONG_TYPE.format(field=f"{where}.{key}", expected="a non-empty string"))
    in_scope = {i: e for i, e in entries.items() if scope is None or e.scope == scope.id}
    in_ws = "" if scope is None else f" in workspace {quote(scope.name)}"
    known = known_text([e.name for e in in_scope.values()], kind.plural, in_ws)
    by_id = in_scope.get(ident) if isinstance(ident, str) else None
    if ident is not None and by_id is None:
        raise invalid_value(UNKNOWN_ENTRY.format(
            label=kind.label, value=quote(ident), scope=in_ws, where=where, known=known))
    by_name = None
    if isinstance(name, str):
        by_name = next((e for e in in_scope.values() if e.name.casefold() == name.casefold()), None)
        if by_name is None:
            raise invalid_value(UNKNOWN_ENTRY.format(
                label=kind.label, value=quote(name), scope=in_ws, where=where, known=known))
    if by_id is not None and by_name is not None and by_id.id != by_name.id:
        raise invalid_value(NAME_ID_MISMATCH.format(
            where=where, name_key=kind.name_key, name=quote(name), id_key=kind.id_key, id=quote(ident),
            label=kind.label))
    found = by_id or by_name
    assert found is not None
    return found


def resolve_entries(raw: Any, entries: dict[str, Entry], kind: Kind, where: str,
                    scope: Entry | None = None) -> list[tuple[Entry, dict[str, Any]]]:
    """Each listed entry once, with the request object that named it."""
    out: list[tuple[Entry, dict[str, Any]]] = []
    for i, item in enumerate(as_list(raw, where, f"an array of {kind.label} objects")):
        entry = resolve_entry(item, entries, kind, f"{where}[{i}]", scope)
        if any(seen.id == entry.id for seen, _ in out):
            raise invalid_value(DUPLICATE_ENTRY.format(label=kind.label, value=quote(entry.name), where=where))
        out.append((entry, item))
    return out


def parse_app_groups(raw: Any, d: Directory, where: str) -> list[dict[str, Any]]:
    """Workspace objects of a request in stored form: IDs and permission strings only."""
    out = []
    for i, (ws, item) in enumerate(resolve_entries(raw, d.workspaces, WORKSPACE, where)):
        at = f"{where}[{i}]"
        teams = [{"teamId": team.id,
                  "teamPermissions": parse_permission_strings(
                      t.get("teamPermissions"), d.permissions, f"{at}.team[{j}].teamPermissions")}
                 for j, (team, t) in enumerate(resolve_entries(item.get("team"), d.teams, TEAM, f"{at}.team", ws))]
        sets = resolve_entries(item.get("appGroupPermissionSets"), d.permission_sets, PERMISSION_SET,
                               f"{at}.appGroupPermissionSets", ws)
        out.append({
            "appGroupId": ws.id,
            "appGroupPermissions": parse_permission_strings(
                item.get("appGroupPermissions"), d.permissions, f"{at}.appGroupPermissions"),
            "team": teams,
            "appGroupPermissionSets": [s.id for s, _ in sets],
        })
    return out


def parse_permissions(raw: Any, d: Directory) -> dict[str, Any]:
    """A request's `permissions` in stored form. Read-only parts echoed from a GET (a role's
    `appGroup`, a permission set's `permissions`) are ignored: the directory defines them."""
    if not isinstance(raw, dict):
        raise invalid_value(WRONG_TYPE.format(field="permissions", expected="an object"))
    return {
        "companyPermissions": parse_permission_strings(
            raw.get("companyPermissions"), d.permissions, "permissions.companyPermissions"),
        "roles": [r.id for r, _ in resolve_entries(raw.get("roles"), d.roles, ROLE, "permissions.roles")],
        "appGroup": parse_app_groups(raw.get("appGroup"), d, "permissions.appGroup"),
    }


def required(body: dict[str, Any], name: str) -> Any:
    if body.get(name) is None:
        raise invalid_value(MISSING_ATTRIBUTE.format(field=name))
    return body[name]


def check_schemas(body: dict[str, Any]) -> None:
    schemas = required(body, "schemas")
    if not isinstance(schemas, list) or USER_SCHEMA not in schemas:
        raise invalid_value(SCHEMAS_WITHOUT_USER)


def parse_user_name(body: dict[str, Any]) -> str:
    value = required(body, "userName")
    if not isinstance(value, str) or len(value) > EMAIL_MAX or not re.match(EMAIL_RE, value):
        raise invalid_value(USER_NAME_NOT_EMAIL.format(value=quote(value)))
    return value


def parse_name(body: dict[str, Any]) -> tuple[str, str]:
    name = required(body, "name")
    if not isinstance(name, dict):
        raise invalid_value(WRONG_TYPE.format(field="name", expected="an object {givenName, familyName}"))
    parts = []
    for part in ("givenName", "familyName"):
        value = name.get(part)
        if value is None:
            raise invalid_value(MISSING_ATTRIBUTE.format(field=f"name.{part}"))
        if not isinstance(value, str) or not value.strip():
            raise invalid_value(WRONG_TYPE.format(field=f"name.{part}", expected="a non-empty string"))
        parts.append(value)
    return parts[0], parts[1]


def parse_department(body: dict[str, Any]) -> str:
    value = required(body, "department")
    if value not in DEPARTMENTS:
        raise invalid_value(UNKNOWN_DEPARTMENT.format(value=quote(value)))
    assert isinstance(value, str)
    return value


def parse_user(body: Any, d: Directory, stored: dict[str, Any] | None) -> dict[str, Any]:
    """The stored columns a POST (`stored` None) or PUT body sets, checked in the documented
    order: schemas, userName, name, department, permissions."""
    if not isinstance(body, dict):
        raise _Refused(400, BODY_NOT_OBJECT, "invalidSyntax")
    check_schemas(body)
    if stored is None:
        user_name = parse_user_name(body)
    else:
        user_name = stored["user_name"]
        sent = body.get("userName")
        if sent is not None and (not isinstance(sent, str) or sent.lower() != user_name.lower()):
            raise _Refused(400, USER_NAME_IMMUTABLE.format(stored=quote(user_name), sent=quote(sent)),
                           "mutability")
    given, family = parse_name(body)
    department = parse_department(body)
    permissions = parse_permissions(required(body, "permissions"), d)
    return {"user_name": user_name, "user_name_key": user_name.lower(), "given_name": given,
            "family_name": family, "department": department,
            "permissions": orjson.dumps(permissions).decode()}


# --- stored form to responses ---------------------------------------------------------------------
def format_time(moment: datetime | None) -> str | None:
    """ISO 8601 UTC with milliseconds, as the export formats timestamps."""
    if moment is None:
        return None
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def render_app_groups(stored: Any, d: Directory) -> list[dict[str, Any]]:
    out = []
    for g in stored:
        ws = d.workspaces[g["appGroupId"]]
        out.append({
            "appGroupName": ws.name,
            "appGroupId": ws.id,
            "appGroupPermissions": g["appGroupPermissions"],
            "team": [{"teamName": d.teams[t["teamId"]].name, "teamId": t["teamId"],
                      "teamPermissions": t["teamPermissions"]} for t in g["team"]],
            "appGroupPermissionSets": [
                {"appGroupPermissionSetName": d.permission_sets[s].name, "appGroupPermissionSetId": s,
                 "permissions": list(d.permission_sets[s].permissions)}
                for s in g["appGroupPermissionSets"]],
        })
    return out


def render_role(role: Entry, d: Directory) -> dict[str, Any]:
    return {"roleName": role.name, "roleId": role.id, "appGroup": render_app_groups(role.app_groups, d)}


def render_user(row: dict[str, Any], d: Directory) -> dict[str, Any]:
    """The SCIM User resource of one stored row."""
    perms = orjson.loads(row["permissions"])
    return {
        "schemas": [USER_SCHEMA],
        "id": row["id"],
        "userName": row["user_name"],
        "name": {"givenName": row["given_name"], "familyName": row["family_name"]},
        "department": row["department"],
        "lastSignInAt": format_time(row["last_sign_in_at"]),
        "permissions": {
            "companyPermissions": perms["companyPermissions"],
            "roles": [render_role(d.roles[r], d) for r in perms["roles"]],
            "appGroup": render_app_groups(perms["appGroup"], d),
        },
    }


# --- store access ---------------------------------------------------------------------------------
def find_row(state: State, column: str, value: str) -> dict[str, Any] | None:
    users = state["scim_users"]
    rows = users.filter(pl.col(column) == value).to_dicts()
    return rows[0] if rows else None


def existing_user(ctx: Context, user_id: str) -> dict[str, Any]:
    row = find_row(ctx.state, "id", user_id)
    if row is None:
        raise _Refused(404, USER_NOT_FOUND)
    return row


def created_count(state: State) -> int:
    """Users ever created in the store (deleted ones included)."""
    return state["scim_user_log"].filter(pl.col("op") == "create").height


def new_user_id(seed: str, n: int) -> str:
    """A UUID-shaped ID from the seed and the user's creation number (never reused)."""
    h = hashlib.sha256(f"{seed}:scim-user:{n}".encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def write_user(ctx: Context, row: dict[str, Any], op: str) -> None:
    changes = Changes()
    changes.upsert("scim_users", pl.DataFrame([row], schema=SCHEMAS["scim_users"]))
    changes.upsert("scim_user_log", log_row(row["id"], op, row["user_name"], ctx.clock))
    ctx.write(changes)


def log_row(user_id: str, op: str, user_name: str, at: datetime) -> pl.DataFrame:
    return pl.DataFrame({"id": [user_id], "op": [op], "user_name": [user_name], "at": [at]},
                        schema=SCHEMAS["scim_user_log"])


# --- handlers -------------------------------------------------------------------------------------
def scim_handler(answer: Callable[[Context, Request], Response]) -> Handler:
    """Turn a refusal raised anywhere in `answer` into its SCIM error response."""
    def handler(ctx: Context, req: Request) -> Response:
        try:
            return answer(ctx, req)
        except _Refused as refused:
            return refused.response
    handler.__name__ = answer.__name__
    handler.__doc__ = answer.__doc__
    return handler


@scim_handler
def create_user(ctx: Context, req: Request) -> Response:
    """POST /scim/v2/Users: 400s first, then 409 when the userName is taken."""
    d = Directory.from_state(ctx.state)
    fields = parse_user(req.body, d, None)
    taken = find_row(ctx.state, "user_name_key", fields["user_name_key"])
    if taken is not None:
        raise _Refused(409, USER_NAME_TAKEN.format(value=quote(fields["user_name"]), id=taken["id"]),
                       "uniqueness")
    n = created_count(ctx.state)
    row = {"id": new_user_id(ctx.seed, n), **fields, "last_sign_in_at": None,
           "created_at": ctx.clock, "created_seq": n, "updated_at": ctx.clock}
    write_user(ctx, row, "create")
    return Response(201, render_user(row, d))


@scim_handler
def get_user(ctx: Context, req: Request) -> Response:
    row = existing_user(ctx, req.params["id"])
    return Response(200, render_user(row, Directory.from_state(ctx.state)))


@scim_handler
def update_user(ctx: Context, req: Request) -> Response:
    """PUT /scim/v2/Users/{id}: replaces name, department and permissions."""
    stored = existing_user(ctx, req.params["id"])
    d = Directory.from_state(ctx.state)
    row = {**stored, **parse_user(req.body, d, stored), "updated_at": ctx.clock}
    write_user(ctx, row, "update")
    return Response(200, render_user(row, d))


@scim_handler
def delete_user(ctx: Context, req: Request) -> Response:
    row = existing_user(ctx, req.params["id"])
    changes = Changes()
    changes.delete("scim_users", pl.DataFrame({"id": [row["id"]]}))
    changes.upsert("scim_user_log", log_row(row["id"], "delete", row["user_name"], ctx.clock))
    ctx.write(changes)
    return Response(204, None)


FILTER_RE = re.compile(r'^\s*userName\s+eq\s+"((?:[^"\\]|\\.)*)"\s*$', re.IGNORECASE)


def parse_filter(raw: Any) -> str:
    """The email of `userName eq "<email>"` (attribute and operator case-insensitive, RFC 7644)."""
    match = FILTER_RE.match(raw) if isinstance(raw, str) else None
    if match is None:
        raise _Refused(400, BAD_FILTER.format(value=quote(raw)), "invalidFilter")
    try:
        value = orjson.loads(f'"{match.group(1)}"')
    except orjson.JSONDecodeError:
        raise _Refused(400, BAD_FILTER.format(value=quote(raw)), "invalidFilter") from None
    assert isinstance(value, str)
    return value


@scim_handler
def list_users(ctx: Context, req: Request) -> Response:
    """GET /scim/v2/Users[?filter=...]: without a filter, every user in creation order."""
    users = ctx.state["scim_users"].sort("created_seq")
    if "filter" in req.query:
        users = users.filter(pl.col("user_name_key") == parse_filter(req.query["filter"]).lower())
    d = Directory.from_state(ctx.state)
    resources = [render_user(row, d) for row in users.to_dicts()]
    return Response(200, {"schemas": [LIST_SCHEMA], "totalResults": len(resources), "Resources": resources})


ROUTES: dict[str, dict[str, Handler]] = {
    USERS_PATH: {"POST": create_user, "GET": list_users},
    USERS_PATH + "/{id}": {"GET": get_user, "PUT": update_user, "DELETE": delete_user},
}


# --- the directory file ---------------------------------------------------------------------------
def read_directory(source: str | Path | Mapping[str, Any]) -> Mapping[str, Any]:
    """A directory from a mapping, or from a JSON or YAML file (YAML is a superset of JSON)."""
    if isinstance(source, Mapping):
        return source
    try:
        data = yaml.safe_load(Path(source).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(DIRECTORY_BAD_FILE.format(source=source, reason=exc)) from None
    if not isinstance(data, Mapping):
        raise ConfigError(DIRECTORY_NOT_MAPPING.format(source=source))
    return data


def directory_id(seed: str, kind: str, *names: str) -> str:
    """A stable ID for an entry given without one: 24 hex characters from its kind and name."""
    key = ":".join((seed, "scim", kind, *(n.casefold() for n in names)))
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def directory_list(raw: Any, where: str) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(DIRECTORY_BAD_LIST.format(where=where))
    return raw


def directory_entry(item: Any, where: str) -> dict[str, Any]:
    """An entry as an object; a bare string is a name."""
    entry = {"name": item} if isinstance(item, str) else item
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"].strip():
        raise ConfigError(DIRECTORY_BAD_ENTRY.format(where=where))
    if "id" in entry and not (isinstance(entry["id"], str) and entry["id"]):
        raise ConfigError(DIRECTORY_BAD_ID.format(where=where))
    return entry


def entry_id(entry: dict[str, Any], entries: dict[str, Entry], scope: str | None, seed: str,
             kind: str) -> str:
    """The given ID; else the ID of the entry already named so (a reload updates it); else derived."""
    if "id" in entry:
        return str(entry["id"])
    name = entry["name"].casefold()
    same = next((e.id for e in entries.values() if e.scope == scope and e.name.casefold() == name), None)
    return same or directory_id(seed, kind, *([scope] if scope else []), entry["name"])


def claim(seen: dict[str, str], ident: str, where: str, name: str) -> None:
    """Refuse a second entry of one file that lands on the same ID as an earlier one."""
    if ident in seen:
        raise ConfigError(DIRECTORY_REPEATED.format(where=where, name=quote(name), first=seen[ident]))
    seen[ident] = where


def directory_permissions(raw: Any, known: set[str], where: str) -> tuple[str, ...]:
    out: list[str] = []
    for i, value in enumerate(directory_list(raw, where)):
        if not isinstance(value, str) or not value:
            raise ConfigError(DIRECTORY_BAD_PERMISSION.format(where=f"{where}[{i}]"))
        if value not in known:
            raise ConfigError(DIRECTORY_UNKNOWN_PERMISSION.format(where=f"{where}[{i}]", value=quote(value)))
        if value not in out:
            out.append(value)
    return tuple(out)


def merge_workspaces(d: Directory, raw: Any, seed: str) -> None:
    """Add the file's workspaces with their teams and permission sets to `d`."""
    seen: dict[str, str] = {}
    for i, item in enumerate(directory_list(raw, "workspaces")):
        where = f"workspaces[{i}]"
        entry = directory_entry(item, where)
        ws = Entry(entry_id(entry, d.workspaces, None, seed, "workspace"), entry["name"])
        claim(seen, ws.id, where, ws.name)
        d.workspaces[ws.id] = ws
        for j, t in enumerate(directory_list(entry.get("teams"), f"{where}.teams")):
            team = directory_entry(t, f"{where}.teams[{j}]")
            team_id = entry_id(team, d.teams, ws.id, seed, "team")
            claim(seen, "team:" + team_id, f"{where}.teams[{j}]", team["name"])
            d.teams[team_id] = Entry(team_id, team["name"], ws.id)
        for j, s in enumerate(directory_list(entry.get("permission_sets"), f"{where}.permission_sets")):
            at = f"{where}.permission_sets[{j}]"
            pset = directory_entry(s, at)
            set_id = entry_id(pset, d.permission_sets, ws.id, seed, "permission_set")
            claim(seen, "set:" + set_id, at, pset["name"])
            d.permission_sets[set_id] = Entry(
                set_id, pset["name"], ws.id, directory_permissions(pset.get("permissions"), d.permissions,
                                                                   f"{at}.permissions"))


def merge_roles(d: Directory, raw: Any, seed: str) -> None:
    """Add the file's roles to `d`; a role's `appGroup` is shaped as a user's `permissions.appGroup`."""
    seen: dict[str, str] = {}
    for i, item in enumerate(directory_list(raw, "roles")):
        entry = directory_entry(item, f"roles[{i}]")
        try:
            app_groups = parse_app_groups(entry.get("appGroup"), d, "appGroup")
        except _Refused as refused:
            raise ConfigError(DIRECTORY_BAD_ROLE.format(
                index=i, name=quote(entry["name"]), detail=refused.response.body["detail"])) from None
        role_id = entry_id(entry, d.roles, None, seed, "role")
        claim(seen, role_id, f"roles[{i}]", entry["name"])
        d.roles[role_id] = Entry(role_id, entry["name"], app_groups=tuple(app_groups))


def check_unique_names(d: Directory) -> None:
    for entries, plural in ((d.workspaces, "workspaces"), (d.teams, "teams"),
                            (d.permission_sets, "permission sets"), (d.roles, "roles")):
        seen: set[tuple[str | None, str]] = set()
        for e in entries.values():
            key = (e.scope, e.name.casefold())
            if key in seen:
                scope = f" in workspace {quote(d.workspaces[e.scope].name)}" if e.scope else ""
                raise ConfigError(DIRECTORY_DUPLICATE_NAME.format(plural=plural, name=quote(e.name), scope=scope))
            seen.add(key)


def merged_directory(state: State, data: Mapping[str, Any], seed: str) -> Directory:
    """The stored directory with the file's entries added or updated (by ID; nothing removed)."""
    extra = set(data) - {"permissions", "workspaces", "roles"}
    if extra:
        raise ConfigError(DIRECTORY_UNKNOWN_KEYS.format(keys=", ".join(sorted(map(str, extra)))))
    d = Directory.from_state(state)
    for i, value in enumerate(directory_list(data.get("permissions"), "permissions")):
        if not isinstance(value, str) or not value:
            raise ConfigError(DIRECTORY_BAD_PERMISSION.format(where=f"permissions[{i}]"))
        d.permissions.add(value)
    merge_workspaces(d, data.get("workspaces"), seed)
    merge_roles(d, data.get("roles"), seed)
    check_unique_names(d)
    return d


def directory_changes(d: Directory) -> Changes:
    """The whole directory as upserts (small tables; unchanged rows are rewritten unchanged)."""
    changes = Changes()
    changes.upsert("scim_permissions", pl.DataFrame({"permission": sorted(d.permissions)},
                                                   schema=SCHEMAS["scim_permissions"]))
    changes.upsert("scim_workspaces", pl.DataFrame(
        [{"app_group_id": e.id, "name": e.name} for e in d.workspaces.values()], schema=SCHEMAS["scim_workspaces"]))
    changes.upsert("scim_teams", pl.DataFrame(
        [{"team_id": e.id, "app_group_id": e.scope, "name": e.name} for e in d.teams.values()],
        schema=SCHEMAS["scim_teams"]))
    changes.upsert("scim_permission_sets", pl.DataFrame(
        [{"permission_set_id": e.id, "app_group_id": e.scope, "name": e.name,
          "permissions": orjson.dumps(list(e.permissions)).decode()} for e in d.permission_sets.values()],
        schema=SCHEMAS["scim_permission_sets"]))
    changes.upsert("scim_roles", pl.DataFrame(
        [{"role_id": e.id, "name": e.name, "app_groups": orjson.dumps(list(e.app_groups)).decode()}
         for e in d.roles.values()], schema=SCHEMAS["scim_roles"]))
    return changes


def describe_directory(d: Directory) -> dict[str, Any]:
    """The directory in the file format, with every ID (loadable again)."""
    def by_name(entries: Any) -> list[Entry]:
        return sorted(entries, key=lambda e: (e.name.casefold(), e.id))
    return {
        "permissions": sorted(d.permissions),
        "workspaces": [
            {"id": ws.id, "name": ws.name,
             "teams": [{"id": t.id, "name": t.name} for t in by_name(d.teams.values()) if t.scope == ws.id],
             "permission_sets": [{"id": s.id, "name": s.name, "permissions": list(s.permissions)}
                                 for s in by_name(d.permission_sets.values()) if s.scope == ws.id]}
            for ws in by_name(d.workspaces.values())],
        "roles": [{"id": r.id, "name": r.name, "appGroup": render_app_groups(r.app_groups, d)}
                  for r in by_name(d.roles.values())],
    }


# --- the friendly class ---------------------------------------------------------------------------
class Scim:
    """Friendly methods over `Workspace.call` for SCIM dashboard users (`ws.scim`), and the
    library-level directory loader. Failed requests raise `ScimError` (status and SCIM body)."""

    def __init__(self, ws: Client):
        self.ws = ws

    def _ok(self, response: Response, status: int) -> Any:
        if response.status != status:
            raise ScimError(response)
        return response.body

    def create_user(self, user_name: str, *, given_name: str, family_name: str, department: str,
                    permissions: dict[str, Any] | None = None) -> dict[str, Any]:
        """POST /scim/v2/Users; `permissions` in the SCIM shape (names or IDs)."""
        body = {"schemas": [USER_SCHEMA], "userName": user_name,
                "name": {"givenName": given_name, "familyName": family_name},
                "department": department, "permissions": permissions or {}}
        return self._ok(self.ws.call("POST", USERS_PATH, body=body), 201)  # type: ignore[no-any-return]

    def get_user(self, user_id: str) -> dict[str, Any] | None:
        """The user, or None when no user has this ID."""
        response = self.ws.call("GET", f"{USERS_PATH}/{user_id}")
        return None if response.status == 404 else self._ok(response, 200)

    def find_user(self, email: str) -> dict[str, Any] | None:
        """The user whose userName is `email` (case-insensitive), or None."""
        query = {"filter": f"userName eq {quote(email)}"}
        found = self._ok(self.ws.call("GET", USERS_PATH, query=query), 200)
        return found["Resources"][0] if found["Resources"] else None

    def update_user(self, user_id: str, *, given_name: str | None = None, family_name: str | None = None,
                    department: str | None = None, permissions: dict[str, Any] | None = None) -> dict[str, Any]:
        """PUT /scim/v2/Users/{id} with the given fields; those left out keep their values."""
        current = self._ok(self.ws.call("GET", f"{USERS_PATH}/{user_id}"), 200)
        name = current["name"]
        body = {"schemas": [USER_SCHEMA],
                "name": {"givenName": given_name if given_name is not None else name["givenName"],
                         "familyName": family_name if family_name is not None else name["familyName"]},
                "department": department if department is not None else current["department"],
                "permissions": permissions if permissions is not None else current["permissions"]}
        return self._ok(self.ws.call("PUT", f"{USERS_PATH}/{user_id}", body=body), 200)  # type: ignore[no-any-return]

    def delete_user(self, user_id: str) -> None:
        self._ok(self.ws.call("DELETE", f"{USERS_PATH}/{user_id}"), 204)

    def list_users(self) -> list[dict[str, Any]]:
        """Every dashboard user, in creation order."""
        return self._ok(self.ws.call("GET", USERS_PATH), 200)["Resources"]  # type: ignore[no-any-return]

    def load_directory(self, source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
        """Add or update the company directory from a JSON/YAML file or a mapping (entries match
        by ID, else by name; nothing is removed). Returns the directory with its IDs."""
        data = read_directory(source)
        self.ws.write(lambda ctx: ctx.write(directory_changes(merged_directory(ctx.state, data, ctx.seed))))
        return self.directory()

    def directory(self) -> dict[str, Any]:
        """The company directory in the file format, with IDs."""
        return describe_directory(Directory.from_state(self.ws.state))

    def record_sign_in(self, user_id: str, at: datetime | None = None) -> dict[str, Any]:
        """Set the user's `lastSignInAt` (default: the workspace clock); returns the user."""
        def build(ctx: Context) -> None:
            row = find_row(ctx.state, "id", user_id)
            if row is None:
                raise ScimError(_Refused(404, USER_NOT_FOUND).response)
            write_user(ctx, {**row, "last_sign_in_at": at or ctx.clock}, "sign_in")
        self.ws.write(build)
        user = self.get_user(user_id)
        assert user is not None
        return user
