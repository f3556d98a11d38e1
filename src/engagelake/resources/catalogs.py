"""Catalogs: definitions (`POST /catalogs`, `GET /catalogs`) and their items
(`PUT` and `DELETE /catalogs/{catalog_name}/items`).

Validation collects every problem of a request before answering, so one 400 names them all:
`{"errors": [{id, message, parameters, parameter_values}], "message": "Invalid Request"}`, one
error object per error id (in the order of the tables below), where `parameters[i]` says where
the problem is (`items`, `id` or a field name) and `parameter_values[i]` which one (an index, the
offending ID, or the ID of the offending item). Decisions: docs/catalogs.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
import polars as pl

from engagelake.errors import ConfigError, RequestError
from engagelake.routing import Client, Context, Handler, Request, Response
from engagelake.rules.state import Changes, State

FIELD_TYPES = ("string", "number", "boolean", "time", "array", "object")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]+$")  # catalog names, field names and item IDs
NUMBER_PATTERN = re.compile(r"^-?\d+(\.\d+)?([eE][+-]?\d+)?$", re.ASCII)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_ITEMS = 50
MAX_ID_LENGTH = 250
MAX_VALUE_LENGTH = 5000
MAX_NESTING = 50
MAX_NAME_LENGTH = 250
MAX_DESCRIPTION_LENGTH = 250
MAX_FIELDS = 500

INVALID_REQUEST = "Invalid Request"
SUCCESS = "success"

# --- item errors, in reporting order -----------------------------------------------------------
CATALOG_NOT_FOUND = "catalog-not-found"
ITEM_ERRORS: dict[str, str] = {
    CATALOG_NOT_FOUND: "Could not find catalog; create it first with POST /catalogs",
    "item-array-invalid": "items must be an array of objects",
    "request-includes-too-many-items": "send at most 50 items per request",
    "items-missing-ids": "every item needs an id",
    "ids-not-string": "item IDs must be strings",
    "ids-not-strings": "item IDs must be strings",
    "ids-too-large": "item IDs must be at most 250 characters",
    "invalid-ids": "item IDs may contain only letters, numbers, hyphens and underscores",
    "ids-not-unique": "each item ID may appear only once per request",
    "invalid-fields": "send only fields that exist in the catalog (parameter_values name the items)",
    "items-too-large": "item values must be at most 5,000 characters",
    "invalid-keys-in-value-object": "object keys inside item values may not contain '.' or '$'",
    "too-deep-nesting-in-value-object": "item values may nest at most 50 levels",
    "unable-to-coerce-value": "item values must match (or convert to) the field's type",
}

# --- catalog definition errors (POST /catalogs), in reporting order ----------------------------
CREATE_ERRORS: dict[str, str] = {
    "catalog-array-invalid": "catalogs must be an array holding one {name, description, fields} object",
    "only-one-catalog-allowed": "send exactly one catalog per request",
    "invalid-catalog-name": "catalog names may contain only letters, numbers, hyphens and underscores",
    "catalog-name-too-large": "catalog names must be at most 250 characters",
    "catalog-name-already-exists": "a catalog with this name exists; choose another name",
    "invalid-description": "description must be a string",
    "description-too-long": "descriptions must be at most 250 characters",
    "invalid-fields": "fields must be an array of {name, type} objects with string values",
    "too-many-fields": "a catalog has at most 500 fields",
    "id-not-first-column": 'the first field must be {"name": "id", "type": "string"}',
    "invalid-field-names": "field names may contain only letters, numbers, hyphens and underscores",
    "field-names-too-large": "field names must be at most 250 characters",
    "field-names-not-unique": "field names must be unique",
    "invalid-field-types": "field types must be one of string, number, boolean, time, array, object",
}

# Library-level messages.
UNKNOWN_CATALOG = "no catalog named {name!r}; catalogs: {known}"
REQUEST_FAILED = "{method} {path} answered {status}: {details}"

Problems = dict[str, list[tuple[Any, Any]]]  # error id -> (parameter, parameter value) pairs


def note(problems: Problems, error_id: str, parameter: Any, value: Any) -> None:
    """Record one (parameter, value) pair under an error id, once."""
    pairs = problems.setdefault(error_id, [])
    if (parameter, value) not in pairs:
        pairs.append((parameter, value))


def invalid_request(problems: Problems, messages: dict[str, str], status: int = 400) -> Response:
    """The error body: one object per error id, in the order of `messages`."""
    errors = [
        {"id": error_id, "message": message,
         "parameters": [p for p, _ in problems[error_id]],
         "parameter_values": [v for _, v in problems[error_id]]}
        for error_id, message in messages.items() if problems.get(error_id)
    ]
    return Response(status, {"errors": errors, "message": INVALID_REQUEST})


def format_time(moment: datetime) -> str:
    """ISO 8601 UTC with milliseconds, as the export writes timestamps."""
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


# --- reading the store -------------------------------------------------------------------------
def find_catalog(state: State, name: str) -> dict[str, Any] | None:
    """The stored definition row of a catalog, or None."""
    rows = state["catalogs"].filter(pl.col("name") == name)
    return rows.row(0, named=True) if rows.height else None


def field_types(catalog: Mapping[str, Any]) -> dict[str, str]:
    """{field name: type} in definition order, `id` first."""
    return {f["name"]: f["type"] for f in orjson.loads(catalog["fields"])}


def describe_catalog(state: State, catalog: Mapping[str, Any]) -> dict[str, Any]:
    """A catalog as the catalog endpoints answer it."""
    items = state["catalog_items"]
    return {
        "name": catalog["name"],
        "description": catalog["description"],
        "fields": orjson.loads(catalog["fields"]),
        "num_items": items.filter(pl.col("catalog") == catalog["name"]).height,
        "updated_at": format_time(catalog["updated_at"]),
    }


def catalog_not_found(name: str) -> Response:
    """404 for an unknown catalog, with the `catalog-not-found` error object."""
    return invalid_request({CATALOG_NOT_FOUND: [("catalog_name", name)]}, ITEM_ERRORS, status=404)


# --- value checks ------------------------------------------------------------------------------
def inspect_nested(value: dict[str, Any] | list[Any]) -> tuple[int, bool, bool]:
    """(nesting depth, whether some object key holds '.' or '$', whether some number is not
    finite) of an object or array value. Iterative: a hostile value may nest deeper than
    Python's recursion limit."""
    deepest, bad_keys, non_finite = 0, False, False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, dict):
            bad_keys = bad_keys or any("." in key or "$" in key for key in node)
            children: Iterable[Any] = node.values()
        else:
            children = node
        for child in children:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
            elif isinstance(child, float) and not math.isfinite(child):
                non_finite = True
    return deepest, bad_keys, non_finite


def value_length(value: Any) -> int:
    """Characters a value takes: a string's length, else its compact JSON's."""
    return len(value) if isinstance(value, str) else len(orjson.dumps(value))


class Uncoercible(Exception):
    """A value that cannot be converted to its field's type."""


def coerce_value(field_type: str, value: Any) -> Any:
    """The value converted to the field type (`"12"` -> 12 for a number), or raise Uncoercible."""
    if value is None:
        return None
    if field_type == "string":
        if isinstance(value, str):
            return value
        if isinstance(value, bool | int | float):  # 12 -> "12", true -> "true"
            return orjson.dumps(_stored_number(value)).decode()
    elif field_type == "number":
        if isinstance(value, int | float) and not isinstance(value, bool):
            return _stored_number(value)
        if isinstance(value, str) and NUMBER_PATTERN.match(value.strip()):
            text = value.strip()
            return _stored_number(int(text) if text.lstrip("-").isdigit() else float(text))
    elif field_type == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
    elif field_type == "time":
        if isinstance(value, str):
            return coerce_time(value)
    elif field_type == "array" and isinstance(value, list):
        return value
    elif field_type == "object" and isinstance(value, dict):
        return value
    raise Uncoercible(value)


def _stored_number(value: int | float) -> int | float:
    """A number as the store keeps it (JSON, 64-bit): an integer beyond 64 bits, or a float
    beyond a double's range (`"1e999"`) or NaN, has no such form: it is not coerced (never
    stored as null or rounded without a word)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise Uncoercible(value)
    if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
        raise Uncoercible(value)
    return value


def coerce_time(text: str) -> str:
    """An ISO 8601 date or datetime as UTC with milliseconds (no offset: UTC)."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise Uncoercible(text) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return format_time(moment)


def check_value(field: str, field_type: str, value: Any, item_id: Any, problems: Problems) -> Any:
    """The coerced value of one field of one item; problems are noted (the value is then None)."""
    if value is None:
        return None
    if value_length(value) > MAX_VALUE_LENGTH:
        note(problems, "items-too-large", field, item_id)
        return None
    if isinstance(value, dict | list):
        depth, bad_keys, non_finite = inspect_nested(value)
        if bad_keys:
            note(problems, "invalid-keys-in-value-object", field, item_id)
        if depth > MAX_NESTING:
            note(problems, "too-deep-nesting-in-value-object", field, item_id)
        if non_finite:  # JSON has no Infinity or NaN: it would be stored as null
            note(problems, "unable-to-coerce-value", field, item_id)
        if bad_keys or depth > MAX_NESTING or non_finite:
            return None
    try:
        return coerce_value(field_type, value)
    except Uncoercible:
        note(problems, "unable-to-coerce-value", field, item_id)
        return None


# --- item request checks -----------------------------------------------------------------------
def read_items(body: Any, problems: Problems) -> list[tuple[int, dict[str, Any]]]:
    """(index, item) of every object in `items`; shape problems are noted."""
    items = body.get("items") if isinstance(body, dict) else None
    if not isinstance(items, list):
        note(problems, "item-array-invalid", "items", items)
        return []
    if len(items) > MAX_ITEMS:
        note(problems, "request-includes-too-many-items", "items", len(items))
    objects = []
    for index, item in enumerate(items):
        if isinstance(item, dict):
            objects.append((index, item))
        else:
            note(problems, "item-array-invalid", "items", index)
    return objects


def check_ids(items: list[tuple[int, dict[str, Any]]], not_string_id: str, problems: Problems) -> None:
    """Note missing, non-string, too long, malformed and repeated item IDs."""
    seen: set[str] = set()
    for index, item in items:
        if "id" not in item:
            note(problems, "items-missing-ids", "items", index)
            continue
        item_id = item["id"]
        if not isinstance(item_id, str):
            note(problems, not_string_id, "id", item_id)
            continue
        if len(item_id) > MAX_ID_LENGTH:
            note(problems, "ids-too-large", "id", item_id)
        if not NAME_PATTERN.match(item_id):
            note(problems, "invalid-ids", "id", item_id)
        if item_id in seen:
            note(problems, "ids-not-unique", "id", item_id)
        seen.add(item_id)


def check_item(item: dict[str, Any], fields: dict[str, str], problems: Problems) -> dict[str, Any]:
    """The whole stored item: `id`, then every catalog field (coerced, null when not sent)."""
    item_id = item.get("id")
    for key in item:
        if key not in fields:
            note(problems, "invalid-fields", key, item_id)
    values = {field: check_value(field, fields[field], item.get(field), item_id, problems)
              for field in fields if field != "id"}
    return {"id": item_id, **values}


# --- handlers ----------------------------------------------------------------------------------
def put_items(ctx: Context, req: Request) -> Response:
    """Create or fully replace up to 50 items (fields not sent become null); 202 when valid."""
    name = req.params["catalog_name"]
    catalog = find_catalog(ctx.state, name)
    if catalog is None:
        return catalog_not_found(name)
    problems: Problems = {}
    items = read_items(req.body, problems)
    check_ids(items, "ids-not-string", problems)
    fields = field_types(catalog)
    stored = [check_item(item, fields, problems) for _, item in items]
    if problems:
        return invalid_request(problems, ITEM_ERRORS)
    changes = Changes()
    changes.upsert("catalog_items", pl.DataFrame({
        "catalog": [name] * len(stored),
        "id": [item["id"] for item in stored],
        "item": [orjson.dumps(item).decode() for item in stored],
        "updated_at": [ctx.clock] * len(stored),
    }))
    ctx.write(changes)
    return Response(202, {"message": SUCCESS})


def delete_items(ctx: Context, req: Request) -> Response:
    """Delete up to 50 items by ID (unknown IDs are ignored); 202 when valid."""
    name = req.params["catalog_name"]
    if find_catalog(ctx.state, name) is None:
        return catalog_not_found(name)
    problems: Problems = {}
    items = read_items(req.body, problems)
    check_ids(items, "ids-not-strings", problems)
    if problems:
        return invalid_request(problems, ITEM_ERRORS)
    changes = Changes()
    ids = [item["id"] for _, item in items]
    changes.delete("catalog_items", pl.DataFrame({"catalog": [name] * len(ids), "id": ids}))
    ctx.write(changes)
    return Response(202, {"message": SUCCESS})


def read_catalog(body: Any, problems: Problems) -> dict[str, Any] | None:
    """The one catalog object of a create body, or None (problems noted)."""
    catalogs = body.get("catalogs") if isinstance(body, dict) else None
    if not isinstance(catalogs, list) or not catalogs:
        note(problems, "catalog-array-invalid", "catalogs", catalogs)
        return None
    if len(catalogs) > 1:
        note(problems, "only-one-catalog-allowed", "catalogs", len(catalogs))
        return None
    if not isinstance(catalogs[0], dict):
        note(problems, "catalog-array-invalid", "catalogs", 0)
        return None
    return catalogs[0]


def check_catalog_name(state: State, name: Any, problems: Problems) -> None:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        note(problems, "invalid-catalog-name", "name", name)
    elif len(name) > MAX_NAME_LENGTH:
        note(problems, "catalog-name-too-large", "name", name)
    elif find_catalog(state, name) is not None:
        note(problems, "catalog-name-already-exists", "name", name)


def check_description(description: Any, problems: Problems) -> None:
    if not isinstance(description, str):
        note(problems, "invalid-description", "description", description)
    elif len(description) > MAX_DESCRIPTION_LENGTH:
        note(problems, "description-too-long", "description", len(description))


def is_field(field: Any) -> bool:
    """A `{name, type}` object with string values and no other keys."""
    return (isinstance(field, dict) and set(field) == {"name", "type"}
            and isinstance(field["name"], str) and isinstance(field["type"], str))


def check_fields(fields: Any, problems: Problems) -> None:
    """Note every problem of a definition's `fields` array."""
    if not isinstance(fields, list) or not fields:
        note(problems, "invalid-fields", "fields", fields)
        return
    if len(fields) > MAX_FIELDS:
        note(problems, "too-many-fields", "fields", len(fields))
    if fields[0] != {"name": "id", "type": "string"}:
        first = fields[0].get("name") if isinstance(fields[0], dict) else fields[0]
        note(problems, "id-not-first-column", "fields", first)
    seen: set[str] = set()
    for index, field in enumerate(fields):
        if not is_field(field):
            note(problems, "invalid-fields", "fields", index)
            continue
        name, field_type = field["name"], field["type"]
        if not NAME_PATTERN.match(name):
            note(problems, "invalid-field-names", "fields", name)
        if len(name) > MAX_NAME_LENGTH:
            note(problems, "field-names-too-large", "fields", name)
        if name in seen:
            note(problems, "field-names-not-unique", "fields", name)
        seen.add(name)
        if field_type not in FIELD_TYPES:
            note(problems, "invalid-field-types", name, field_type)


def post_catalogs(ctx: Context, req: Request) -> Response:
    """Define one catalog: 201 with the catalog, or 400 naming every problem."""
    problems: Problems = {}
    catalog = read_catalog(req.body, problems)
    if catalog is not None:
        check_catalog_name(ctx.state, catalog.get("name"), problems)
        check_description(catalog.get("description", ""), problems)
        check_fields(catalog.get("fields"), problems)
    if problems or catalog is None:
        return invalid_request(problems, CREATE_ERRORS)
    row = {
        "name": catalog["name"], "description": catalog.get("description", ""),
        "fields": orjson.dumps([{"name": f["name"], "type": f["type"]} for f in catalog["fields"]]).decode(),
        "created_at": ctx.clock, "updated_at": ctx.clock,
    }
    changes = Changes()
    changes.upsert("catalogs", pl.DataFrame([row]))
    ctx.write(changes)
    return Response(201, {"catalogs": [describe_catalog(ctx.state, row)], "message": SUCCESS})


def get_catalogs(ctx: Context, req: Request) -> Response:
    """Every catalog definition, by name."""
    rows = ctx.state["catalogs"].sort("name").iter_rows(named=True)
    return Response(200, {"catalogs": [describe_catalog(ctx.state, row) for row in rows], "message": SUCCESS})


# Handlers that judge numbers JSON cannot carry (Infinity, NaN) themselves, with their own
# error; the dispatch refuses those numbers for every other endpoint.
CHECKS_NUMBERS: tuple[Handler, ...] = (put_items,)
ROUTES: dict[str, dict[str, Handler]] = {
    "/catalogs": {"GET": get_catalogs, "POST": post_catalogs},
    "/catalogs/{catalog_name}/items": {"PUT": put_items, "DELETE": delete_items},
}


# --- library -----------------------------------------------------------------------------------
def describe_error(error: Mapping[str, Any]) -> str:
    """`invalid-ids (id='a b', id='c$')`: an error object in one line."""
    pairs = zip(error["parameters"], error["parameter_values"], strict=True)
    return f"{error['id']} ({', '.join(f'{p}={v!r}' for p, v in pairs)})"


def raise_for_response(method: str, path: str, response: Response) -> Any:
    """The body of a successful answer; a RequestError naming every error otherwise."""
    if response.status < 400:
        return response.body
    body = response.body if isinstance(response.body, dict) else {}
    details = "; ".join(describe_error(e) for e in body.get("errors", [])) or str(response.body)
    raise RequestError(REQUEST_FAILED.format(method=method, path=path, status=response.status, details=details),
                       response.status, response.body)


POLARS_TYPES: dict[str, pl.DataType] = {
    "string": pl.String(), "number": pl.Float64(), "boolean": pl.Boolean(),
    "time": pl.Datetime("us", "UTC"), "array": pl.String(), "object": pl.String(),
}


def typed_column(field_type: str, values: list[Any]) -> pl.Series:
    """One item field as a typed column: arrays and objects as JSON text, times as datetimes."""
    if field_type in ("array", "object"):
        values = [None if v is None else orjson.dumps(v).decode() for v in values]
    elif field_type == "time":
        values = [None if v is None else datetime.fromisoformat(v) for v in values]
    return pl.Series(values, dtype=POLARS_TYPES[field_type])


class Catalogs:
    """Friendly methods over `Workspace.call` for catalogs (`ws.catalogs`). Writes raise
    ConfigError with every error id when the API answers 4xx."""

    def __init__(self, ws: Client):
        self.ws = ws

    def create(self, name: str, fields: Sequence[Mapping[str, str]] | Mapping[str, str], *,
               description: str = "") -> dict[str, Any]:
        """Define a catalog through `POST /catalogs`; `fields` as [{name, type}] or {name: type}.
        The `id` field is added first when not given."""
        listed = ([{"name": n, "type": t} for n, t in fields.items()] if isinstance(fields, Mapping)
                  else [dict(f) for f in fields])
        if not listed or listed[0].get("name") != "id":
            listed.insert(0, {"name": "id", "type": "string"})
        body = {"catalogs": [{"name": name, "description": description, "fields": listed}]}
        out = raise_for_response("POST", "/catalogs", self.ws.call("POST", "/catalogs", body=body))
        return dict(out["catalogs"][0])

    def definitions(self) -> list[dict[str, Any]]:
        """Every catalog definition (`GET /catalogs`)."""
        return list(self.ws.call("GET", "/catalogs").body["catalogs"])

    def replace_items(self, name: str, items: Sequence[Mapping[str, Any]]) -> None:
        """Create or fully replace items (`PUT /catalogs/{name}/items`)."""
        path = f"/catalogs/{name}/items"
        raise_for_response("PUT", path, self.ws.call("PUT", path, body={"items": [dict(i) for i in items]}))

    def delete_items(self, name: str, ids: Iterable[str]) -> None:
        """Delete items by ID (`DELETE /catalogs/{name}/items`)."""
        path = f"/catalogs/{name}/items"
        body = {"items": [{"id": item_id} for item_id in ids]}
        raise_for_response("DELETE", path, self.ws.call("DELETE", path, body=body))

    def items(self, name: str) -> pl.DataFrame:
        """The catalog's items, one typed column per field, sorted by id."""
        state = self.ws.state
        catalog = find_catalog(state, name)
        if catalog is None:
            known = ", ".join(state["catalogs"]["name"].sort().to_list()) or "(none)"
            raise ConfigError(UNKNOWN_CATALOG.format(name=name, known=known))
        fields = field_types(catalog)
        rows = state["catalog_items"].filter(pl.col("catalog") == name).sort("id")
        items = [orjson.loads(text) for text in rows["item"]]
        return pl.DataFrame([typed_column(t, [i.get(f) for i in items]).alias(f) for f, t in fields.items()])
