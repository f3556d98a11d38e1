"""The small passes' parse in Python (`rules/profile/parse_small.py`) gives DuckDB's frames
(`parse.parse_duckdb`) exactly, frame for frame, on random track bodies and on each JSON case
where DuckDB's reading or writing could differ from Python's; on the texts it cannot be sure
of, it is DuckDB's parse."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import duckdb
import orjson
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal
from tests.test_apply_equals_call import (
    EVENTS_AND_PURCHASES,
    IDENTITIES_AND_ATTRIBUTES,
    PUSH_AND_SUBSCRIPTIONS,
)

from engagelake.rules.profile import parse, parse_small, parsing
from engagelake.rules.profile.parse_small import parse_small as small

FRAMES = ("requests", "objects", "pairs", "tokens", "groups")


def bodies_of(texts: list[Any], reqs: list[int] | None = None) -> pa.Table:
    return pa.table({"req": pa.array(range(len(texts)) if reqs is None else reqs, pa.int64()),
                     "body": pa.array(texts, pa.string())})


@contextmanager
def fallbacks() -> Iterator[list[int]]:
    """Count the calls `parse_small` hands to DuckDB."""
    calls: list[int] = []
    real = parse_small.parse_duckdb

    def counted(bodies: pa.Table) -> parse.ParsedTrack:
        calls.append(bodies.num_rows)
        return real(bodies)

    with mock.patch.object(parse_small, "parse_duckdb", counted):
        yield calls


def assert_same(texts: list[Any], *, sure: bool = True, reqs: list[int] | None = None) -> parse.ParsedTrack:
    """`parse_small` equals `parse_duckdb` on `texts`, walked in Python (`sure`) or handed to
    DuckDB."""
    bodies = bodies_of(texts, reqs)
    want = parse.parse_duckdb(bodies)
    with fallbacks() as calls:
        got = small(bodies)
    assert bool(calls) is not sure, f"{'fell back' if calls else 'walked'}: {texts}"
    for name in FRAMES:
        assert_frame_equal(getattr(got, name), getattr(want, name), check_row_order=True, check_exact=True,
                           check_dtypes=True, check_column_order=True)
    return got


# --- random bodies ---------------------------------------------------------------------------
KEYS = ["external_id", "user_alias", "braze_id", "email", "phone", "first_name", "country", "dob",
        "email_subscribe", "push_tokens", "subscription_groups", "_update_existing_only", "push_token_import",
        "name", "time", "app_id", "product_id", "currency", "price", "quantity", "properties",
        "plan", "visits", "tags", "$x", "", "é", "External_ID", "inc", "add", "remove", "k\u0000", "a\"b\\"]
INTS = st.one_of(st.integers(-1000, 1000), st.integers(-(2**63), 2**64 - 1),
                 st.sampled_from([0, -1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)]))
HUGE_INTS = st.sampled_from([2**64, -(2**63) - 1, 10**30, -(10**25)])  # beyond 64 bits: json.dumps only
FLOATS = st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                   st.sampled_from([1.0, -0.0, 0.0, 1e20, 1e21, 1e-6, 1e-7, 1e16, 5e-324, 1.5, 123456.789]))
TEXT = st.one_of(st.text(max_size=8), st.sampled_from(["", "é😀", "\u0000", "\u000b\u001f\u007f", "\\u001f",
                                                      "a\"b\\c/", "\n\t\r\b\f", "\u2028", "2026-01-01T00:00:00Z"]))
SCALARS = st.one_of(st.none(), st.booleans(), INTS, FLOATS, TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS) | TEXT,
                                                                                     inner, max_size=3),
                    max_leaves=8)


def _fields(names: tuple[str, ...]) -> st.SearchStrategy[Any]:
    """An element of push_tokens or subscription_groups: mostly an object of those fields."""
    obj = st.fixed_dictionaries({}, optional={n: st.one_of(TEXT, SCALARS, JSON) for n in names})
    return st.one_of(obj, obj, SCALARS, st.lists(SCALARS, max_size=2))


VALUES = st.one_of(
    SCALARS, JSON,
    st.builds(lambda n: {"inc": n}, st.one_of(INTS, FLOATS, TEXT, st.none())),
    st.fixed_dictionaries({}, optional={"add": st.lists(SCALARS, max_size=3) | SCALARS,
                                        "remove": st.lists(SCALARS, max_size=3) | SCALARS,
                                        "inc": INTS}),
    st.fixed_dictionaries({}, optional={"alias_name": SCALARS, "alias_label": SCALARS}),
    st.lists(_fields(("app_id", "token", "device_id")), max_size=3),
    st.lists(_fields(("subscription_group_id", "subscription_state")), max_size=3),
)
OBJECT = st.dictionaries(st.sampled_from(KEYS) | TEXT, VALUES, max_size=7)
ELEMENT = st.one_of(OBJECT, OBJECT, OBJECT, SCALARS, st.lists(SCALARS, max_size=2))
ARRAY = st.one_of(st.lists(ELEMENT, max_size=4), st.lists(ELEMENT, max_size=4), SCALARS, OBJECT)
BODY = st.one_of(
    st.fixed_dictionaries({}, optional={"attributes": ARRAY, "events": ARRAY, "purchases": ARRAY,
                                        "Attributes": ARRAY, "x": JSON}),
    st.fixed_dictionaries({}, optional={"attributes": ARRAY, "events": ARRAY, "purchases": ARRAY}),
    JSON,
)


def _with(body: Any, value: Any) -> Any:
    """`body` with `value` (a number beyond 64 bits, or not finite) as a custom attribute."""
    return {"attributes": [{"external_id": "a", "big": value}], "events": [{"price": value}], "rest": body}


WRITERS = st.sampled_from(["orjson", "compact", "spaced", "indented", "ascii"])


def written(body: Any, how: str) -> tuple[str, bool]:
    """`body` as JSON text, and whether `parse_small` walks it (orjson writes a number that is
    not finite as null, `json` as NaN or Infinity, which orjson refuses to read)."""
    if how == "orjson":
        try:
            return orjson.dumps(body).decode(), True
        except TypeError:  # an integer beyond 64 bits
            how = "compact"
    text = json.dumps(body, ensure_ascii=how == "ascii",
                      separators={"compact": (",", ":"), "spaced": (" ,  ", " :\t")}.get(how),
                      indent=1 if how == "indented" else None)
    return (f" \n{text}\r\n " if how == "spaced" else text), _finite(body)


def _finite(body: Any) -> bool:
    try:
        json.dumps(body, allow_nan=False)
    except ValueError:
        return False
    return True


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.tuples(BODY | st.builds(_with, BODY, HUGE_INTS | st.sampled_from([math.nan, math.inf])),
                          WRITERS), min_size=1, max_size=4))
@example([({"attributes": [{"external_id": "a", "n": 2**64, "m": {"inc": -(2**63) - 1}}]}, "orjson")])
@example([({"attributes": [{"external_id": "a", "x": math.inf}]}, "compact")])
def test_the_python_parse_equals_duckdb_s(bodies: list[tuple[Any, str]]) -> None:
    texts, sure = zip(*(written(body, how) for body, how in bodies), strict=True)
    assert_same(list(texts), sure=all(sure))


# --- each case by itself ---------------------------------------------------------------------
def one(body: str, **kwargs: Any) -> parse.ParsedTrack:
    return assert_same([body], **kwargs)


def attribute(value: str) -> str:
    return f'{{"attributes":[{{"external_id":"a","v":{value}}}],"events":[{{"name":"e","properties":{{"p":{value}}},"price":{value}}}]}}'


@pytest.mark.parametrize(("value", "vt", "v"), [
    ("0", "UBIGINT", "0"), ("1", "UBIGINT", "1"), ("-1", "BIGINT", "-1"),
    ("9223372036854775807", "UBIGINT", "9223372036854775807"),
    ("9223372036854775808", "UBIGINT", "9223372036854775808"),
    ("18446744073709551615", "UBIGINT", "18446744073709551615"),
    ("-9223372036854775808", "BIGINT", "-9223372036854775808"),
    # beyond 64 bits yyjson keeps the number's text, and DuckDB calls it DOUBLE
    ("18446744073709551616", "DOUBLE", "18446744073709551616"),
    ("-9223372036854775809", "DOUBLE", "-9223372036854775809"),
    ("123456789012345678901234567890", "DOUBLE", "123456789012345678901234567890"),
    # doubles in yyjson's form, whatever the input's spelling
    ("1.0", "DOUBLE", "1.0"), ("1.00", "DOUBLE", "1.0"), ("1E5", "DOUBLE", "100000.0"), ("1e+5", "DOUBLE", "100000.0"),
    ("1e20", "DOUBLE", "100000000000000000000.0"), ("1e21", "DOUBLE", "1e21"), ("1e-6", "DOUBLE", "0.000001"),
    ("1e-7", "DOUBLE", "1e-7"), ("2.5E-10", "DOUBLE", "2.5e-10"), ("-0.0", "DOUBLE", "-0.0"), ("-0e0", "DOUBLE", "-0.0"),
    ("1e-400", "DOUBLE", "0.0"), ("-1e-400", "DOUBLE", "-0.0"), ("5e-324", "DOUBLE", "5e-324"),
    ("12345678901234567890123.0", "DOUBLE", "1.2345678901234568e22"), ("0.30000000000000004", "DOUBLE", "0.30000000000000004"),
    ("1.7976931348623157e308", "DOUBLE", "1.7976931348623157e308"),
])
def test_numbers_read_and_write_as_duckdb_s(value: str, vt: str, v: str) -> None:
    p = one(attribute(value))
    assert p.pairs.filter(pl.col("key") == "v").select("vt", "v").row(0) == (vt, v)
    assert p.objects.filter(pl.col("arr") == 1).select("price_t", "price", "props").row(0) == (vt, v, f'{{"p":{v}}}')


@pytest.mark.parametrize("value", ["-0", "1e400", "-1E400", "NaN", "Infinity", "-Infinity", "nan", "inf"])
def test_numbers_duckdb_reads_its_own_way_are_duckdb_s(value: str) -> None:
    """`-0` is BIGINT 0 to DuckDB (a Python 0, UBIGINT); beyond a double yyjson keeps the text,
    and it takes NaN and infinities, which orjson refuses: DuckDB parses the call."""
    one(attribute(value), sure=False)


@pytest.mark.parametrize("value", [
    r'"é€😀"', r'"\u00e9\ud83d\ude00"', r'"\u0000z"', r'"\u0001\u000b\u001f\u007f"', r'"\b\f\n\r\t"',
    r'"a\"b\\c\/d"', r'"\\u001f"', r'"\\\u001f"', r'"\u2028\u2029"', '"\x7f"',
    r'["\u0000",{"k\"\u001e":"\n"}]', r'{"a\u0000":1}', r'{"z":1,"a":[{}],"m":{"":null}}', "[]", "{}",
    "[1.0,1e20,-0.0,1e-7,18446744073709551615,true,false,null]",
])
def test_strings_and_nested_values_write_as_duckdb_s(value: str) -> None:
    """yyjson writes `\\u001F` where orjson writes `\\u001f`, and leaves `/`, DEL and U+2028."""
    one(attribute(value))
    one(attribute(value).replace(",", " , ").replace(":", " : "))


@pytest.mark.parametrize("text", [r'{"attributes":[{"v":"\ud800"}]}', r'{"attributes":[{"v":"\udfff x"}]}',
                                  '{"attributes":[{"v":1}]', '{"attributes":[{"v":1}]}x', "", '{"v":"\x01"}',
                                  '\ufeff{"attributes":[]}', "{'attributes':[]}"])
def test_text_that_is_not_json_fails_as_in_duckdb(text: str) -> None:
    with pytest.raises(duckdb.Error):
        parse.parse_duckdb(bodies_of([text]))
    with pytest.raises(duckdb.Error):
        small(bodies_of([text]))


@pytest.mark.parametrize("text", [
    '{"attributes":[{"external_id":"a"}],"attributes":[{"external_id":"b"}]}',  # DuckDB reads the first
    '{"attributes":[{"external_id":"a","external_id":"b"}]}',
    '{"attributes":[{"external_id":"a","x":1,"x":2}]}',  # json_keys lists both
    '{"attributes":[{"external_id":"a","x":{"inc":1,"inc":2}}]}',
    '{"events":[{"name":"e","properties":{"p":1,"p":2}}]}',
    '{"attributes":[{"external_id":"a","x":1,}]}', '{"attributes":[{"external_id":"a"},]}',  # yyjson takes these
])
def test_a_key_twice_or_a_trailing_comma_is_duckdb_s(text: str) -> None:
    one(text, sure=False)


@pytest.mark.parametrize("text", [
    "null", "3", "-3", "1.5", '"s"', "true", "[]", "[1,2]", '[{"attributes":[]}]', "{}", '{"x":1}',
    '{"attributes":null,"events":{},"purchases":"x"}', '{"attributes":3,"events":true,"purchases":[]}',
    '{"ATTRIBUTES":[{"external_id":"a"}]}',  # keys match case-sensitively
    '{"Attributes":[{"a":1}],"attributes":[{"b":2},{"c":3}]}', '{"attributes":[{"b":2}],"ATTRIBUTES":[{"c":3},{"d":4}]}',
    '{"attributes":[null,1,"s",[],[{}],true,{},{"external_id":"a"}],"events":[null,{}],"purchases":[[],{}]}',
    ' \n\t{ "attributes" :\n[ { "external_id" : "a" , "v" : [ 1 , { } ] } ] }\r\n',
])
def test_bodies_arrays_and_elements_of_each_shape(text: str) -> None:
    one(text)


@pytest.mark.parametrize(("depth", "sure"), [(300, True), (2000, False)])
def test_values_nested_deep(depth: int, sure: bool) -> None:
    """Past 255 levels orjson writes no text (the body is read again by `json`), past 1,024 it
    reads none, and past Python's recursion the walk stops: DuckDB's."""
    value = "[" * depth + "1" + "]" * depth
    props = '{"a":' * depth + "1" + "}" * depth
    one(f'{{"attributes":[{{"external_id":"a","v":{value}}}],"events":[{{"name":"e","properties":{{"p":{props}}}}}]}}',
        sure=sure)


def test_fixed_fields_of_each_type() -> None:
    values = ['"s"', '""', "0", "-5", "18446744073709551615", "1.5", "true", "false", "null", "[1]", "{}", '{"a":[1,{"b":null}]}']
    fields = [path for path, _ in parse.FIXED if "." not in path]
    texts = [orjson.dumps({arr: [{field: orjson.loads(v) for field in fields}]}).decode()
             for v in values for arr in ("attributes", "events", "purchases")]
    p = assert_same(texts)
    assert p.objects.height == len(texts) and set(p.objects["ext_t"].drop_nulls()) == {
        "VARCHAR", "UBIGINT", "BIGINT", "DOUBLE", "BOOLEAN", "ARRAY", "OBJECT"}  # null: absent


@pytest.mark.parametrize("alias", ["null", '"x"', "[1]", "{}", '{"alias_name":null,"alias_label":null}',
                                   '{"alias_name":"n","alias_label":"l"}', '{"alias_name":3,"alias_label":{"x":[]}}'])
def test_user_aliases_of_each_shape(alias: str) -> None:
    """A null under `user_alias` stays 'NULL': the checks tell it from absent."""
    one(f'{{"attributes":[{{"user_alias":{alias}}}],"events":[{{"user_alias":{alias},"name":"e"}}]}}')


@pytest.mark.parametrize("props", ["null", "{}", '{"a":1}', '{"a":{"b":1}}', '{"a":[]}', '{"":1,"$x":2,"a":"\\u001f"}',
                                   "[1]", '"s"', "3", "true"])
def test_properties_of_each_type(props: str) -> None:
    """An empty object's keys are [] and nests nothing; no object has neither."""
    one(f'{{"events":[{{"name":"e","properties":{props}}}],"purchases":[{{"product_id":"p","properties":{props}}}]}}')


@pytest.mark.parametrize("value", [
    '{"inc":1}', '{"inc":-1}', '{"inc":0}', '{"inc":9223372036854775807}', '{"inc":9223372036854775808}',
    '{"inc":18446744073709551615}', '{"inc":18446744073709551616}', '{"inc":1.5}', '{"inc":"1"}', '{"inc":null}',
    '{"inc":1,"add":[1]}', '{"add":[1,"a",null]}', '{"add":null}', '{"remove":null}', '{"add":3,"remove":{}}',
    '{"add":[],"remove":[[1]]}', "{}", '{"other":1}',
])
def test_operations_of_each_shape(value: str) -> None:
    """An `inc` past int64 has its type and no value; an `add` of null is the text 'null'."""
    one(f'{{"attributes":[{{"external_id":"a","x":{value}}}]}}')


@pytest.mark.parametrize("elements", [
    "[]", "null", '"s"', "{}", "3",
    '[null,1,"s",[],[{"app_id":"a"}],{},{"app_id":null,"token":null,"device_id":null}]',
    '[{"app_id":"a","token":"t"},{"app_id":"a","token":"t","device_id":"d"},{"app_id":1,"token":[],"device_id":{}}]',
    '[{"subscription_group_id":"g","subscription_state":"subscribed"},{"subscription_group_id":null},'
    '{"subscription_group_id":5,"subscription_state":true}]',
])
def test_push_tokens_and_subscription_groups_of_each_shape(elements: str) -> None:
    """Listed for attributes objects only; a null element has no type at all (SQL null)."""
    one(f'{{"attributes":[{{"external_id":"a","push_tokens":{elements},"subscription_groups":{elements}}},'
        f'{{"external_id":"b","push_tokens":{elements}}}],"events":[{{"push_tokens":{elements}}}]}}')


def test_the_requests_of_the_suites_parse_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """...and as DuckDB parses them in chunks (`seq` numbered across the chunks)."""
    texts = [orjson.dumps(r.get("body")).decode()
             for r in IDENTITIES_AND_ATTRIBUTES + PUSH_AND_SUBSCRIPTIONS + EVENTS_AND_PURCHASES
             if r["path"] == "/users/track"]
    p = assert_same(texts)
    assert p.objects.height > 20 and p.pairs.height > 20 and p.tokens.height and p.groups.height
    monkeypatch.setattr(parse, "PARSE_CHUNK_BYTES", 300)
    chunked = parse.parse_duckdb(bodies_of(texts))
    for name in FRAMES:
        assert_frame_equal(getattr(p, name), getattr(chunked, name), check_row_order=True, check_exact=True)


def test_a_pass_of_75_objects_and_an_empty_pass() -> None:
    body = {"attributes": [{"external_id": f"u{j}", "email": f"u{j}@example.com", "plan": "pro" if j % 3 else "free",
                            "request": 7, "visits": {"inc": 1}} for j in range(75)]}
    assert assert_same([orjson.dumps(body).decode()] * 3).objects.height == 225
    assert_same([])


def test_requests_out_of_order_or_a_missing_body_are_duckdb_s() -> None:
    assert_same(['{"attributes":[{"external_id":"a"}]}', '{"events":[{"name":"e"}]}'], reqs=[5, 2], sure=False)
    assert_same(['{"attributes":[{"external_id":"a"}]}', None], sure=False)
    assert_same(['{"attributes":[{"external_id":"a"}]}', '{"events":[{"name":"e"}]}'], reqs=[3, 9])


def test_parse_track_takes_the_small_path_below_the_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below `SMALL_PARSE_BYTES` of text, or `ENGAGELAKE_SMALL_PARSE_BYTES` (read at each call)."""
    bodies = bodies_of(['{"attributes":[{"external_id":"a"}]}'] * 2)  # 72 bytes
    seen: list[str] = []
    walk, in_duckdb = parse_small._walk, parse._parse
    monkeypatch.setattr(parse_small, "_walk", lambda *args: (seen.append("python"), walk(*args))[1])
    monkeypatch.setattr(parse, "_parse", lambda chunk, threads: (seen.append("duckdb"), in_duckdb(chunk, threads=threads))[1])
    monkeypatch.delenv("ENGAGELAKE_SMALL_PARSE_BYTES", raising=False)
    for limit in (73, 72):
        monkeypatch.setattr(parsing, "SMALL_PARSE_BYTES", limit)
        parsing.parse_track(bodies)
    for forced in ("0", "1000000000"):
        monkeypatch.setenv("ENGAGELAKE_SMALL_PARSE_BYTES", forced)
        parsing.parse_track(bodies)
    assert seen == ["python", "duckdb", "duckdb", "python"]
