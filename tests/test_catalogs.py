"""Catalogs end to end: `POST`/`GET /catalogs`, `PUT`/`DELETE /catalogs/{name}/items`, the
store tables behind them (DuckDB through `ws.sql`) and the friendly `ws.catalogs` methods."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from tests.helpers import NOW, SEED, copy_of, open_ws

from engagelake import Response, Workspace
from engagelake.errors import ConfigError, RequestError
from engagelake.resources.catalogs import CREATE_ERRORS, ITEM_ERRORS

CAT = "restaurants"
ITEMS = f"/catalogs/{CAT}/items"
FIELDS = [
    {"name": "id", "type": "string"}, {"name": "Name", "type": "string"},
    {"name": "Rating", "type": "number"}, {"name": "Open", "type": "boolean"},
    {"name": "Since", "type": "time"}, {"name": "Dishes", "type": "array"},
    {"name": "Location", "type": "object"},
]
NULLS = {"Name": None, "Rating": None, "Open": None, "Since": None, "Dishes": None, "Location": None}
SUCCESS = Response(202, {"message": "success"})
STAMP = "2026-11-22T12:00:00.000Z"


def define(name: str = CAT, fields: Any = FIELDS, description: Any = "My Restaurants") -> dict[str, Any]:
    return {"catalogs": [{"name": name, "description": description, "fields": fields}]}


def error(error_id: str, parameters: list[Any], values: list[Any], table: dict[str, str] = ITEM_ERRORS) -> dict[str, Any]:
    return {"id": error_id, "message": table[error_id], "parameters": parameters, "parameter_values": values}


def invalid(*errors: dict[str, Any]) -> Response:
    return Response(400, {"errors": list(errors), "message": "Invalid Request"})


def stored(ws: Workspace, catalog: str = CAT) -> dict[str, dict[str, Any]]:
    """id -> the stored item, read with DuckDB's JSON functions through `ws.sql`."""
    import orjson

    rows = ws.sql(f"select id, item from catalog_items where catalog = '{catalog}' order by id").rows()
    return {item_id: orjson.loads(text) for item_id, text in rows}


@pytest.fixture
def ws(tmp_path):
    """A store holding the catalog of `define()`: a copy of one built once."""
    return copy_of(tmp_path, _defined)


def _defined(w: Workspace) -> None:
    assert w.call("POST", "/catalogs", body=define()).status == 201


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One store for requests that must write nothing (400s, 404s)."""
    w = open_ws(tmp_path_factory.mktemp("catalogs"))
    assert w.call("POST", "/catalogs", body=define()).status == 201
    assert w.call("PUT", ITEMS, body={"items": [{"id": "keep", "Name": "Kept"}]}) == SUCCESS
    return w


# --- catalog definitions -------------------------------------------------------------------------
def test_post_catalogs_answers_201_with_the_catalog(tmp_path):
    w = open_ws(tmp_path)
    r = w.call("POST", "/catalogs", body=define())
    assert r == Response(201, {"catalogs": [{
        "name": CAT, "description": "My Restaurants", "fields": FIELDS, "num_items": 0, "updated_at": STAMP,
    }], "message": "success"})
    assert w.call("GET", "/catalogs") == Response(200, {"catalogs": r.body["catalogs"], "message": "success"})


def test_get_catalogs_lists_by_name_with_item_counts(ws):
    assert ws.call("POST", "/catalogs", body=define("a-first", FIELDS[:2], "")).status == 201
    assert ws.call("PUT", ITEMS, body={"items": [{"id": "r1"}, {"id": "r2"}]}) == SUCCESS
    r = ws.call("GET", "/catalogs")
    assert r.status == 200
    assert [(c["name"], c["num_items"], c["description"]) for c in r.body["catalogs"]] == [
        ("a-first", 0, ""), (CAT, 2, "My Restaurants")]


def test_description_is_optional(tmp_path):
    w = open_ws(tmp_path)
    r = w.call("POST", "/catalogs", body={"catalogs": [{"name": "c", "fields": FIELDS[:1]}]})
    assert r.status == 201 and r.body["catalogs"][0]["description"] == ""


LONG = "x" * 251
CREATE_CASES: list[tuple[Any, list[dict[str, Any]]]] = [
    (None, [error("catalog-array-invalid", ["catalogs"], [None], CREATE_ERRORS)]),
    ({"catalogs": []}, [error("catalog-array-invalid", ["catalogs"], [[]], CREATE_ERRORS)]),
    ({"catalogs": "c"}, [error("catalog-array-invalid", ["catalogs"], ["c"], CREATE_ERRORS)]),
    ({"catalogs": [5]}, [error("catalog-array-invalid", ["catalogs"], [0], CREATE_ERRORS)]),
    ({"catalogs": define("a")["catalogs"] * 2},
     [error("only-one-catalog-allowed", ["catalogs"], [2], CREATE_ERRORS)]),
    (define("bad name"), [error("invalid-catalog-name", ["name"], ["bad name"], CREATE_ERRORS)]),
    ({"catalogs": [{"fields": FIELDS}]}, [error("invalid-catalog-name", ["name"], [None], CREATE_ERRORS)]),
    (define(LONG), [error("catalog-name-too-large", ["name"], [LONG], CREATE_ERRORS)]),
    (define(CAT), [error("catalog-name-already-exists", ["name"], [CAT], CREATE_ERRORS)]),
    (define("c", description=7), [error("invalid-description", ["description"], [7], CREATE_ERRORS)]),
    (define("c", description=LONG), [error("description-too-long", ["description"], [251], CREATE_ERRORS)]),
    (define("c", "id"), [error("invalid-fields", ["fields"], ["id"], CREATE_ERRORS)]),
    (define("c", []), [error("invalid-fields", ["fields"], [[]], CREATE_ERRORS)]),
    (define("c", [*FIELDS, {"name": "x"}, {"name": "y", "type": "string", "extra": 1}]),
     [error("invalid-fields", ["fields", "fields"], [7, 8], CREATE_ERRORS)]),
    (define("c", FIELDS + [{"name": f"f{i}", "type": "string"} for i in range(494)]),
     [error("too-many-fields", ["fields"], [501], CREATE_ERRORS)]),
    (define("c", FIELDS[1:]), [error("id-not-first-column", ["fields"], ["Name"], CREATE_ERRORS)]),
    (define("c", [{"name": "id", "type": "number"}]),
     [error("id-not-first-column", ["fields"], ["id"], CREATE_ERRORS)]),
    (define("c", [*FIELDS, {"name": "a.b", "type": "string"}]),
     [error("invalid-field-names", ["fields"], ["a.b"], CREATE_ERRORS)]),
    (define("c", [*FIELDS, {"name": LONG, "type": "string"}]),
     [error("field-names-too-large", ["fields"], [LONG], CREATE_ERRORS)]),
    (define("c", [*FIELDS, {"name": "Name", "type": "number"}]),
     [error("field-names-not-unique", ["fields"], ["Name"], CREATE_ERRORS)]),
    (define("c", [*FIELDS, {"name": "Geo", "type": "geolocation"}]),
     [error("invalid-field-types", ["Geo"], ["geolocation"], CREATE_ERRORS)]),
    # several problems of one definition are reported together, in the table's order
    (define("bad name", [{"name": "Name", "type": "text"}, {"name": "Name", "type": "string"}], LONG),
     [error("invalid-catalog-name", ["name"], ["bad name"], CREATE_ERRORS),
      error("description-too-long", ["description"], [251], CREATE_ERRORS),
      error("id-not-first-column", ["fields"], ["Name"], CREATE_ERRORS),
      error("field-names-not-unique", ["fields"], ["Name"], CREATE_ERRORS),
      error("invalid-field-types", ["Name"], ["text"], CREATE_ERRORS)]),
]


@pytest.mark.parametrize(("body", "errors"), CREATE_CASES)
def test_post_catalogs_rejects_with_every_problem(shared, body, errors):
    assert shared.call("POST", "/catalogs", body=body) == invalid(*errors)
    assert shared.table("catalogs").collect()["name"].to_list() == [CAT]


def test_every_create_error_id_is_tested():
    tested = {e["id"] for _, errors in CREATE_CASES for e in errors}
    assert tested == set(CREATE_ERRORS)


def test_library_create_adds_the_id_field_and_raises_on_errors(tmp_path):
    w = open_ws(tmp_path)
    out = w.catalogs.create("shoes", {"size": "number", "colour": "string"}, description="Shoes")
    assert out == {"name": "shoes", "description": "Shoes", "num_items": 0, "updated_at": STAMP, "fields": [
        {"name": "id", "type": "string"}, {"name": "size", "type": "number"}, {"name": "colour", "type": "string"}]}
    assert w.catalogs.definitions() == [out]
    with pytest.raises(RequestError, match=r"POST /catalogs answered 400: catalog-name-already-exists \(name='shoes'\)"):
        w.catalogs.create("shoes", [{"name": "size", "type": "number"}])


# --- items: success ------------------------------------------------------------------------------
def test_put_items_stores_coerced_values_and_nulls(ws):
    r = ws.call("PUT", ITEMS, body={"items": [
        {"id": "r1", "Name": "Pizza", "Rating": "4.5", "Open": "true", "Since": "2020-01-02T03:04:05+02:00",
         "Dishes": ["margherita", {"name": "calzone"}], "Location": {"lat": 1.5, "tags": ["a"]}},
        {"id": "r2", "Rating": 3},
    ]})
    assert r == SUCCESS
    assert stored(ws) == {
        "r1": {"id": "r1", "Name": "Pizza", "Rating": 4.5, "Open": True, "Since": "2020-01-02T01:04:05.000Z",
               "Dishes": ["margherita", {"name": "calzone"}], "Location": {"lat": 1.5, "tags": ["a"]}},
        "r2": {"id": "r2", **NULLS, "Rating": 3},
    }
    # the stored JSON is queryable with DuckDB's JSON functions
    assert ws.sql("select id, json_extract_string(item, '$.Name') as name, "
                  "json_extract(item, '$.Rating')::double as rating from catalog_items order by id").rows() == [
        ("r1", "Pizza", 4.5), ("r2", None, 3.0)]


COERCIONS = [
    ("Name", "Pizza", "Pizza"), ("Name", 12, "12"), ("Name", 1.5, "1.5"), ("Name", True, "true"),
    ("Rating", 4, 4), ("Rating", 4.25, 4.25), ("Rating", "12", 12), ("Rating", " -3.5 ", -3.5),
    ("Rating", "1e3", 1000.0), ("Open", False, False), ("Open", "TRUE", True), ("Open", "false", False),
    ("Since", "2024-03-01", "2024-03-01T00:00:00.000Z"), ("Since", "2024-03-01T10:00:00Z", "2024-03-01T10:00:00.000Z"),
    ("Since", "2024-03-01T10:00:00.123456-05:00", "2024-03-01T15:00:00.123Z"),
    ("Since", "2024-03-01T10:00:00", "2024-03-01T10:00:00.000Z"),
    ("Dishes", [], []), ("Dishes", [1, "a", None], [1, "a", None]), ("Location", {}, {}),
    ("Name", None, None),
]


@pytest.fixture(scope="module")
def coerced(tmp_path_factory):
    """The stored items of one PUT that sends every case of COERCIONS as item `c<n>`."""
    w = open_ws(tmp_path_factory.mktemp("coercions"))
    assert w.call("POST", "/catalogs", body=define()).status == 201
    items = [{"id": f"c{n}", field: sent} for n, (field, sent, _) in enumerate(COERCIONS)]
    assert w.call("PUT", ITEMS, body={"items": items}) == SUCCESS
    return stored(w)


@pytest.mark.parametrize(("n", "field", "kept"), [(n, f, k) for n, (f, _, k) in enumerate(COERCIONS)])
def test_values_are_coerced_to_the_field_type(coerced, n, field, kept):
    assert coerced[f"c{n}"] == {"id": f"c{n}", **NULLS, field: kept}


def test_put_replaces_the_whole_item(ws):
    assert ws.call("PUT", ITEMS, body={"items": [{"id": "r1", "Name": "Pizza", "Rating": 4}]}) == SUCCESS
    assert ws.call("PUT", ITEMS, body={"items": [{"id": "r1", "Open": True}]}) == SUCCESS
    assert stored(ws) == {"r1": {"id": "r1", **NULLS, "Open": True}}


def test_delete_items_removes_them_and_ignores_unknown_ids(ws):
    assert ws.call("PUT", ITEMS, body={"items": [{"id": "r1"}, {"id": "r2"}, {"id": "r3"}]}) == SUCCESS
    r = ws.call("DELETE", ITEMS, body={"items": [{"id": "r1"}, {"id": "r3", "Name": "ignored"}, {"id": "nope"}]})
    assert r == SUCCESS
    assert list(stored(ws)) == ["r2"]


def test_empty_items_array_is_accepted_and_changes_nothing(ws):
    assert ws.call("PUT", ITEMS, body={"items": []}) == SUCCESS
    assert ws.call("DELETE", ITEMS, body={"items": []}) == SUCCESS
    assert stored(ws) == {}


def test_items_of_catalogs_are_kept_apart(ws):
    assert ws.call("POST", "/catalogs", body=define("other", FIELDS[:2])).status == 201
    assert ws.call("PUT", "/catalogs/other/items", body={"items": [{"id": "r1", "Name": "Other"}]}) == SUCCESS
    assert ws.call("PUT", ITEMS, body={"items": [{"id": "r1", "Name": "Mine"}]}) == SUCCESS
    assert ws.call("DELETE", ITEMS, body={"items": [{"id": "r1"}]}) == SUCCESS
    assert stored(ws) == {}
    assert stored(ws, "other") == {"r1": {"id": "r1", "Name": "Other"}}


# --- items: errors -------------------------------------------------------------------------------
def not_found(name: str) -> Response:
    return Response(404, {"errors": [error("catalog-not-found", ["catalog_name"], [name])], "message": "Invalid Request"})


@pytest.mark.parametrize("method", ["PUT", "DELETE"])
@pytest.mark.parametrize("name", ["nope", "bad name", "RESTAURANTS"])
def test_unknown_catalog_is_404_with_catalog_not_found(shared, method, name):
    r = shared.call(method, f"/catalogs/{name}/items", body={"items": [{"id": "x"}]})
    assert r == not_found(name)


@pytest.mark.parametrize("method", ["GET", "POST", "PATCH"])
def test_items_path_allows_put_and_delete_only(shared, method):
    assert shared.call(method, ITEMS, body={"items": []}).status == 405


DEEP: Any = "leaf"
for _ in range(50):
    DEEP = {"k": DEEP}  # 50 object levels: allowed
TOO_DEEP = [DEEP]  # 51 levels

PUT_CASES = [
    (None, [error("item-array-invalid", ["items"], [None])]),
    ({}, [error("item-array-invalid", ["items"], [None])]),
    ({"items": {"id": "a"}}, [error("item-array-invalid", ["items"], [{"id": "a"}])]),
    ({"items": [{"id": "a"}, "b", 3]}, [error("item-array-invalid", ["items", "items"], [1, 2])]),
    ({"items": [{"id": f"i{n}"} for n in range(51)]}, [error("request-includes-too-many-items", ["items"], [51])]),
    ({"items": [{"id": "a"}, {"Name": "x"}]}, [error("items-missing-ids", ["items"], [1])]),
    ({"items": [{"id": 5}, {"id": None}]}, [error("ids-not-string", ["id", "id"], [5, None])]),
    ({"items": [{"id": "a" * 251}]}, [error("ids-too-large", ["id"], ["a" * 251])]),
    ({"items": [{"id": "a b"}, {"id": "a.b"}, {"id": ""}]}, [error("invalid-ids", ["id"] * 3, ["a b", "a.b", ""])]),
    ({"items": [{"id": "a"}, {"id": "b"}, {"id": "a"}, {"id": "a"}]}, [error("ids-not-unique", ["id"], ["a"])]),
    ({"items": [{"id": "a", "Colour": "red", "Size": 1}, {"id": "b", "Colour": "blue"}]},
     [error("invalid-fields", ["Colour", "Size", "Colour"], ["a", "a", "b"])]),
    ({"items": [{"id": "a", "Name": "x" * 5001}, {"id": "b", "Dishes": ["x" * 5000]}]},
     [error("items-too-large", ["Name", "Dishes"], ["a", "b"])]),
    ({"items": [{"id": "a", "Location": {"a.b": 1}}, {"id": "b", "Dishes": [{"ok": {"$x": 1}}]}]},
     [error("invalid-keys-in-value-object", ["Location", "Dishes"], ["a", "b"])]),
    ({"items": [{"id": "a", "Dishes": TOO_DEEP}]}, [error("too-deep-nesting-in-value-object", ["Dishes"], ["a"])]),
    ({"items": [{"id": "a", "Rating": "abc"}, {"id": "b", "Rating": True}, {"id": "c", "Open": 1},
                {"id": "d", "Since": "yesterday"}, {"id": "e", "Since": 1700000000}, {"id": "f", "Dishes": "a,b"},
                {"id": "g", "Location": [1]}, {"id": "h", "Name": ["x"]}, {"id": "i", "Name": {"a": 1}},
                {"id": "j", "Rating": "NaN"}, {"id": "k", "Open": "yes"}]},
     [error("unable-to-coerce-value", ["Rating", "Rating", "Open", "Since", "Since", "Dishes", "Location",
                                       "Name", "Name", "Rating", "Open"],
            list("abcdefghijk"))]),
    # every problem of a request is reported together, in the table's order
    ({"items": [{"id": "a b", "Nope": 1, "Rating": "x"}, "oops", {"Name": "n"}, {"id": 7, "Location": {"$": 1}},
                {"id": "a b"}]},
     [error("item-array-invalid", ["items"], [1]), error("items-missing-ids", ["items"], [2]),
      error("ids-not-string", ["id"], [7]), error("invalid-ids", ["id"], ["a b"]),
      error("ids-not-unique", ["id"], ["a b"]), error("invalid-fields", ["Nope"], ["a b"]),
      error("invalid-keys-in-value-object", ["Location"], [7]),
      error("unable-to-coerce-value", ["Rating"], ["a b"])]),
]


@pytest.mark.parametrize(("body", "errors"), PUT_CASES)
def test_put_items_rejects_with_every_problem_and_writes_nothing(shared, body, errors):
    assert shared.call("PUT", ITEMS, body=body) == invalid(*errors)
    assert list(stored(shared)) == ["keep"]


def test_fifty_items_and_fifty_levels_are_allowed(ws):
    items = [{"id": f"i{n:02d}", "Location": DEEP} for n in range(50)]
    assert ws.call("PUT", ITEMS, body={"items": items}) == SUCCESS
    assert len(stored(ws)) == 50


DELETE_CASES = [
    ({"items": "a"}, [error("item-array-invalid", ["items"], ["a"])]),
    ({"items": [{"id": f"i{n}"} for n in range(51)]}, [error("request-includes-too-many-items", ["items"], [51])]),
    ({"items": [{"name": "a"}]}, [error("items-missing-ids", ["items"], [0])]),
    ({"items": [{"id": 1}]}, [error("ids-not-strings", ["id"], [1])]),
    ({"items": [{"id": "k" * 251}]}, [error("ids-too-large", ["id"], ["k" * 251])]),
    ({"items": [{"id": "k$"}]}, [error("invalid-ids", ["id"], ["k$"])]),
    ({"items": [{"id": "keep"}, {"id": "keep"}]}, [error("ids-not-unique", ["id"], ["keep"])]),
    ({"items": [{"id": "keep"}, {"id": ["x"]}, {}]},
     [error("items-missing-ids", ["items"], [2]), error("ids-not-strings", ["id"], [["x"]])]),
]


@pytest.mark.parametrize(("body", "errors"), DELETE_CASES)
def test_delete_items_rejects_with_every_problem_and_deletes_nothing(shared, body, errors):
    assert shared.call("DELETE", ITEMS, body=body) == invalid(*errors)
    assert list(stored(shared)) == ["keep"]


def test_every_item_error_id_is_tested():
    tested = {e["id"] for _, errors in PUT_CASES + DELETE_CASES for e in errors}
    assert tested | {"catalog-not-found"} == set(ITEM_ERRORS)


# --- round trips, batches, reopening -------------------------------------------------------------
def test_round_trip_define_upsert_query_replace_delete(tmp_path):
    w = open_ws(tmp_path)
    w.catalogs.create("shoes", {"size": "number", "colour": "string", "launched": "time"})
    w.catalogs.replace_items("shoes", [{"id": "s1", "size": "42", "colour": "red"}, {"id": "s2", "size": 38}])
    query = "select id, json_extract(item, '$.size')::double as size, json_extract_string(item, '$.colour') as colour " \
            "from catalog_items where catalog = 'shoes' order by id"
    assert w.sql(query).rows() == [("s1", 42.0, "red"), ("s2", 38.0, None)]
    w.catalogs.replace_items("shoes", [{"id": "s1", "colour": "blue", "launched": "2025-01-01"}])
    assert w.sql(query).rows() == [("s1", None, "blue"), ("s2", 38.0, None)]
    w.catalogs.delete_items("shoes", ["s2"])
    assert w.sql(query).rows() == [("s1", None, "blue")]
    assert_frame_equal(w.catalogs.items("shoes"), pl.DataFrame({
        "id": ["s1"], "size": pl.Series([None], dtype=pl.Float64), "colour": ["blue"],
        "launched": pl.Series([datetime(2025, 1, 1, tzinfo=UTC)], dtype=pl.Datetime("us", "UTC")),
    }))


def test_library_item_methods_raise_with_the_error_ids(ws):
    with pytest.raises(RequestError, match=r"PUT /catalogs/restaurants/items answered 400: invalid-ids \(id='a b'\); "
                                          r"unable-to-coerce-value \(Rating='a b'\)"):
        ws.catalogs.replace_items(CAT, [{"id": "a b", "Rating": "x"}])
    with pytest.raises(RequestError, match=r"answered 404: catalog-not-found \(catalog_name='nope'\)"):
        ws.catalogs.delete_items("nope", ["a"])
    with pytest.raises(ConfigError, match=r"no catalog named 'nope'; catalogs: restaurants"):
        ws.catalogs.items("nope")


def test_items_frame_has_one_typed_column_per_field(ws):
    ws.catalogs.replace_items(CAT, [
        {"id": "r2", "Name": "Sushi", "Rating": 5, "Open": False, "Since": "2021-06-01T08:00:00Z",
         "Dishes": ["nigiri"], "Location": {"city": "Lyon"}},
        {"id": "r1"},
    ])
    expected = pl.DataFrame({
        "id": ["r1", "r2"], "Name": [None, "Sushi"], "Rating": [None, 5.0], "Open": [None, False],
        "Since": [None, datetime(2021, 6, 1, 8, tzinfo=UTC)], "Dishes": [None, '["nigiri"]'],
        "Location": [None, '{"city":"Lyon"}'],
    }, schema={"id": pl.String, "Name": pl.String, "Rating": pl.Float64, "Open": pl.Boolean,
               "Since": pl.Datetime("us", "UTC"), "Dishes": pl.String, "Location": pl.String})
    assert_frame_equal(ws.catalogs.items(CAT), expected)


BATCH = [
    {"method": "POST", "path": "/catalogs", "body": define("shoes", FIELDS[:3])},
    {"method": "PUT", "path": "/catalogs/shoes/items", "body": {"items": [{"id": "s1", "Rating": "2"}, {"id": "s2"}]}},
    {"method": "PUT", "path": "/catalogs/shoes/items", "body": {"items": [{"id": "s1", "Name": "A"}, {"id": "bad id"}]}},
    {"method": "PUT", "path": "/catalogs/shoes/items", "body": {"items": [{"id": "s1", "Name": "B"}]}},
    {"method": "DELETE", "path": "/catalogs/shoes/items", "body": {"items": [{"id": "s2"}]}},
    {"method": "PUT", "path": "/catalogs/ghost/items", "body": {"items": [{"id": "g"}]}},
    {"method": "POST", "path": "/catalogs", "body": define("shoes", FIELDS[:3])},
    {"method": "PUT", "path": "/catalogs/shoes/items", "body": {"items": [{"id": "s3", "Rating": 1}]}},
    {"method": "GET", "path": "/catalogs"},
]


def snapshot(w: Workspace) -> tuple[list[Any], list[Any]]:
    return (w.table("catalogs").collect().sort("name").rows(), w.table("catalog_items").collect().sort("catalog", "id").rows())


def test_apply_equals_calling_one_by_one(tmp_path):
    batched, single = open_ws(tmp_path, "batched"), open_ws(tmp_path, "single")
    responses = batched.apply(BATCH)
    assert responses == [single.call(r["method"], r["path"], body=r.get("body")) for r in BATCH]
    assert snapshot(batched) == snapshot(single)
    assert [r.status for r in responses] == [201, 202, 400, 202, 202, 404, 400, 202, 200]
    assert stored(batched, "shoes") == {"s1": {"id": "s1", "Name": "B", "Rating": None},
                                        "s3": {"id": "s3", "Name": None, "Rating": 1}}


def test_reopened_store_keeps_catalogs_and_items(tmp_path):
    w = open_ws(tmp_path)
    w.apply(BATCH)
    before = snapshot(w)
    again = Workspace.open(tmp_path / "store", clock=lambda: NOW, seed=SEED)
    assert snapshot(again) == before
    assert again.catalogs.items("shoes")["id"].to_list() == ["s1", "s3"]
    assert again.call("PUT", "/catalogs/shoes/items", body={"items": [{"id": "s4"}]}) == SUCCESS
    assert sorted(stored(again, "shoes")) == ["s1", "s3", "s4"]
