"""Flatten `/users/track` bodies into operation tables, vectorized in DuckDB.

Input: one row per request (`req`, `body` as JSON text). Output frames, one row per thing:
- `requests`: the request-level facts the fatal checks need;
- `objects`: one row per attributes/events/purchases element, with `seq` = the global order
  (request, then attributes, events, purchases, then index), identifier and fixed fields
  extracted with their JSON types;
- `pairs`: one row per key of each attributes object (profile fields and custom attributes);
- `tokens` / `groups`: one row per `push_tokens` / `subscription_groups` element.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from engagelake.rules import duck

if TYPE_CHECKING:
    import duckdb  # imported where used: a process that only reads never loads it

ARRAYS = ("attributes", "events", "purchases")
PARSE_CHUNK_BYTES = 4 << 20  # request text parsed at once (see `parse_track`)
PARSE_THREADS = 2


@dataclass(frozen=True)
class ParsedTrack:
    requests: pl.DataFrame
    objects: pl.DataFrame
    pairs: pl.DataFrame
    tokens: pl.DataFrame
    groups: pl.DataFrame


def _q(con: duckdb.DuckDBPyConnection, sql: str) -> pl.DataFrame:
    return pl.from_arrow(con.sql(sql).to_arrow_table())  # type: ignore[return-value]


FIXED = (
    "external_id", "user_alias", "service_id", "email", "phone", "_update_existing_only",
    "push_token_import", "name", "time", "app_id", "product_id", "currency", "price", "quantity",
    "properties", "push_tokens", "subscription_groups",
)
_FIXED_STRUCT = "{" + ", ".join(f'"{k}": "JSON"' for k in FIXED) + "}"
_ARRAYS_STRUCT = "{" + ", ".join(f'"{a}": "JSON"' for a in ARRAYS) + "}"

# Each body and each object is parsed once: json_transform pulls the fixed fields out as small
# JSON values (a JSON null reads as absent, which is what every fixed field means by null).
_REQUESTS_SQL = f"""
CREATE TEMP TABLE b AS
SELECT req, body_type,
       {", ".join(
           f"CASE WHEN list_contains(keys, '{a}') THEN coalesce(json_type(t.{a}), 'NULL') END AS {a}_type, "
           f"CASE WHEN json_type(t.{a}) = 'ARRAY' THEN t.{a} END AS {a}_json"
           for a in ARRAYS)}
FROM (
  SELECT req, json_type(j) AS body_type,
         CASE WHEN json_type(j) = 'OBJECT' THEN json_keys(j) END AS keys,
         CASE WHEN json_type(j) = 'OBJECT' THEN json_transform(j, '{_ARRAYS_STRUCT}') END AS t
  FROM (SELECT req, body::JSON AS j FROM bodies)
)
"""

_ELEMENTS_SQL = """
SELECT req, {arr_no} AS arr, i AS idx, e
FROM (
  SELECT req, unnest(l) AS e, unnest(generate_series(0, len(l) - 1)) AS i
  FROM (SELECT req, json_transform({arr}_json, '["JSON"]') AS l FROM b WHERE {arr}_json IS NOT NULL)
)
"""


def _field(key: str, name: str) -> str:
    return f"json_type(f.{key}) AS {name}_t, f.{key}->>'$' AS {name}"


_OBJECT_COLUMNS = ",\n  ".join(
    [
        "obj_t",
        _field("external_id", "ext"),
        "json_type(f.user_alias) AS alias_t",
        "json_type(f.user_alias, '$.alias_name') AS alias_name_t, f.user_alias->>'$.alias_name' AS alias_name",
        "json_type(f.user_alias, '$.alias_label') AS alias_label_t, f.user_alias->>'$.alias_label' AS alias_label",
        _field("service_id", "sid"),
        _field("email", "email"),
        _field("phone", "phone"),
        _field("_update_existing_only", "ueo"),
        _field("push_token_import", "pti"),
        _field("name", "name"),
        _field("time", "time"),
        _field("app_id", "app_id"),
        _field("product_id", "product_id"),
        _field("currency", "currency"),
        _field("price", "price"),
        _field("quantity", "quantity"),
        "json_type(f.properties) AS props_t",
        "CASE WHEN json_type(f.properties) = 'OBJECT' THEN f.properties::VARCHAR END AS props",
        "CASE WHEN json_type(f.properties) = 'OBJECT' THEN json_keys(f.properties) END AS props_keys",
        "CASE WHEN json_type(f.properties) = 'OBJECT' THEN list_bool_or(list_transform("
        "map_values(json_transform(f.properties, '\"MAP(VARCHAR, JSON)\"')), "
        "lambda x: coalesce(json_type(x) IN ('OBJECT', 'ARRAY'), false))) END AS props_nested",
        "json_type(f.push_tokens) AS tokens_t",
        "json_type(f.subscription_groups) AS groups_t",
    ]
)


def parse_track(bodies: pa.Table) -> ParsedTrack:
    """Flatten track request bodies (`req` int64, `body` JSON text) into operation tables.

    DuckDB's intermediate JSON values take about 3 KB per object (600-800 MiB for a pass of
    200k objects), so the bodies are parsed in chunks of about `PARSE_CHUNK_BYTES` of text,
    `PARSE_THREADS` chunks at a time, each on a one-thread connection of its own: the
    transient memory follows the chunks, and every core is busy (one DuckDB query of fewer
    than two row groups, 245,760 rows, would run on one thread anyway)."""
    sizes = pc.binary_length(bodies["body"]).to_numpy(zero_copy_only=False)
    ends = _chunk_ends(sizes, PARSE_CHUNK_BYTES)
    chunks = [bodies.slice(start, stop - start) for start, stop in zip([0, *ends[:-1]], ends, strict=True)]
    if len(chunks) == 1:
        return _parse(chunks[0], threads=None)
    with ThreadPoolExecutor(PARSE_THREADS) as pool:  # DuckDB runs without the GIL
        parts = list(pool.map(lambda chunk: _parse(chunk, threads=1), chunks))
    offsets = np.cumsum([0, *(part.objects.height for part in parts[:-1])])
    parts = [_shifted(part, int(seq)) for part, seq in zip(parts, offsets, strict=True)]
    return ParsedTrack(*(pl.concat([getattr(p, f) for p in parts]) for f in ParsedTrack.__dataclass_fields__))


def _parse(bodies: pa.Table, *, threads: int | None) -> ParsedTrack:
    with duck.connection(threads) as con:
        return _parse_chunk(con, bodies)


def _chunk_ends(sizes: np.ndarray, limit: int) -> list[int]:
    """Where chunks of consecutive rows end: a chunk ends where the running total of `sizes`
    passes a multiple of `limit`."""
    blocks = np.cumsum(sizes) // limit
    return [*(np.flatnonzero(np.diff(blocks)) + 1).tolist(), len(sizes)]


def _shifted(part: ParsedTrack, seq: int) -> ParsedTrack:
    if seq == 0:
        return part
    shift = pl.col("seq") + seq
    return ParsedTrack(part.requests, *(getattr(part, f).with_columns(shift)
                                        for f in ("objects", "pairs", "tokens", "groups")))


def _parse_chunk(con: duckdb.DuckDBPyConnection, bodies: pa.Table) -> ParsedTrack:
    con.register("bodies", bodies)
    con.execute(_REQUESTS_SQL)
    requests = _q(con, "SELECT req, body_type, "
                  + ", ".join(f"{a}_type, json_array_length({a}_json) AS {a}_len" for a in ARRAYS)
                  + " FROM b")
    elements = " UNION ALL ".join(
        _ELEMENTS_SQL.format(arr=a, arr_no=n) for n, a in enumerate(ARRAYS)
    )
    con.execute(
        f"""CREATE TEMP TABLE o AS
            SELECT row_number() OVER (ORDER BY req, arr, idx) - 1 AS seq, req, arr, idx, e,
                   coalesce(json_type(e), 'NULL') AS obj_t,
                   CASE WHEN json_type(e) = 'OBJECT' THEN json_transform(e, '{_FIXED_STRUCT}') END AS f
            FROM ({elements})"""
    )
    objects = _q(con, f"SELECT seq, req, arr, idx, {_OBJECT_COLUMNS} FROM o ORDER BY seq")
    # keys of attributes objects, in key order; MAP keeps the object's key order
    con.execute(
        """CREATE TEMP TABLE m AS
           SELECT seq, json_transform(e, '"MAP(VARCHAR, JSON)"') AS m
           FROM o WHERE arr = 0 AND obj_t = 'OBJECT'"""
    )
    pairs = _q(
        con,
        """WITH p AS (
             SELECT seq, unnest(map_keys(m)) AS key, unnest(map_values(m)) AS v,
                    unnest(generate_series(0, cardinality(m)::BIGINT - 1)) AS kpos
             FROM m)
           SELECT seq, key, kpos, v::VARCHAR AS v, coalesce(json_type(v), 'NULL') AS vt,
                  CASE WHEN json_type(v) = 'VARCHAR' THEN v->>'$' END AS vs,
                  CASE WHEN json_type(v) = 'OBJECT' THEN json_keys(v) END AS okeys,
                  json_type(v, '$.inc') AS inc_t,
                  CASE WHEN json_type(v, '$.inc') IN ('BIGINT', 'UBIGINT')
                       THEN TRY_CAST(v->>'$.inc' AS BIGINT) END AS inc,
                  json_type(v, '$.add') AS add_t, json_extract(v, '$.add')::VARCHAR AS add,
                  json_type(v, '$.remove') AS remove_t,
                  json_extract(v, '$.remove')::VARCHAR AS remove
           FROM p ORDER BY seq, kpos""",
    )
    tokens = _list_elements(con, "push_tokens", ("app_id", "token", "device_id"))
    groups = _list_elements(con, "subscription_groups", ("subscription_group_id", "subscription_state"))
    return ParsedTrack(requests, objects, pairs, tokens, groups)


def _list_elements(con: duckdb.DuckDBPyConnection, key: str, fields: tuple[str, ...]) -> pl.DataFrame:
    cols = ", ".join(f"json_type(x, '$.{f}') AS {f}_t, x->>'$.{f}' AS {f}" for f in fields)
    return _q(
        con,
        f"""SELECT seq, pos, json_type(x) AS elem_t, {cols} FROM (
              SELECT seq, unnest(l) AS x, unnest(generate_series(0, len(l) - 1)) AS pos
              FROM (SELECT seq, json_transform(f.{key}, '["JSON"]') AS l
                    FROM o WHERE arr = 0 AND json_type(f.{key}) = 'ARRAY'))""",
    )
