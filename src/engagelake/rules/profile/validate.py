"""Static validation of flattened track objects: fatal checks per request, the first non-fatal
error per object, and the normalized operation tables the later rules consume.

Every check is a Polars expression over the whole batch; the order of checks is the order of
docs/semantics.md, expressed as `pl.coalesce` over per-check error columns.
"""

from __future__ import annotations

import json
import zoneinfo
from dataclasses import dataclass
from functools import cache

import polars as pl

from engagelake.rules import formats as F
from engagelake.rules import messages as M
from engagelake.rules.profile.parse import ARRAYS, ParsedTrack
from engagelake.rules.reference import COUNTRY_CODES, LANGUAGE_CODES
from engagelake.tables.types import UTC_TS

INTEGER_TYPES = ("BIGINT", "UBIGINT")
NUMBER_TYPES = ("BIGINT", "UBIGINT", "DOUBLE")


@dataclass(frozen=True)
class ValidTrack:
    """Track operations after static validation; only rows of statically valid objects remain
    in the operation tables, while `objects` keeps every object with its `error`."""

    fatal: pl.DataFrame  # req, message
    objects: pl.DataFrame  # seq, req, arr, idx, error, kind, key, can_create, import_mode
    fields: pl.DataFrame  # seq, field, value (normalized text; null clears)
    custom: pl.DataFrame  # seq, kpos, name, op, value, inc, add, remove
    tokens: pl.DataFrame  # seq, pos, app_id, token, device_id
    groups: pl.DataFrame  # seq, pos, group_id, state
    events: pl.DataFrame  # seq, name, time, app_id, properties
    purchases: pl.DataFrame  # seq, product_id, currency, price, quantity, time, app_id, properties


@cache
def _time_zones() -> list[str]:
    return sorted(zoneinfo.available_timezones())


def _present(col: str) -> pl.Expr:
    return pl.col(f"{col}_t").is_not_null() & (pl.col(f"{col}_t") != "NULL")


def _first_of(branches: list[tuple[pl.Expr, pl.Expr]], otherwise: pl.Expr | None = None) -> pl.Expr:
    """`when(c1).then(v1).when(c2).then(v2)...otherwise(...)` of the branches given: callers
    leave out the branches no row can take, as Polars evaluates every branch of a chain."""
    out = pl.lit(None) if otherwise is None else otherwise
    for when, then in reversed(branches):
        out = pl.when(when).then(then).otherwise(out)
    return out


def _err(cond: pl.Expr, message: str) -> pl.Expr:
    return pl.when(cond).then(pl.lit(message))


def fatal_errors(parsed: ParsedTrack, *, max_updates: int | None = None) -> pl.DataFrame:
    """The first fatal error of each request that has one: `req`, `message`. `max_updates`
    caps the attributes, events and purchases of a request together (None: no cap)."""
    r = parsed.requests
    checks: list[pl.Expr] = [
        _err(pl.col("body_type") != "OBJECT", M.FATAL_BODY_NOT_OBJECT),
        _err(pl.all_horizontal(pl.col(f"{a}_type").is_null() for a in ARRAYS), M.FATAL_NO_ARRAYS),
    ]
    # each request's first element that is no object, per array (most passes have none: no join)
    not_objects = parsed.objects.filter(pl.col("obj_t") != "OBJECT")
    if not_objects.height:
        r = r.join(not_objects.group_by("req").agg(
            pl.col("idx").filter(pl.col("arr") == n).min().alias(f"{a}_bad") for n, a in enumerate(ARRAYS)),
            on="req", how="left")
    else:
        r = r.with_columns(pl.lit(None, parsed.objects.schema["idx"]).alias(f"{a}_bad") for a in ARRAYS)
    for a in ARRAYS:
        checks.append(_err(pl.col(f"{a}_type").is_not_null() & (pl.col(f"{a}_type") != "ARRAY"),
                           M.FATAL_NOT_ARRAY.format(array=a)))
        checks.append(_err(pl.col(f"{a}_len") > 75, M.FATAL_TOO_MANY.format(array=a)))
        checks.append(
            pl.when(pl.col(f"{a}_bad").is_not_null()).then(
                pl.format(M.FATAL_ELEMENT_NOT_OBJECT.replace("{array}", a).replace("{index}", "{}"),
                          pl.col(f"{a}_bad"))
            )
        )
    if max_updates is not None:  # after each array's own checks, which name the array
        combined = pl.sum_horizontal(pl.col(f"{a}_len").fill_null(0) for a in ARRAYS)
        checks.append(_err(combined > max_updates, M.FATAL_TOO_MANY_UPDATES.format(limit=max_updates)))
    blocked = (
        parsed.objects.filter(
            (pl.col("ext_t") == "VARCHAR")
            & pl.col("ext").str.strip_chars().str.to_lowercase().is_in(list(M.BLOCKED_EXTERNAL_IDS))
        ).select("req").unique().with_columns(blocked=pl.lit(True))
    )
    if blocked.height:
        r = r.join(blocked, on="req", how="left")
        checks.append(_err(pl.col("blocked").fill_null(False), M.FATAL_BLOCKED_EXTERNAL_ID))
    return r.select("req", pl.coalesce(checks).alias("message")).filter(pl.col("message").is_not_null())


def normalize_email(col: pl.Expr) -> pl.Expr:
    """Trimmed, lower-cased email, or null when it is not a valid address."""
    e = col.str.strip_chars().str.to_lowercase()
    ok = e.str.contains(F.EMAIL_RE) & (e.str.len_chars() <= F.EMAIL_MAX)
    return pl.when(ok).then(e)


def normalize_phone(col: pl.Expr) -> pl.Expr:
    """E.164 phone (`+digits`), or null when it is not valid."""
    p = col.str.replace_all(F.PHONE_SEPARATORS_RE, "")
    return pl.when(p.str.contains(F.PHONE_RE)).then(
        pl.when(p.str.starts_with("+")).then(p).otherwise(pl.lit("+") + p)
    )


def parse_time(col: pl.Expr) -> pl.Expr:
    """Parse the accepted time formats to UTC microseconds; null when invalid."""
    c = col.str.extract_groups(F.TIME_RE)
    base, frac, zone = c.struct.field("1"), c.struct.field("2"), c.struct.field("3")
    frac = pl.when(frac.str.starts_with(":")).then(pl.lit(".") + frac.str.slice(1)).otherwise(frac)
    zone = pl.when(zone == "Z").then(pl.lit("+00:00")).otherwise(
        pl.when(zone.str.len_chars() == 5).then(zone.str.slice(0, 3) + pl.lit(":") + zone.str.slice(3))
        .otherwise(zone)
    )
    text = base + frac.fill_null(".0") + zone
    return text.str.to_datetime("%Y-%m-%dT%H:%M:%S%.f%:z", strict=False, time_unit="us").dt.convert_time_zone("UTC")


# the common form of a time, in UTC: a subset of `F.TIME_RE` that one fixed format parses
_UTC_TIME_RE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z$"


def parse_times(text: pl.Series) -> pl.Series:
    """`parse_time` of a column, at a third of its cost: times in UTC parse with one format,
    and only the others (offsets, `:mmm` milliseconds, bad text) take the general path."""
    utc = text.str.contains(_UTC_TIME_RE).fill_null(False)
    # the seconds by a format without `%.f`, the fraction's first six digits as microseconds
    # (truncated, as `%.f` does): a third of the cost of parsing `%.fZ`
    fast = text.to_frame("t").select(
        pl.col("t").str.slice(0, 19).str.to_datetime("%Y-%m-%dT%H:%M:%S", strict=False, time_unit="us")
        + pl.duration(microseconds=pl.col("t").str.slice(20).str.strip_suffix("Z").str.pad_end(6, "0")
                      .str.slice(0, 6).cast(pl.Int64, strict=False).fill_null(0))
    ).to_series().dt.replace_time_zone("UTC")
    out = fast.zip_with(utc, pl.repeat(None, len(text), dtype=fast.dtype, eager=True))
    rest = (~utc & text.is_not_null()).arg_true()
    if rest.len():
        out = out.scatter(rest, pl.DataFrame({"t": text.gather(rest)}).select(parse_time(pl.col("t"))).to_series())
    return out


def _identifier(objects: pl.DataFrame) -> pl.DataFrame:
    """Identifier kind/key, identifier errors, and creation capability."""
    n_strong = pl.sum_horizontal(_present(c).cast(pl.Int8) for c in ("ext", "alias", "sid"))
    # the normalizations are regular expressions: only when some object carries the field
    has_email, has_phone = objects.select(_present("email").any(), _present("phone").any()).row(0)
    email_n = normalize_email(pl.col("email")) if has_email else pl.lit(None, pl.String)
    phone_n = normalize_phone(pl.col("phone")) if has_phone else pl.lit(None, pl.String)
    alias_ok = (
        (pl.col("alias_t") == "OBJECT")
        & (pl.col("alias_name_t") == "VARCHAR") & (pl.col("alias_name") != "")
        & (pl.col("alias_label_t") == "VARCHAR") & (pl.col("alias_label") != "")
    ).fill_null(False)
    kind = (
        pl.when(n_strong > 1).then(None)
        .when(_present("ext")).then(pl.lit("ext"))
        .when(_present("alias")).then(pl.lit("alias"))
        .when(_present("sid")).then(pl.lit("sid"))
        .when(_present("email")).then(pl.lit("email"))
        .when(_present("phone")).then(pl.lit("phone"))
    )
    id_error = (
        pl.when(n_strong > 1).then(pl.lit(M.ERR_MULTIPLE_IDENTIFIERS))
        .when(_present("ext") & ((pl.col("ext_t") != "VARCHAR") | (pl.col("ext") == ""))).then(pl.lit(M.ERR_EXTERNAL_ID))
        .when(_present("alias") & ~alias_ok).then(pl.lit(M.ERR_USER_ALIAS))
        .when(_present("sid") & ((pl.col("sid_t") != "VARCHAR") | (pl.col("sid") == ""))).then(pl.lit(M.ERR_SERVICE_ID))
        .when(n_strong == 0).then(
            pl.when(_present("email")).then(
                pl.when((pl.col("email_t") != "VARCHAR") | email_n.is_null()).then(pl.lit(M.ERR_EMAIL)))
            .when(_present("phone")).then(
                pl.when((pl.col("phone_t") != "VARCHAR") | phone_n.is_null()).then(pl.lit(M.ERR_PHONE)))
            .otherwise(pl.lit(M.ERR_MISSING_IDENTIFIER))
        )
    )
    ueo = (pl.col("ueo_t") == "BOOLEAN").fill_null(False)
    ueo_true = ueo & (pl.col("ueo") == "true").fill_null(False)
    ueo_false = ueo & (pl.col("ueo") == "false").fill_null(False)
    can_create = (
        pl.when(pl.col("kind").is_in(["ext", "email", "phone"])).then(~ueo_true)
        .when(pl.col("kind") == "alias").then((pl.col("arr") == 0) & ueo_false)
        .otherwise(False)
    )
    key = (
        pl.when(pl.col("kind") == "ext").then(pl.col("ext"))
        .when(pl.col("kind") == "alias").then(pl.col("alias_label") + pl.lit("\x1f") + pl.col("alias_name"))
        .when(pl.col("kind") == "sid").then(pl.col("sid"))
        .when(pl.col("kind") == "email").then(email_n)
        .when(pl.col("kind") == "phone").then(phone_n)
    )
    return (
        objects.with_columns(kind=kind, id_error=id_error)
        .with_columns(key=key, can_create=can_create.fill_null(False))
    )


def _field_errors(pairs: pl.DataFrame, objects: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Profile-field pairs: (first error per object, normalized field updates)."""
    order = {f: i for i, f in enumerate(M.PROFILE_FIELD_ORDER)}
    f = (
        pairs.filter(pl.col("key").is_in(list(M.PROFILE_FIELD_ORDER)))
        .join(objects.select("seq", "kind"), on="seq")
        # an identifier is not a field update of its own object
        .filter(~((pl.col("key") == pl.col("kind")) & pl.col("kind").is_in(["email", "phone"])))
    )
    is_null = pl.col("vt") == "NULL"
    is_str = pl.col("vt") == "VARCHAR"
    s = pl.col("vs")
    key = pl.col("key")
    # each field's check is built only when the pass writes that field: Polars evaluates every
    # branch of a `when` chain, and the lists of country, language and time zone codes cost
    # a small pass's query more than its rows (2.5 ms of a one-object validation)
    present = set(f["key"].unique().to_list())
    normalized = {"email": normalize_email(s), "phone": normalize_phone(s), "country": s.str.to_uppercase(),
                  "language": s.str.to_lowercase(), "last_coordinates": pl.col("v")}
    value = _first_of([(is_null, pl.lit(None, pl.String)),
                       *((key == field, expr) for field, expr in normalized.items() if field in present)], s)
    f = f.with_columns(value=value)
    coord_re = r"^\[-?[0-9][0-9.eE+\-]*,-?[0-9][0-9.eE+\-]*\]$"
    coords_text = pl.when((key == "last_coordinates") & pl.col("v").str.contains(coord_re)).then(pl.col("v"))
    coords = coords_text.str.json_decode(pl.List(pl.Float64))
    dob = s.str.to_date("%Y-%m-%d", strict=False)
    checks: list[tuple[pl.Expr, pl.Expr]] = [
        (key.is_in(list(M.STRING_FIELDS)), _err(~is_str | (s.str.len_chars() > F.MAX_STRING), "")),
    ] if present & set(M.STRING_FIELDS) else []
    by_field = {
        "email": lambda: _err(~is_str | pl.col("value").is_null(), M.ERR_EMAIL),
        "phone": lambda: _err(~is_str | pl.col("value").is_null(), M.ERR_PHONE),
        "dob": lambda: _err(~is_str | ~s.str.contains(F.DOB_RE) | dob.is_null(), M.ERR_DOB),
        "gender": lambda: _err(~is_str | ~s.is_in(list(M.GENDERS)), M.ERR_GENDER),
        "country": lambda: _err(~is_str | ~pl.col("value").is_in(sorted(COUNTRY_CODES)), M.ERR_COUNTRY),
        "language": lambda: _err(~is_str | ~pl.col("value").is_in(sorted(LANGUAGE_CODES)), M.ERR_LANGUAGE),
        "time_zone": lambda: _err(~is_str | ~s.is_in(_time_zones()), M.ERR_TIME_ZONE),
        "last_coordinates": lambda: _err(
            (coords.list.len() != 2).fill_null(True)
            | (coords.list.get(0, null_on_oob=True).abs() > 180).fill_null(True)
            | (coords.list.get(1, null_on_oob=True).abs() > 90).fill_null(True),
            M.ERR_COORDINATES,
        ),
    }
    checks += [(key == field, check()) for field, check in by_field.items() if field in present]
    subscribe = ["email_subscribe", "push_subscribe"]
    if present & set(subscribe):
        checks.append((key.is_in(subscribe), _err(~is_str | ~s.is_in(list(M.SUBSCRIBE_STATES)), "")))
    bad = _first_of([(is_null, pl.lit(None, pl.String)), *checks])
    message = (
        pl.when(bad == "").then(
            pl.when(key.is_in(subscribe))
            .then(pl.format(M.ERR_SUBSCRIBE.replace("{field}", "{}"), key))
            .otherwise(pl.format(M.ERR_FIELD_STRING.replace("{field}", "{}"), key))
        ).otherwise(bad)
    )
    f = f.with_columns(error=message, forder=key.replace_strict(order, return_dtype=pl.Int32))
    first = (
        f.filter(pl.col("error").is_not_null()).sort("seq", "forder")
        .group_by("seq", maintain_order=True).agg(pl.col("error").first().alias("field_error"))
    )
    return first, f.select("seq", pl.col("key").alias("field"), "value")


def _depth_exceeds(values: pl.Series) -> pl.Series:
    """Exact object-nesting check; called only on the rare values with more than 50 `{`."""

    def depth(v: object) -> int:
        if isinstance(v, dict):
            return 1 + max((depth(x) for x in v.values()), default=0)
        if isinstance(v, list):
            return max((depth(x) for x in v), default=0)
        return 0

    return pl.Series([depth(json.loads(v)) > F.MAX_DEPTH for v in values], dtype=pl.Boolean)


def _custom_ops(pairs: pl.DataFrame) -> pl.DataFrame:
    """Custom-attribute pairs with their operation and first error per pair."""
    c = pairs.filter(~pl.col("key").is_in(list(M.RESERVED_NAMES)))
    okeys = pl.col("okeys")
    is_inc = (pl.col("vt") == "OBJECT") & (okeys.list.len() == 1) & (okeys.list.first() == "inc")
    is_arr = (
        (pl.col("vt") == "OBJECT") & (okeys.list.len() > 0)
        & okeys.list.eval(pl.element().is_in(["add", "remove"])).list.all()
    )
    op = (
        pl.when(pl.col("vt") == "NULL").then(pl.lit("unset"))
        .when(is_inc).then(pl.lit("inc"))
        .when(is_arr).then(pl.lit("arr"))
        .otherwise(pl.lit("set"))
    )
    c = c.with_columns(op=op)
    deep_candidates = c.filter(pl.col("v").str.count_matches("{", literal=True) > F.MAX_DEPTH)
    if deep_candidates.height:  # rare: a join copies every column
        deep = deep_candidates.select("seq", "kpos").with_columns(too_deep=_depth_exceeds(deep_candidates["v"]))
        c = c.join(deep, on=["seq", "kpos"], how="left").with_columns(pl.col("too_deep").fill_null(False))
    else:
        c = c.with_columns(too_deep=pl.lit(False))
    name = pl.col("key")
    error = pl.coalesce(
        _err((name == "") | (name.str.len_chars() > F.MAX_NAME) | name.str.starts_with("$"), M.ERR_ATTRIBUTE_NAME),
        _err((pl.col("vt") == "VARCHAR") & (pl.col("vs").str.len_chars() > F.MAX_STRING), M.ERR_ATTRIBUTE_STRING),
        _err((pl.col("op") == "inc") & pl.col("inc").is_null(), M.ERR_INC_VALUE),
        _err(
            (pl.col("op") == "arr")
            & ((pl.col("add_t").is_not_null() & (pl.col("add_t") != "ARRAY"))
               | (pl.col("remove_t").is_not_null() & (pl.col("remove_t") != "ARRAY"))),
            M.ERR_ADD_REMOVE_VALUE,
        ),
        _err(pl.col("too_deep"), M.ERR_ATTRIBUTE_DEPTH),
    )
    return c.with_columns(error=error).select(
        "seq", "kpos", pl.col("key").alias("name"), "op", pl.col("v").alias("value"), "vt",
        "inc", "add", "remove", "error",
    )


def _list_errors(frame: pl.DataFrame, ok: pl.Expr, message: str, objects: pl.DataFrame, col: str) -> pl.DataFrame:
    """Per object: error when the key is not an array or any element is malformed."""
    not_array = objects.filter(_present(col) & (pl.col(f"{col}_t") != "ARRAY")).select("seq")
    if frame.height == 0:  # no element at all (most passes): only objects whose field is no array
        return not_array.with_columns(pl.lit(message).alias(f"{col}_error"))
    bad_elem = frame.filter(~ok.fill_null(False)).select("seq").unique()
    return pl.concat([bad_elem, not_array]).unique().with_columns(pl.lit(message).alias(f"{col}_error"))


def validate_track(parsed: ParsedTrack, *, max_updates: int | None = None) -> ValidTrack:
    """Run every static check over a parsed batch (`max_updates`: see `fatal_errors`)."""
    fatal = fatal_errors(parsed, max_updates=max_updates)
    objects = parsed.objects
    if fatal.height:  # a join copies every column: only when a request failed
        objects = objects.join(fatal, on="req", how="anti")
    objects = _identifier(objects)
    import_mode = ((pl.col("arr") == 0) & (pl.col("pti_t") == "BOOLEAN") & (pl.col("pti") == "true")).fill_null(False)
    objects = objects.with_columns(import_mode=import_mode)

    tok_ok = (
        (pl.col("elem_t") == "OBJECT")
        & (pl.col("app_id_t") == "VARCHAR") & (pl.col("app_id") != "")
        & (pl.col("token_t") == "VARCHAR") & (pl.col("token") != "")
        & (pl.col("device_id_t").is_null() | pl.col("device_id_t").is_in(["VARCHAR", "NULL"]))
    )
    grp_ok = (
        (pl.col("elem_t") == "OBJECT")
        & (pl.col("subscription_group_id_t") == "VARCHAR") & (pl.col("subscription_group_id") != "")
        & (pl.col("subscription_state_t") == "VARCHAR")
        & pl.col("subscription_state").is_in(list(M.GROUP_STATES))
    )
    tok_err = _list_errors(parsed.tokens, tok_ok, M.ERR_PUSH_TOKENS, objects, "tokens")
    grp_err = _list_errors(parsed.groups, grp_ok, M.ERR_SUBSCRIPTION_GROUPS, objects, "groups")
    field_err, fields = _field_errors(parsed.pairs, objects)
    custom = _custom_ops(parsed.pairs)
    custom_err = (
        custom.filter(pl.col("error").is_not_null()).sort("seq", "kpos")
        .group_by("seq", maintain_order=True).agg(pl.col("error").first().alias("custom_error"))
    )
    objects = (
        objects.join(tok_err, on="seq", how="left").join(grp_err, on="seq", how="left")
        .join(field_err, on="seq", how="left").join(custom_err, on="seq", how="left")
    )
    text = objects.select(pl.when(pl.col("time_t") == "VARCHAR").then(pl.col("time"))).to_series()
    objects = objects.with_columns(parse_times(text).cast(UTC_TS).alias("time_utc"))
    app_err = _err(_present("app_id") & (pl.col("app_id_t") != "VARCHAR"), M.ERR_APP_ID)
    props_err = pl.coalesce(
        _err(_present("props") & (pl.col("props_t") != "OBJECT"), M.ERR_PROPERTIES),
        _err(
            pl.col("props_keys").list.eval(
                (pl.element() == "") | (pl.element().str.len_chars() >= F.MAX_NAME) | pl.element().str.starts_with("$")
            ).list.any().fill_null(False),
            M.ERR_PROPERTY_NAME,
        ),
        _err(
            pl.col("props").str.len_bytes()
            > pl.when(pl.col("props_nested").fill_null(False)).then(F.PROPS_MAX_NESTED).otherwise(F.PROPS_MAX_FLAT),
            M.ERR_PROPERTIES_SIZE,
        ),
    )
    time_err = _err(pl.col("time_utc").is_null(), M.ERR_TIME)
    attributes_err = pl.when(pl.col("import_mode")).then(pl.col("tokens_error")).otherwise(
        pl.coalesce(
            _err(_present("ueo") & (pl.col("ueo_t") != "BOOLEAN"), M.ERR_UPDATE_EXISTING_ONLY),
            pl.col("id_error"), "field_error", "tokens_error", "groups_error", "custom_error",
        )
    )
    common = pl.coalesce(
        _err(_present("ueo") & (pl.col("ueo_t") != "BOOLEAN"), M.ERR_UPDATE_EXISTING_ONLY),
        pl.col("id_error"),
    )
    events_err = pl.coalesce(
        common,
        _err((pl.col("name_t") != "VARCHAR").fill_null(True) | (pl.col("name") == "")
             | (pl.col("name").str.len_chars() > F.MAX_NAME), M.ERR_EVENT_NAME),
        time_err, app_err, props_err,
    )
    qty_t = pl.col("quantity_t")
    purchases_err = pl.coalesce(
        common,
        _err((pl.col("product_id_t") != "VARCHAR").fill_null(True) | (pl.col("product_id") == "")
             | (pl.col("product_id").str.len_chars() > F.MAX_NAME), M.ERR_PRODUCT_ID),
        _err((pl.col("currency_t") != "VARCHAR").fill_null(True) | ~pl.col("currency").str.contains(F.CURRENCY_RE),
             M.ERR_CURRENCY),
        _err(~pl.col("price_t").is_in(list(NUMBER_TYPES)).fill_null(False), M.ERR_PRICE),
        _err(
            _present("quantity")
            & (~qty_t.is_in(list(INTEGER_TYPES))
               | ~pl.col("quantity").cast(pl.Int64, strict=False).is_between(1, 100).fill_null(False)),
            M.ERR_QUANTITY,
        ),
        time_err, app_err, props_err,
    )
    pti_err = _err((pl.col("arr") == 0) & _present("pti") & (pl.col("pti_t") != "BOOLEAN"), M.ERR_PUSH_TOKEN_IMPORT)
    # each array's checks only when the pass has objects of it (every branch is evaluated)
    arrays = set(objects["arr"].unique().to_list())
    by_array = _first_of([(pl.col("arr") == n, array_err)
                          for n, array_err in enumerate((attributes_err, events_err, purchases_err)) if n in arrays],
                         pl.lit(None, pl.String))
    objects = objects.with_columns(error=pl.coalesce(pti_err, by_array))
    # lazy: each selection filters only the columns it keeps
    valid = objects.lazy().filter(pl.col("error").is_null())
    valid_attr = valid.filter((pl.col("arr") == 0) & ~pl.col("import_mode")).select("seq").collect()
    valid_any_attr = valid.filter(pl.col("arr") == 0).select("seq").collect()
    events = valid.filter(pl.col("arr") == 1).select(
        "seq", "name", pl.col("time_utc").alias("time"), "app_id", pl.col("props").alias("properties")).collect()
    purchases = valid.filter(pl.col("arr") == 2).select(
        "seq", "product_id", "currency", pl.col("price").cast(pl.Float64).alias("price"),
        pl.col("quantity").cast(pl.Int64, strict=False).fill_null(1).alias("quantity"),
        pl.col("time_utc").alias("time"), "app_id", pl.col("props").alias("properties")).collect()
    return ValidTrack(
        fatal=fatal,
        objects=objects.select("seq", "req", "arr", "idx", "error", "kind", "key", "can_create", "import_mode"),
        fields=fields.join(valid_attr, on="seq", how="semi"),
        custom=custom.join(valid_attr, on="seq", how="semi").drop("error"),
        tokens=parsed.tokens.join(valid_any_attr, on="seq", how="semi").select(
            "seq", "pos", "app_id", "token", "device_id"),
        groups=parsed.groups.join(valid_attr, on="seq", how="semi").select(
            "seq", "pos", pl.col("subscription_group_id").alias("group_id"),
            pl.col("subscription_state").alias("state")),
        events=events,
        purchases=purchases,
    )
