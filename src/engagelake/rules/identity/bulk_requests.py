"""Check and flatten runs of `/users/merge` and `/users/identify` bodies at once (the bulk
identity endpoints).

DuckDB unnests every element (its identifiers' fields and JSON types); Polars expressions then
apply the checks documented in docs/identity.md in order, so a request answers the same first
error as checking it by hand, and valid requests become item rows. The other identity endpoints
are checked per request in `identity_requests` (at most 50 small items, rarely in bulk).
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from engagelake.rules import duck
from engagelake.rules import messages as M
from engagelake.rules.identity.requests import ALIAS_SEP, MAX_ITEMS
from engagelake.rules.profile.validate import normalize_email, normalize_phone

SIDES = {"src": "identifier_to_merge", "tgt": "identifier_to_keep"}
KINDS = ("external_id", "user_alias", "service_id", "email", "phone")


def _side_sql(s: str) -> str:
    side = s
    cols = [f"json_type({side}) AS {s}_t", f"json_keys({side}) AS {s}_keys", f"{side}::VARCHAR AS {s}_json"]
    for k in ("external_id", "service_id", "email", "phone"):
        cols += [f"json_type({side}, '$.{k}') AS {s}_{k}_t", f"json_extract_string({side}, '$.{k}') AS {s}_{k}"]
    for k in ("alias_label", "alias_name"):
        cols += [f"json_type({side}, '$.user_alias.{k}') AS {s}_{k}_t",
                 f"json_extract_string({side}, '$.user_alias.{k}') AS {s}_{k}"]
    cols += [f"json_type({side}, '$.prioritization') AS {s}_prio_t",
             f"json_extract_string({side}, '$.prioritization[*]') AS {s}_prio",
             f"json_type({side}, '$.prioritization[*]') AS {s}_prio_types"]
    return ", ".join(cols)


def _frames(pending: list[tuple[int, str]]) -> tuple[pl.DataFrame, pl.DataFrame]:
    with duck.connection() as con:
        con.register("bodies", pa.table({"req": [r for r, _ in pending], "body": [t for _, t in pending]}))
        con.execute("CREATE TEMP TABLE b AS SELECT req, body::JSON AS j FROM bodies")  # `sql` cost 3 ms more
        reqs = con.sql("SELECT req, json_type(j) AS t, json_type(j, '$.merge_updates') AS a_t, "
                       "json_array_length(j, '$.merge_updates') AS n FROM b").to_arrow_table()
        # unnest (not json_each: ten times slower here) the elements beside their indexes
        items = con.sql(
            "WITH e AS (SELECT req, unnest(range(json_array_length(j, '$.merge_updates')::BIGINT)) AS item, "
            "unnest(json_extract(j, '$.merge_updates[*]')) AS v FROM b WHERE json_type(j, '$.merge_updates') = 'ARRAY'), "
            "f AS (SELECT req, item, json_type(v) AS e_t, v -> 'identifier_to_merge' AS src, "
            "v -> 'identifier_to_keep' AS tgt FROM e) "
            f"SELECT req, item, e_t, {_side_sql('src')}, {_side_sql('tgt')} FROM f"
        ).to_arrow_table()
    r, i = pl.from_arrow(reqs), pl.from_arrow(items)
    assert isinstance(r, pl.DataFrame) and isinstance(i, pl.DataFrame)
    return r, i.sort("req", "item")  # sorted here: DuckDB sorting the wide rows costs more


def _fill(template: str, name: str, value: pl.Expr) -> pl.Expr:
    """`template` with its `{name}` placeholder replaced by `value`, per row."""
    before, after = template.split("{" + name + "}")
    return pl.concat_str([pl.lit(before), value, pl.lit(after)])


def _text(col: str) -> pl.Expr:
    """A non-empty JSON string (false when absent)."""
    return ((pl.col(f"{col}_t") == "VARCHAR") & (pl.col(col).str.len_chars() > 0)).fill_null(False)


def _side_checks(s: str, where: pl.Expr, fixed_kind: pl.Expr | None = None
                 ) -> tuple[list[tuple[pl.Expr, pl.Expr]], list[pl.Expr]]:
    """Ordered (failing condition, message) checks of one identifier (columns prefixed `s`),
    and its derived columns. With `fixed_kind` the kind is given, not read from the keys."""
    present = [pl.col(f"{s}_keys").list.contains(k) for k in KINDS]
    kind = fixed_kind if fixed_kind is not None else pl.coalesce(
        *[pl.when(p).then(pl.lit(k)) for p, k in zip(present, KINDS, strict=True)])
    email, phone = normalize_email(pl.col(f"{s}_email")), normalize_phone(pl.col(f"{s}_phone"))
    alias_ok = _text(f"{s}_alias_label") & _text(f"{s}_alias_name")
    key = (pl.when(kind == "external_id").then(pl.when(_text(f"{s}_external_id")).then(pl.col(f"{s}_external_id")))
           .when(kind == "service_id").then(pl.when(_text(f"{s}_service_id")).then(pl.col(f"{s}_service_id")))
           .when(kind == "user_alias").then(pl.when(alias_ok).then(
               pl.col(f"{s}_alias_label") + ALIAS_SEP + pl.col(f"{s}_alias_name")))
           .when(kind == "email").then(pl.when(pl.col(f"{s}_email_t") == "VARCHAR").then(email))
           .otherwise(pl.when(pl.col(f"{s}_phone_t") == "VARCHAR").then(phone)))
    error = (pl.when(kind == "external_id").then(pl.lit(M.ERR_EXTERNAL_ID))
             .when(kind == "service_id").then(pl.lit(M.ERR_SERVICE_ID))
             .when(kind == "user_alias").then(pl.lit(M.ERR_USER_ALIAS))
             .when(kind == "email").then(pl.lit(M.ERR_EMAIL)).otherwise(pl.lit(M.ERR_PHONE)))
    contact = kind.is_in(["email", "phone"])
    prio = pl.col(f"{s}_prio")
    prio_ok = ((pl.col(f"{s}_prio_t") == "ARRAY") & (prio.list.len() > 0)
               & pl.col(f"{s}_prio_types").list.eval(pl.element() == "VARCHAR").list.all()
               & prio.list.eval(pl.element().is_in(M.PRIORITIZATION_VALUES)).list.all())
    both = prio.list.contains("identified") & prio.list.contains("unidentified")
    checks = [] if fixed_kind is not None else [
        (pl.sum_horizontal(present) != 1, _fill(M.IDENTIFIER_ONE_OF, "where", where))]
    checks += [
        (key.is_null(), _fill(M.IDENTIFIER_INVALID.replace("{error}", ""), "where", where) + error),
        (contact & ~prio_ok.fill_null(False), _fill(M.PRIORITIZATION, "where", where)),
        (contact & both.fill_null(False), _fill(M.PRIORITIZATION_BOTH, "where", where)),
    ]
    derived = [kind.alias(f"{s}_kind"), key.alias(f"{s}_key"),
               pl.when(contact).then(prio).alias(f"{s}_prio_out"), pl.col(f"{s}_json").alias(f"{s}_source")]
    return checks, derived


def _first_errors(*frames: pl.DataFrame) -> dict[int, str]:
    """Each request's first error message, the frames (req, message) taken in order."""
    ranked = pl.concat([f.select("req", "message", pl.lit(rank).alias("rank")) for rank, f in enumerate(frames)])
    first = ranked.sort("rank", maintain_order=True).unique("req", keep="first", maintain_order=True)
    return dict(zip(first["req"].to_list(), first["message"].to_list(), strict=True))


def _valid(items: pl.DataFrame, answered: dict[int, str]) -> pl.DataFrame:
    return items.filter(~pl.col("req").is_in(pl.Series(list(answered), dtype=pl.Int64).implode()))


def parse_merges(pending: list[tuple[int, str]]) -> tuple[dict[int, str], pl.DataFrame]:
    """(the 400 message of each invalid request, the item rows of the valid ones)."""
    reqs, items = _frames(pending)
    field = "merge_updates"
    req_error = (
        pl.when(pl.col("t") != "OBJECT").then(pl.lit(M.BODY_NOT_OBJECT))
        .when(pl.col("a_t").fill_null("") != "ARRAY").then(pl.lit(M.LIST_NOT_ARRAY.format(field=field)))
        .when(pl.col("n") == 0).then(pl.lit(M.LIST_EMPTY.format(field=field)))
        .when(pl.col("n") > MAX_ITEMS).then(pl.lit(M.LIST_TOO_MANY.format(field=field)))
    )
    errors = reqs.select("req", req_error.alias("message")).drop_nulls("message")
    not_object = (items.filter(pl.col("e_t") != "OBJECT").group_by("req").agg(pl.col("item").min())
                  .select("req", _fill(M.ITEM_NOT_OBJECT.replace("{field}", field), "index",
                                       pl.col("item").cast(pl.String)).alias("message")))
    objects = items.filter(pl.col("e_t") == "OBJECT")
    checks: list[tuple[pl.Expr, pl.Expr]] = [(
        (pl.col("src_t").fill_null("") != "OBJECT") | (pl.col("tgt_t").fill_null("") != "OBJECT"),
        _fill(M.MERGE_SIDES, "index", pl.col("item").cast(pl.String)),
    )]
    derived: list[pl.Expr] = []
    for s in SIDES:
        c, d = _side_checks(s, pl.lit("merge_updates[") + pl.col("item").cast(pl.String) + pl.lit(f"].{SIDES[s]}"))
        checks += c
        derived += d
    first_error = pl.coalesce(*[pl.when(cond.fill_null(False)).then(msg) for cond, msg in checks])
    checked = objects.with_columns(first_error.alias("message"), *derived)
    item_errors = (checked.drop_nulls("message").sort("req", "item").group_by("req", maintain_order=True)
                   .agg(pl.col("message").first()))
    # a request's first error: request level, then a non-object element, then item order
    answered = _first_errors(errors, not_object, item_errors)
    rows = _valid(checked, answered).select(
        "req", "item", "src_kind", "src_key", pl.col("src_prio_out").alias("src_prio"), "tgt_kind", "tgt_key",
        pl.col("tgt_prio_out").alias("tgt_prio"), pl.col("src_source").alias("source"),
        pl.col("tgt_source").alias("target"))
    return answered, rows


IDENTIFY_ARRAYS = (("aliases_to_identify", "user_alias"), ("emails_to_identify", "email"),
                   ("phone_numbers_to_identify", "phone"))


def _identify_frames(pending: list[tuple[int, str]]) -> tuple[pl.DataFrame, pl.DataFrame]:
    req_cols = ", ".join(
        f"json_type(j, '$.{f}') AS {f}_t, json_array_length(j, '$.{f}') AS {f}_n" for f, _ in IDENTIFY_ARRAYS)
    parts = " UNION ALL ".join(
        f"SELECT req, {order} AS arr, '{f}' AS field, '{k}' AS kind, "
        f"unnest(range(json_array_length(j, '$.{f}')::BIGINT)) AS item, unnest(json_extract(j, '$.{f}[*]')) AS v "
        f"FROM b WHERE json_type(j, '$.{f}') = 'ARRAY'"
        for order, (f, k) in enumerate(IDENTIFY_ARRAYS))
    with duck.connection() as con:
        con.register("bodies", pa.table({"req": [r for r, _ in pending], "body": [t for _, t in pending]}))
        con.execute("CREATE TEMP TABLE b AS SELECT req, body::JSON AS j FROM bodies")  # `sql` cost 3 ms more
        reqs = con.sql(f"SELECT req, json_type(j) AS t, {req_cols}, json_type(j, '$.merge_behavior') AS mb_t, "
                       "json_extract_string(j, '$.merge_behavior') AS mb FROM b").to_arrow_table()
        items = con.sql(
            f"WITH e AS ({parts}) SELECT req, arr, field, kind, item, json_type(v) AS e_t, {_side_sql('v')}, "
            "json_object(kind, v -> kind)::VARCHAR AS source FROM e ORDER BY req, arr, item").to_arrow_table()
    r, i = pl.from_arrow(reqs), pl.from_arrow(items)
    assert isinstance(r, pl.DataFrame) and isinstance(i, pl.DataFrame)
    return r, i


def parse_identifies(pending: list[tuple[int, str]]) -> tuple[dict[int, str], pl.DataFrame]:
    """(the 400 message of each invalid request, the element rows of the valid ones, in the
    order aliases, emails, phones, with the request's merge_behavior)."""
    reqs, items = _identify_frames(pending)
    present = [pl.col(f"{f}_t").is_not_null() for f, _ in IDENTIFY_ARRAYS]
    not_list = pl.coalesce(*[pl.when(p & (pl.col(f"{f}_t") != "ARRAY")).then(pl.lit(M.LIST_NOT_ARRAY.format(field=f)))
                             for p, (f, _) in zip(present, IDENTIFY_ARRAYS, strict=True)])
    total = pl.sum_horizontal(*[pl.col(f"{f}_n").fill_null(0) for f, _ in IDENTIFY_ARRAYS])
    behavior_ok = pl.col("mb_t").is_null() | ((pl.col("mb_t") == "VARCHAR") & pl.col("mb").is_in(["none", "merge"]))
    req_error = (
        pl.when(pl.col("t") != "OBJECT").then(pl.lit(M.BODY_NOT_OBJECT))
        .when(~pl.any_horizontal(present)).then(pl.lit(M.IDENTIFY_NO_ARRAYS))
        .when(not_list.is_not_null()).then(not_list)
        .when(total > MAX_ITEMS).then(pl.lit(M.IDENTIFY_TOO_MANY))
        .when(~behavior_ok).then(pl.lit(M.IDENTIFY_MERGE_BEHAVIOR))
    )
    errors = reqs.select("req", req_error.alias("message")).drop_nulls("message")
    where = pl.col("field") + pl.lit("[") + pl.col("item").cast(pl.String) + pl.lit("]")
    ext = pl.col("v_external_id")
    checks: list[tuple[pl.Expr, pl.Expr]] = [
        (pl.col("e_t") != "OBJECT", _fill(M.ITEM_NOT_OBJECT.replace("{field}[{index}]", "{where}"), "where", where)),
        (~_text("v_external_id"), _fill(M.IDENTIFY_EXTERNAL_ID, "where", where)),
        (ext.str.strip_chars().str.to_lowercase().is_in(sorted(M.BLOCKED_EXTERNAL_IDS)),
         _fill(M.IDENTIFY_BLOCKED, "where", where)),
    ]
    side_checks, derived = _side_checks("v", where, fixed_kind=pl.col("kind"))
    checks += side_checks
    first_error = pl.coalesce(*[pl.when(cond.fill_null(False)).then(msg) for cond, msg in checks])
    checked = items.with_columns(first_error.alias("message"), *derived)
    item_errors = (checked.drop_nulls("message").sort("req", "arr", "item").group_by("req", maintain_order=True)
                   .agg(pl.col("message").first()))
    answered = _first_errors(errors, item_errors)
    behavior = reqs.select("req", pl.col("mb").fill_null("none").alias("merge_behavior"))
    rows = _valid(checked, answered).join(behavior, on="req").sort("req", "arr", "item").select(
        "req", "item", pl.col("field").alias("array"), pl.col("v_kind").alias("src_kind"),
        pl.col("v_key").alias("src_key"), pl.col("v_prio_out").alias("src_prio"),
        pl.col("v_external_id").alias("external_id"), "source",
        pl.struct(pl.col("v_external_id").alias("external_id")).struct.json_encode().alias("target"),
        "merge_behavior")
    return answered, rows
