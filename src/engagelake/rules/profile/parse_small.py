"""`parse_track`'s frames for a small pass, by a walk of the parsed bodies in Python.

DuckDB's parse costs a pass 25-30 ms of planning whatever its size, and a walk of the same
data in Python 2.6 ms for one request of 75 objects, 70-80 ms for 64 of them against DuckDB's
85-100 (`benchmarks/small_parse.py`): `parsing.parse_track` hands a pass of fewer than
`SMALL_PARSE_BYTES` of text to `parse_small`. Its frames are DuckDB's, to the byte
(`tests/test_parse_small.py`), which takes matching DuckDB's JSON (yyjson):
- JSON types by DuckDB's names: an integer is UBIGINT from 0 to 2^64-1, BIGINT below 0 down to
  -2^63, and DOUBLE beyond them, where its text stays as written (yyjson keeps such a number
  raw); a JSON null is 'NULL', or SQL null where DuckDB reads it so (`_elements`);
- values written again as DuckDB writes them: minified, keys in order, a double in yyjson's
  form (`_double`: `1.0`, `100000000000000000000.0` up to 21 digits, `1e21`, `0.000001`,
  `1e-7`), a string with `"`, `\\`, and `\\b \\f \\n \\r \\t` escaped and the other control
  characters as `\\u00XX` with upper-case hex (`_string`), the rest as it is (`/`, DEL,
  U+2028, any non-ASCII character).
A body is read by orjson, and taken as it reads when orjson writes the same text back (the
texts a batch keeps are orjson's); another text is read again by `json`, which sees each
number as written and each key of an object. The whole call is DuckDB's (`parse_duckdb`)
for a body that orjson refuses (not JSON, or JSON only to yyjson: NaN, a trailing comma, a
number beyond a double, a lone surrogate, nesting beyond 1,024 levels), an object with a key
twice (DuckDB would read the first, json_keys lists both), the integer `-0` (BIGINT 0 to
DuckDB), a value nested deeper than Python's recursion goes, a body that is not text, and
requests not numbered in increasing order.
"""

from __future__ import annotations

import gc
import json
import math
import re
from typing import Any

import orjson
import polars as pl
import pyarrow as pa

from engagelake.rules.profile.parse import ARRAYS, FIXED, ParsedTrack, parse_duckdb


class _Unsure(Exception):
    """A body the walk might read otherwise than DuckDB: the call is DuckDB's."""


def parse_small(bodies: pa.Table) -> ParsedTrack:
    """`parse_duckdb(bodies)`, computed in Python (see the module's docstring)."""
    reqs = bodies["req"].to_pylist()
    # the walk makes a few objects a key and keeps them all: Python's collector would go
    # over them again and again (at 256 requests of 75 objects, half the walk's time)
    collecting = gc.isenabled()
    gc.disable()
    try:
        if any(b <= a for a, b in zip(reqs, reqs[1:], strict=False)):
            raise _Unsure
        return _walk(reqs, [_loads(text) for text in bodies["body"].to_pylist()])
    except (_Unsure, RecursionError):  # RecursionError: a value nested deeper than Python goes
        pass
    finally:
        if collecting:
            gc.enable()
    return parse_duckdb(bodies)


def _loads(text: Any) -> Any:
    if not isinstance(text, str):
        raise _Unsure
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise _Unsure from None
    try:
        if orjson.dumps(doc) == text.encode():  # what orjson writes: no key twice, no `-0`
            return doc
    except TypeError:  # nested deeper than orjson writes (255 levels)
        pass
    # (orjson read it: no NaN, no infinity, each string whole)
    return json.loads(text, object_pairs_hook=_unique_keys, parse_int=_int)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Unsure
    return obj


def _int(text: str) -> int:
    if text == "-0":
        raise _Unsure
    return int(text)


U64_MAX, I64_MIN, I64_MAX = 2**64 - 1, -(2**63), 2**63 - 1
_TYPES = {str: "VARCHAR", bool: "BOOLEAN", type(None): "NULL", float: "DOUBLE", dict: "OBJECT", list: "ARRAY"}
_ABSENT = object()  # a key the object does not hold


def _type(v: Any) -> str:
    """DuckDB's `json_type` of a value."""
    kind = type(v)
    if kind is int:  # beyond 64 bits: a raw number to yyjson, which DuckDB calls DOUBLE
        if v >= 0:
            return "UBIGINT" if v <= U64_MAX else "DOUBLE"
        return "BIGINT" if v >= I64_MIN else "DOUBLE"
    return _TYPES[kind]


def _double(f: float) -> str:
    """A double as yyjson writes it: Python's shortest digits (the same as yyjson's) set out
    in yyjson's form."""
    if f == 0:
        return "-0.0" if math.copysign(1.0, f) < 0 else "0.0"
    text = repr(f)
    sign = "-" if f < 0 else ""
    mantissa, _, exponent = text.lstrip("-").partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    point = len(whole) + int(exponent or 0)  # the value is 0.<digits> * 10^point
    zeros = len(digits) - len(digits.lstrip("0"))
    digits, point = digits[zeros:].rstrip("0"), point - zeros
    if len(digits) <= point <= 21:
        return f"{sign}{digits}{'0' * (point - len(digits))}.0"
    if 0 < point <= 21:
        return f"{sign}{digits[:point]}.{digits[point:]}"
    if -6 < point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    return f"{sign}{digits[0]}{'.' + digits[1:] if len(digits) > 1 else ''}e{point - 1}"


# orjson writes `\u001f`, yyjson `\u001F` (an escaped backslash before `u` is no escape)
_LOWER_HEX = re.compile(r"(?<!\\)((?:\\\\)*)\\u00([0-9a-f]{2})")


def _string(s: str) -> str:
    return _escaped(orjson.dumps(s).decode())


def _escaped(text: str) -> str:
    """orjson's JSON text with yyjson's escapes."""
    if "\\u00" in text:
        return _LOWER_HEX.sub(lambda m: f"{m.group(1)}\\u00{m.group(2).upper()}", text)
    return text


_PLAIN = {str, int, bool, type(None)}  # what orjson writes as yyjson does (but for `_LOWER_HEX`)


def _json(v: Any) -> str:
    """A value's JSON text as DuckDB writes it (`v::VARCHAR`)."""
    kind = type(v)
    if kind is str:
        return _string(v)
    if kind is dict or kind is list:
        if all(type(x) in _PLAIN for x in (v.values() if kind is dict else v)):  # most: orjson writes it
            try:
                return _escaped(orjson.dumps(v).decode())
            except TypeError:  # an integer beyond 64 bits
                pass
        if kind is dict:
            return "{" + ",".join(f"{_string(k)}:{_json(x)}" for k, x in v.items()) + "}"
        return "[" + ",".join(map(_json, v)) + "]"
    return _text(v) or "null"


def _text(v: Any) -> str | None:
    """A value as `json_extract_string` reads it: a string as itself, null as null."""
    kind = type(v)
    if kind is str:
        return v  # type: ignore[no-any-return]
    if v is None:
        return None
    if kind is bool:
        return "true" if v else "false"
    if kind is int:
        return str(v)
    if kind is float:
        return _double(v)
    return _json(v)


# the frames' columns, as `parse_duckdb` gives them
_REQUESTS = {"req": pl.Int64, "body_type": pl.String,
             **{c: t for a in ARRAYS for c, t in ((f"{a}_type", pl.String), (f"{a}_len", pl.UInt64))}}
_OBJECTS: dict[str, pl.DataType] = {"seq": pl.Int64(), "req": pl.Int64(), "arr": pl.Int32(), "idx": pl.Int64(),
                                    "obj_t": pl.String()}
for _, _column in FIXED:  # each field's type, and its text but for user_alias and the arrays
    _OBJECTS[f"{_column}_t"] = pl.String()
    if _column == "props":
        _OBJECTS.update(props=pl.String(), props_keys=pl.List(pl.String()), props_nested=pl.Boolean())
    elif _column not in ("alias", "tokens", "groups"):
        _OBJECTS[_column] = pl.String()
_PAIRS = {"seq": pl.Int64, "key": pl.String, "kpos": pl.Int64, "v": pl.String, "vt": pl.String,
          "vs": pl.String, "okeys": pl.List(pl.String), "inc_t": pl.String, "inc": pl.Int64,
          "add_t": pl.String, "add": pl.String, "remove_t": pl.String, "remove": pl.String}
_TOKEN_FIELDS = ("app_id", "token", "device_id")
_GROUP_FIELDS = ("subscription_group_id", "subscription_state")


def _elements_schema(fields: tuple[str, ...]) -> dict[str, pl.DataType]:
    return {"seq": pl.Int64(), "pos": pl.Int64(), "elem_t": pl.String(),
            **{c: pl.String() for f in fields for c in (f"{f}_t", f)}}


# where each top-level field's type goes in an object's row (its text, and the rest, after it)
_AT = {path: list(_OBJECTS).index(f"{column}_t") for path, column in FIXED if "." not in path}
_ALIAS, _PROPS, _TOKENS, _GROUPS = (_AT[p] for p in ("user_alias", "properties", "push_tokens", "subscription_groups"))
_NO_FIELDS = [None] * (len(_OBJECTS) - 5)
_CONTAINERS = (dict, list)
_LIST, _STRING_LISTS = pl.List(pl.String), pa.large_list(pa.large_string())


def _frame(rows: list[Any], schema: dict[str, Any]) -> pl.DataFrame:
    """The frame of `rows`, from a Series a column (a quarter of the cost of a frame from the
    columns and a schema). Polars builds a list column from Python lists a row at a time
    (5 us a row): those come through Arrow."""
    columns = zip(*rows, strict=True) if rows else [()] * len(schema)
    return pl.DataFrame([pl.Series(name, pa.array(column, _STRING_LISTS)) if dtype == _LIST
                         else pl.Series(name, column, dtype=dtype)
                         for (name, dtype), column in zip(schema.items(), columns, strict=True)])


def _nested(obj: Any, key: str) -> tuple[str | None, str | None]:
    """(type, text) of a field of `obj` (a nested path: 'NULL' stays), absent when `obj` is
    not an object."""
    v = obj.get(key, _ABSENT) if type(obj) is dict else _ABSENT
    return (None, None) if v is _ABSENT else (_type(v), _text(v))


def _object(seq: int, req: int, arr: int, idx: int, obj: dict[str, Any]) -> list[Any]:
    row: list[Any] = [seq, req, arr, idx, "OBJECT", *_NO_FIELDS]
    for key in _AT.keys() & obj.keys():  # the fixed fields it holds
        v = obj[key]
        if v is None:  # a null field reads as absent (a nested one stays 'NULL')
            continue
        at = _AT[key]
        row[at] = _type(v)
        if at == _ALIAS:
            row[at + 1:at + 5] = (*_nested(v, "alias_name"), *_nested(v, "alias_label"))
        elif at == _PROPS:
            if type(v) is dict:
                row[at + 1:at + 4] = (_json(v), list(v), any(type(x) in _CONTAINERS for x in v.values()))
        elif at not in (_TOKENS, _GROUPS):
            row[at + 1] = _text(v)
    return row


def _pairs(seq: int, obj: dict[str, Any]) -> list[tuple[Any, ...]]:
    """One row per key of an attributes object, in key order (the common values first, the
    Nones written out: the hot loop of a walk)."""
    rows: list[tuple[Any, ...]] = []
    for kpos, (key, v) in enumerate(obj.items()):
        kind = type(v)
        if kind is str:
            text = orjson.dumps(v).decode()
            rows.append((seq, key, kpos, _escaped(text) if "\\u00" in text else text, "VARCHAR", v,
                         None, None, None, None, None, None, None))
        elif kind is not dict:
            rows.append((seq, key, kpos, None if v is None else _json(v), _type(v), None,
                         None, None, None, None, None, None, None))
        else:
            inc_t, _ = _nested(v, "inc")
            inc = v["inc"] if inc_t in ("BIGINT", "UBIGINT") and v["inc"] <= I64_MAX else None  # TRY_CAST
            rows.append((seq, key, kpos, _json(v), "OBJECT", None, list(v), inc_t, inc,
                         *_typed_json(v, "add"), *_typed_json(v, "remove")))
    return rows


def _typed_json(obj: dict[str, Any], key: str) -> tuple[str | None, str | None]:
    """(type, JSON text) of `obj[key]`: null is 'NULL' and 'null'."""
    v = obj.get(key, _ABSENT)
    return (None, None) if v is _ABSENT else (_type(v), _json(v))


def _elements(seq: int, items: list[Any], fields: tuple[str, ...]) -> list[tuple[Any, ...]]:
    # an element null is SQL null to DuckDB here (`json_transform` to JSON[]): no type at all
    return [(seq, pos, None if x is None else _type(x), *(c for f in fields for c in _nested(x, f)))
            for pos, x in enumerate(items)]


def _walk(reqs: list[int], docs: list[Any]) -> ParsedTrack:
    requests: list[tuple[Any, ...]] = []
    objects: list[list[Any]] = []
    pairs: list[tuple[Any, ...]] = []
    tokens: list[tuple[Any, ...]] = []
    groups: list[tuple[Any, ...]] = []
    for req, doc in zip(reqs, docs, strict=True):
        arrays = [doc.get(a, _ABSENT) if type(doc) is dict else _ABSENT for a in ARRAYS]
        requests.append((req, _type(doc), *(c for x in arrays for c in (
            None if x is _ABSENT else _type(x), len(x) if type(x) is list else None))))
        for arr, items in enumerate(arrays):
            if type(items) is not list:
                continue
            for idx, obj in enumerate(items):
                seq = len(objects)
                if type(obj) is not dict:
                    objects.append([seq, req, arr, idx, _type(obj), *_NO_FIELDS])
                    continue
                objects.append(_object(seq, req, arr, idx, obj))
                if arr == 0:  # an attributes object: its pairs, push tokens and subscription groups
                    pairs += _pairs(seq, obj)
                    if type(push := obj.get("push_tokens")) is list:
                        tokens += _elements(seq, push, _TOKEN_FIELDS)
                    if type(subs := obj.get("subscription_groups")) is list:
                        groups += _elements(seq, subs, _GROUP_FIELDS)
    return ParsedTrack(_frame(requests, _REQUESTS), _frame(objects, _OBJECTS), _frame(pairs, _PAIRS),
                       _frame(tokens, _elements_schema(_TOKEN_FIELDS)),
                       _frame(groups, _elements_schema(_GROUP_FIELDS)))
