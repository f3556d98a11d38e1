"""Custom-attribute rules: type errors of `inc`/`add`/`remove`, and the final value of every
touched (user, attribute) after a batch of operations, as if applied one by one.

An operation row: `service_id, name, seq, op, value, vt, inc, add, remove` where `op` is `set`,
`unset`, `inc` or `arr`. Values are compact JSON text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import orjson
import polars as pl

from engagelake.rules import duck
from engagelake.rules import formats as F
from engagelake.rules import messages as M

if TYPE_CHECKING:
    import duckdb  # imported where used: a process that only reads never loads it

KEY = ["service_id", "name"]
BIG = 1 << 40
# below this many operations the fold runs on the keys themselves: coding them costs 28 small
# queries, more than a small batch's joins and groupings on strings save
CODE_KEYS_FROM = 2_000


def value_type(text: pl.Expr) -> pl.Expr:
    """JSON text → ARRAY / OBJECT / STRING / BOOLEAN / NUMBER (null stays null = missing)."""
    first = text.str.slice(0, 1)
    return (
        pl.when(first == "[").then(pl.lit("ARRAY"))
        .when(first == "{").then(pl.lit("OBJECT"))
        .when(first == '"').then(pl.lit("STRING"))
        .when(first.is_in(["t", "f"])).then(pl.lit("BOOLEAN"))
        .when(text.is_not_null()).then(pl.lit("NUMBER"))
    )


def _result_type() -> pl.Expr:
    return (
        pl.when(pl.col("op") == "unset").then(pl.lit("MISSING"))
        .when(pl.col("op") == "inc").then(pl.lit("NUMBER"))
        .when(pl.col("op") == "arr").then(pl.lit("ARRAY"))
        .otherwise(value_type(pl.col("value")))
    )


_RUN_START = "\x00run start"  # a text no type name is


def last_before_in_run(column: str, keys: list[str]) -> pl.Expr:
    """`pl.col(column).shift(1).forward_fill().over(keys)` for rows sorted by `keys`, and
    `column` a string column: each row's last non-null value of `column` among the rows before
    it with the same keys. Sorted rows of equal keys are runs, told apart by comparing each
    row with the one before: `over` would hash every row's keys (a 24-character ID and a name)
    to find its group, 140 ms against 2.5 ms for the 105k operations of a 200k-object pass."""
    same = pl.lit(True)
    for key in keys:
        same &= pl.col(key).eq_missing(pl.col(key).shift(1))
    starts = ~same | (pl.int_range(pl.len()) == 0)
    # a run's first row holds a mark, so that filling forward never crosses into the next run
    return (pl.when(starts).then(pl.lit(_RUN_START)).otherwise(pl.col(column).shift(1))
            .forward_fill().replace(_RUN_START, None).alias(column))


def attribute_errors(ops: pl.DataFrame, current: pl.DataFrame) -> pl.DataFrame:
    """`seq, error` of the first (by key position) operation per object that meets a value of
    the wrong type: `inc` on a non-number, `add`/`remove` on a non-array. Column `applied`
    tells which operations belong to objects that were applied; only those shape the value the
    next operation meets."""
    # only keys that see an inc or add/remove can meet a type error
    ops = ops.join(ops.filter(pl.col("op").is_in(["inc", "arr"])).select(KEY).unique(), on=KEY, how="semi")
    if ops.height == 0:
        return pl.DataFrame(schema={"seq": pl.Int64, "error": pl.String})
    cur = current.join(ops.select(KEY).unique(), on=KEY, how="semi").select(
        *KEY, value_type(pl.col("value")).alias("cur_type"))
    o = (
        ops.select(*KEY, "seq", "kpos", "op", "value", "applied")
        .sort([*KEY, "seq"])
        .with_columns(rt=pl.when(pl.col("applied")).then(_result_type()))
        .with_columns(prev=last_before_in_run("rt", KEY))
        .join(cur, on=KEY, how="left")
        .with_columns(prev=pl.coalesce("prev", "cur_type", pl.lit("MISSING")))
    )
    err = (
        pl.when((pl.col("op") == "inc") & ~pl.col("prev").is_in(["NUMBER", "MISSING"]))
        .then(pl.lit(M.ERR_INC_NOT_NUMERIC))
        .when((pl.col("op") == "arr") & ~pl.col("prev").is_in(["ARRAY", "MISSING"]))
        .then(pl.lit(M.ERR_ARRAY_OP_NOT_ARRAY))
    )
    return (
        o.with_columns(error=err).filter(pl.col("error").is_not_null())
        .sort("seq", "kpos").group_by("seq", maintain_order=True)
        .agg(pl.col("error").first())
    )


def _canonical(texts: pl.Series) -> pl.Series:
    """Canonical JSON (sorted keys) of values holding objects; the rare slow path of equality."""
    return pl.Series(
        [orjson.dumps(orjson.loads(t), option=orjson.OPT_SORT_KEYS).decode() for t in texts],
        dtype=pl.String,
    )


def _explode_arrays(con: duckdb.DuckDBPyConnection, frame: pl.DataFrame, col: str) -> pl.DataFrame:
    """One row per element of the JSON arrays in `col`: the frame's other columns, `pos`, `elem`."""
    if frame.height == 0:
        return frame.drop(col).with_columns(pos=pl.lit(0, pl.Int64), elem=pl.lit("", pl.String)).clear()
    con.register("arrays_in", frame.with_row_index("_rid").to_arrow())
    exploded = pl.from_arrow(
        con.sql(
            f"""SELECT _rid, unnest(json_extract("{col}"::JSON, '$[*]'))::VARCHAR AS elem,
                       unnest(generate_series(0, json_array_length("{col}"::JSON)::BIGINT - 1)) AS pos
                FROM arrays_in WHERE "{col}" IS NOT NULL"""
        ).to_arrow_table()
    )
    con.unregister("arrays_in")
    assert isinstance(exploded, pl.DataFrame)
    return frame.with_row_index("_rid").drop(col).join(exploded, on="_rid").drop("_rid")


def _with_canon(elems: pl.DataFrame) -> pl.DataFrame:
    has_obj = pl.col("elem").str.contains("{", literal=True)
    objs = elems.filter(has_obj)
    canon_objs = objs.with_columns(canon=_canonical(objs["elem"]))
    return pl.concat([elems.filter(~has_obj).with_columns(canon=pl.col("elem")), canon_objs])


def _fold_slow(base: list[str], steps: list[tuple[list[str], list[str]]]) -> str:
    """Sequential ordered-set fold with the cap after every step (arrays that may pass 500)."""

    def canon(t: str) -> str:
        return orjson.dumps(orjson.loads(t), option=orjson.OPT_SORT_KEYS).decode()

    items: dict[str, str] = {}
    for adds, removes in [(base, []), *steps]:
        for t in adds:
            items.pop(canon(t), None)
            items[canon(t)] = t
        for t in removes:
            items.pop(canon(t), None)
        while len(items) > F.MAX_ARRAY:
            items.pop(next(iter(items)))
    return "[" + ",".join(items.values()) + "]"


def _coded(ops: pl.DataFrame, *others: pl.DataFrame) -> tuple[list[pl.DataFrame], Callable[[pl.DataFrame], pl.DataFrame]]:
    """`ops` and `others` with the key columns replaced by integer codes (rows of `others`
    whose key is not in `ops` dropped), and the function that restores them. The rules join,
    group and sort by the key many times: two integers hash and compare far faster than a
    24-character ID and a name."""
    codes = {c: ops.select(pl.col(c).unique()).with_row_index(f"_{c}") for c in KEY}

    def encode(frame: pl.DataFrame) -> pl.DataFrame:
        for c, code in codes.items():
            frame = frame.join(code, on=c).drop(c).rename({f"_{c}": c})
        return frame

    def decode(frame: pl.DataFrame) -> pl.DataFrame:
        columns = frame.columns
        for c, code in codes.items():
            frame = frame.join(code.rename({c: f"_{c}", f"_{c}": c}), on=c).drop(c).rename({f"_{c}": c})
        return frame.select(columns)

    return [encode(f) for f in (ops, *others)], decode


def fold_attributes(ops: pl.DataFrame, current: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Final values of the touched attributes: (upserts `service_id,name,value`, deleted keys)."""
    if ops.height == 0:
        return current.clear(), current.clear().select(KEY)
    if ops.height < CODE_KEYS_FROM:  # `_fold` reads only the rows of `current` whose key is in `ops`
        return _fold(ops, current)
    (ops, current), decode = _coded(ops, current)
    upserts, deleted = _fold(ops, current)
    return decode(upserts), decode(deleted)


def _fold(ops: pl.DataFrame, current: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    ops = ops.sort([*KEY, "seq"])
    resets = (
        ops.filter(pl.col("op").is_in(["set", "unset"]))
        .group_by(KEY).agg(pl.col("seq").max().alias("reset_seq"), pl.col("op").last().alias("reset_op"),
                           pl.col("value").last().alias("reset_value"))
    )
    keys = (
        ops.select(KEY).unique()
        .join(resets, on=KEY, how="left")
        .join(current.rename({"value": "cur_value"}), on=KEY, how="left")
    )
    tail = ops.join(keys.select(*KEY, "reset_seq"), on=KEY).filter(
        pl.col("reset_seq").is_null() | (pl.col("seq") > pl.col("reset_seq"))
    )
    tail_kind = tail.group_by(KEY).agg(pl.col("op").first().alias("tail_op"))
    keys = keys.join(tail_kind, on=KEY, how="left").with_columns(
        base=pl.when(pl.col("reset_op").is_not_null()).then(pl.col("reset_value")).otherwise(pl.col("cur_value"))
    )
    deleted = keys.filter(pl.col("tail_op").is_null() & (pl.col("reset_op") == "unset")).select(KEY)
    # plain values: the last set, unless it is an array (normalized below)
    plain = keys.filter(pl.col("tail_op").is_null() & (pl.col("reset_op") == "set"))
    plain_values = plain.filter(value_type(pl.col("base")) != "ARRAY").select(*KEY, value=pl.col("base"))
    # a small pass pays about 150 us a query, empty frames' too: the kinds of operation it has
    # none of are skipped (their frames would be empty)
    kinds = set(ops["op"].unique().to_list())
    inc_values = array_values = plain_values.clear()
    if "inc" in kinds:  # increments: base (missing = 0) plus the sum of the tail
        incs = tail.filter(pl.col("op") == "inc").group_by(KEY).agg(pl.col("inc").sum().alias("inc_sum"))
        inc_keys = keys.filter(pl.col("tail_op") == "inc").join(incs, on=KEY).with_columns(
            is_float=pl.col("base").str.contains(r"[.eE]").fill_null(False),
            base=pl.col("base").fill_null("0"),
        )
        inc_values = inc_keys.select(
            *KEY,
            value=pl.when(pl.col("is_float"))
            .then((pl.col("base").cast(pl.Float64) + pl.col("inc_sum")).cast(pl.String))
            .otherwise((pl.col("base").cast(pl.Int64) + pl.col("inc_sum")).cast(pl.String)),
        )
    # arrays: ordered-set fold of base elements and the tail's add/remove operations
    arrays = plain.filter(value_type(pl.col("base")) == "ARRAY").select(KEY)
    arr_keys = pl.concat([arrays, keys.filter(pl.col("tail_op") == "arr").select(KEY)]) if "arr" in kinds else arrays
    if arr_keys.height:
        array_values = _fold_arrays(
            keys.join(arr_keys, on=KEY, how="semi"),
            tail.filter(pl.col("op") == "arr").join(arr_keys, on=KEY, how="semi"),
        )
    upserts = pl.concat([inc_values, plain_values, array_values]).select(*KEY, "value")
    return upserts, deleted


def _fold_arrays(keys: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Keys with `base` (JSON array text or null) and their `arr` steps → final array values."""
    if keys.height == 0:
        return keys.select(KEY).clear().with_columns(value=pl.lit(None, pl.String))
    with duck.connection() as con:
        base = keys.select(*KEY, pl.when(pl.col("base").str.starts_with("[")).then(pl.col("base")).alias("base"))
        base_e = _explode_arrays(con, base, "base").with_columns(
            seq=pl.lit(-1, pl.Int64), kind=pl.lit("add"))
        add_e = _explode_arrays(con, steps.select(*KEY, "seq", "add"), "add").with_columns(kind=pl.lit("add"))
        rem_e = _explode_arrays(con, steps.select(*KEY, "seq", "remove"), "remove").with_columns(
            kind=pl.lit("remove"), pos=pl.col("pos") + BIG)
    events = pl.concat([base_e, add_e, rem_e], how="diagonal_relaxed").select(*KEY, "seq", "pos", "kind", "elem")
    events = _with_canon(events)
    # keys that may pass the cap mid-way take the sequential slow path
    sizes = events.filter(pl.col("kind") == "add").group_by(KEY).agg(pl.len().alias("adds"))
    has_steps = steps.select(KEY).unique().with_columns(stepped=pl.lit(True))
    slow = sizes.join(has_steps, on=KEY).filter(pl.col("adds") > F.MAX_ARRAY).select(KEY)
    fast_events = events.join(slow, on=KEY, how="anti")
    last = (
        fast_events.sort([*KEY, "seq", "pos"])
        .group_by([*KEY, "canon"]).agg(pl.col("kind").last(), pl.col("seq").last(), pl.col("pos").last(),
                                       pl.col("elem").last())
        .filter(pl.col("kind") == "add")
        .sort([*KEY, "seq", "pos"])
        .group_by(KEY, maintain_order=True).agg(pl.col("elem").tail(F.MAX_ARRAY))
    )
    fast = keys.select(KEY).join(slow, on=KEY, how="anti").join(last, on=KEY, how="left").select(
        *KEY, value=pl.lit("[") + pl.col("elem").fill_null([]).list.join(",") + pl.lit("]"))
    slow_values = _fold_slow_keys(events.join(slow, on=KEY, how="semi"))
    return pl.concat([fast, slow_values])


def _fold_slow_keys(events: pl.DataFrame) -> pl.DataFrame:
    """The documented slow path: keys whose array may exceed the cap before the end of the batch."""
    rows = []
    for (sid, name), grp in events.sort("seq", "pos").group_by(KEY, maintain_order=True):
        base = grp.filter(pl.col("seq") == -1)["elem"].to_list()
        steps = [
            (s.filter(pl.col("kind") == "add")["elem"].to_list(), s.filter(pl.col("kind") == "remove")["elem"].to_list())
            for _, s in grp.filter(pl.col("seq") >= 0).group_by("seq", maintain_order=True)
        ]
        rows.append((sid, name, _fold_slow(base, steps)))
    return pl.DataFrame(rows, schema={**{c: events.schema[c] for c in KEY}, "value": pl.String}, orient="row")
