"""Flatten `/users/track` bodies into operation tables, vectorized in DuckDB (a small pass:
the same tables by a walk in Python, `parse_small.py`; `parsing.py` chooses).

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
PARSE_CHUNK_BYTES = 4 << 20  # request text parsed at once (see `parse_duckdb`)
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


# DuckDB's JSON values are text: every JSON function parses its input again. So each body and
# each object is parsed a few times only, by functions that take a list of paths and answer
# for all of them from one parse (the fixed fields' types and values, below); an attributes
# object once for its keys, once for its values and once for their types (`'$.*'` walks the
# object in key order, as `json_keys` does; a MAP of it took 2-3 times as long).
_ARRAY_PATHS = "[" + ", ".join(f"'$.{a}'" for a in ARRAYS) + "]"
_ARRAYS_STRUCT = "{" + ", ".join(f'"{a}": "JSON[]"' for a in ARRAYS) + "}"

_REQUESTS_SQL = f"""
CREATE TEMP TABLE b AS
SELECT req, body_type,
       {", ".join(
           f"ts[{n}] AS {a}_type, CASE WHEN ts[{n}] = 'ARRAY' THEN l.{a} END AS {a}_l"
           for n, a in enumerate(ARRAYS, 1))}
FROM (SELECT req, json_type(body) AS body_type, json_type(body, {_ARRAY_PATHS}) AS ts,
             json_transform(body, '{_ARRAYS_STRUCT}') AS l
      FROM bodies)
"""

_ELEMENTS_SQL = """
SELECT req, {arr_no} AS arr, i AS idx, e
FROM (
  SELECT req, unnest({arr}_l) AS e, unnest(generate_series(0, len({arr}_l) - 1)) AS i
  FROM b WHERE {arr}_l IS NOT NULL
)
"""

# An object's fixed fields: (path, column); `json_type` and `json_extract_string` read them all
# from one parse each, into the lists `ft` and `fv` of table `o`.
FIXED = (
    ("external_id", "ext"), ("user_alias", "alias"), ("user_alias.alias_name", "alias_name"),
    ("user_alias.alias_label", "alias_label"), ("service_id", "sid"), ("email", "email"),
    ("phone", "phone"), ("_update_existing_only", "ueo"), ("push_token_import", "pti"),
    ("name", "name"), ("time", "time"), ("app_id", "app_id"), ("product_id", "product_id"),
    ("currency", "currency"), ("price", "price"), ("quantity", "quantity"),
    ("properties", "props"), ("push_tokens", "tokens"), ("subscription_groups", "groups"),
)
_FIXED_PATHS = "[" + ", ".join(f"'$.{path}'" for path, _ in FIXED) + "]"
_AT = {column: n for n, (_, column) in enumerate(FIXED, 1)}  # 1-based list positions


def _type(column: str) -> pl.Expr:
    """A top-level field's JSON type; a JSON null reads as absent, which is what every fixed
    field means by null (a nested path keeps 'NULL': `alias_name_t` tells null from absent)."""
    kind = _raw_type(column)
    return pl.when(kind != "NULL").then(kind)


def _raw_type(column: str) -> pl.Expr:
    return pl.col("ft").list.get(_AT[column] - 1, null_on_oob=True)


def _value(column: str) -> pl.Expr:
    return pl.col("fv").list.get(_AT[column] - 1, null_on_oob=True)


# The objects' columns, taken from the lists in Polars: as SQL, these 40 expressions cost
# DuckDB more to plan (about 7 ms) than a small request's whole parse otherwise takes.
_OBJECT_COLUMNS = [
    pl.col("obj_t"),
    _type("ext").alias("ext_t"), _value("ext").alias("ext"),
    _type("alias").alias("alias_t"),
    _raw_type("alias_name").alias("alias_name_t"), _value("alias_name").alias("alias_name"),
    _raw_type("alias_label").alias("alias_label_t"), _value("alias_label").alias("alias_label"),
    *(expr for c in ("sid", "email", "phone", "ueo", "pti", "name", "time", "app_id", "product_id",
                     "currency", "price", "quantity")
      for expr in (_type(c).alias(f"{c}_t"), _value(c).alias(c))),
    _type("props").alias("props_t"),
    pl.when(_type("props") == "OBJECT").then(_value("props")).alias("props"),
]
_OBJECT_TAIL = [pl.col("props_keys"), pl.col("props_nested"),
                _type("tokens").alias("tokens_t"), _type("groups").alias("groups_t")]

# properties objects: their keys, and whether a value nests (read from the properties' text;
# `list_has_any` of the values' types, not a lambda over them: the statement 33 against 42 ms
# for 31k objects; an empty object's null became false, which the check reads alike)
_PROPS = f"ft[{_AT['props']}] = 'OBJECT'"
_LISTS_SQL = f"""
SELECT seq, req, arr, idx, obj_t, ft, fv,
       CASE WHEN {_PROPS} THEN json_keys(fv[{_AT['props']}]) END AS props_keys,
       CASE WHEN {_PROPS} THEN list_has_any(json_type(fv[{_AT['props']}], '$.*'), ['OBJECT', 'ARRAY']) END AS props_nested
FROM o
"""


def parse_duckdb(bodies: pa.Table) -> ParsedTrack:
    """Flatten track request bodies (`req` int64, `body` JSON text) into operation tables, in
    DuckDB (`parsing.parse_track` chooses between this and `parse_small`).

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


# an object's `"external_id": "..."` as the text of a body writes it (a value holding an escape
# is left out: it would be read wrong)
_EXTERNAL_ID = r'"external_id"\s*:\s*"[^"\\]*"'


def named_external_ids(texts: list[str]) -> pl.Series:
    """The distinct external IDs the track bodies `texts` (JSON text) name, found by a search
    of the text, for a batch to read their users' stored rows ahead (`batch.Ahead`). It
    may find more (a property's value that reads like one) and miss some (an ID written with
    an escape): what is read ahead only saves time."""
    found = pl.Series("body", texts, pl.String).str.extract_all(_EXTERNAL_ID).explode().drop_nulls()
    return (found.str.replace(r'^"external_id"\s*:\s*"', "").str.strip_suffix('"')
            .unique().rename("external_id"))


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


def without_requests(parsed: ParsedTrack, reqs: pl.Series) -> ParsedTrack:
    """`parsed` without the objects of the requests `reqs` (refused whole by a fatal check),
    the others renumbered `seq` 0.. in the same order: a refused request takes no `seq`, so it
    leaves no trace in the store's `update_seq` counter. `requests` keeps every request."""
    kept = parsed.objects.filter(~pl.col("req").is_in(reqs.implode()))
    renumber = kept.select("seq", new_seq=pl.int_range(pl.len()).cast(kept.schema["seq"]))

    def renumbered(frame: pl.DataFrame) -> pl.DataFrame:
        return (frame.join(renumber, on="seq", how="inner", maintain_order="left")
                .with_columns(pl.col("new_seq").alias("seq")).drop("new_seq"))

    return ParsedTrack(parsed.requests, renumbered(kept),
                       *(renumbered(getattr(parsed, f)) for f in ("pairs", "tokens", "groups")))


def _parse_chunk(con: duckdb.DuckDBPyConnection, bodies: pa.Table) -> ParsedTrack:
    con.register("bodies", bodies)
    con.execute(_REQUESTS_SQL)
    requests = _q(con, "SELECT req, body_type, "
                  + ", ".join(f"{a}_type, len({a}_l)::UBIGINT AS {a}_len" for a in ARRAYS)
                  + " FROM b")
    elements = " UNION ALL ".join(
        _ELEMENTS_SQL.format(arr=a, arr_no=n) for n, a in enumerate(ARRAYS)
    )
    con.execute(
        f"""CREATE TEMP TABLE o AS
            SELECT *, CASE WHEN obj_t = 'OBJECT' THEN json_type(e, {_FIXED_PATHS}) END AS ft,
                      CASE WHEN obj_t = 'OBJECT' THEN json_extract_string(e, {_FIXED_PATHS}) END AS fv
            FROM (SELECT row_number() OVER (ORDER BY req, arr, idx) - 1 AS seq, req, arr, idx, e,
                         coalesce(json_type(e), 'NULL') AS obj_t
                  FROM ({elements}))"""
    )
    objects = _sorted(_q(con, _LISTS_SQL), "seq").select("seq", "req", "arr", "idx", *_OBJECT_COLUMNS, *_OBJECT_TAIL)
    # keys of attributes objects, in key order, with their values and the values' types
    pairs = _q(
        con,
        """WITH p AS (
             SELECT seq, unnest(k) AS key, unnest(json_extract(e, '$.*')) AS v,
                    unnest(json_type(e, '$.*')) AS vt, unnest(generate_series(0, len(k) - 1)) AS kpos
             FROM (SELECT seq, e, json_keys(e) AS k FROM o WHERE arr = 0 AND obj_t = 'OBJECT')),
           ops AS (SELECT *, CASE WHEN vt = 'OBJECT' THEN json_type(v, ['$.inc', '$.add', '$.remove']) END AS ot,
                             CASE WHEN vt = 'OBJECT' THEN json_extract(v, ['$.inc', '$.add', '$.remove']) END AS ox
                   FROM p)
           SELECT seq, key, kpos, CASE WHEN vt <> 'NULL' THEN v::VARCHAR END AS v, vt,
                  CASE WHEN vt = 'VARCHAR' THEN v->>'$' END AS vs,
                  CASE WHEN vt = 'OBJECT' THEN json_keys(v) END AS okeys,
                  ot[1] AS inc_t,
                  CASE WHEN ot[1] IN ('BIGINT', 'UBIGINT') THEN TRY_CAST(ox[1]::VARCHAR AS BIGINT) END AS inc,
                  ot[2] AS add_t, ox[2]::VARCHAR AS add, ot[3] AS remove_t, ox[3]::VARCHAR AS remove
           FROM ops""",
    ).pipe(_sorted, "seq", "kpos")
    tokens = _list_elements(con, objects, "push_tokens", "tokens", ("app_id", "token", "device_id"))
    groups = _list_elements(con, objects, "subscription_groups", "groups",
                            ("subscription_group_id", "subscription_state"))
    return ParsedTrack(requests, objects, pairs, tokens, groups)


def _sorted(frame: pl.DataFrame, *by: str) -> pl.DataFrame:
    """`frame` sorted by `by`: DuckDB keeps the rows in the order the window numbered them,
    so this checks (cheaply) instead of sorting in SQL, and sorts only if it must."""
    keys = frame.select(pl.struct(*by).alias("k"))["k"] if len(by) > 1 else frame[by[0]]
    return frame if keys.is_sorted() else frame.sort(*by)


def _list_elements(con: duckdb.DuckDBPyConnection, objects: pl.DataFrame, key: str, column: str,
                   fields: tuple[str, ...]) -> pl.DataFrame:
    """One row per element of the `key` arrays of attributes objects (none: no query)."""
    if not objects.select(((pl.col("arr") == 0) & (pl.col(f"{column}_t") == "ARRAY")).any()).item():
        return pl.DataFrame(schema={"seq": pl.Int64, "pos": pl.Int64, "elem_t": pl.String,
                                    **{c: pl.String for f in fields for c in (f"{f}_t", f)}})
    cols = ", ".join(f"json_type(x, '$.{f}') AS {f}_t, x->>'$.{f}' AS {f}" for f in fields)
    return _q(
        con,
        f"""SELECT seq, pos, json_type(x) AS elem_t, {cols} FROM (
              SELECT seq, unnest(l) AS x, unnest(generate_series(0, len(l) - 1)) AS pos
              FROM (SELECT seq, json_transform(json_extract(e, '$.{key}'), '["JSON"]') AS l
                    FROM o WHERE arr = 0 AND ft[{_AT[column]}] = 'ARRAY'))""",
    )
