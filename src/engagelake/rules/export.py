"""`/users/export/ids`: request validation, matching, and the exported user objects.

Matching and summaries are joins and group-bys over the state; only the final shaping of at most
a page of users into JSON objects walks Python rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import orjson
import polars as pl

from engagelake.requests.models import ExportResponse, MessageResponse, dump
from engagelake.rules import formats as F
from engagelake.rules import messages as M
from engagelake.rules.profile.validate import normalize_email, normalize_phone
from engagelake.rules.state import State
from engagelake.tables.types import UTC_TS

WINDOW = timedelta(days=90)
POINT_READS_MAX = 1000  # up to this many users, exports read rows by binary search
PROFILE_FIELDS = (
    "external_id", "first_name", "last_name", "email", "phone", "dob", "gender", "country",
    "language", "home_city", "time_zone", "attributed_campaign", "attributed_source",
    "attributed_adgroup", "attributed_ad", "email_subscribe", "push_subscribe",
)


# The push service a token's shape names, and the platform it serves (see docs/decisions.md):
# APNs device tokens are hex (32 bytes or more), FCM registration tokens `<instance>:APA91b...`,
# Web Push subscriptions their endpoint URL. Any other shape: platform unknown, not exported.
TOKEN_PLATFORMS = (
    (r"^(?:[0-9A-Fa-f]{2}){32,}$", "iOS"),
    (r"^[A-Za-z0-9_-]+:APA91b[A-Za-z0-9_-]+$", "Android"),
    (r"^https://", "Web"),
)


def token_platform(token: pl.Expr) -> pl.Expr:
    """The platform of each push token, from its shape (`TOKEN_PLATFORMS`); null when unknown."""
    out: Any = pl
    for pattern, platform in TOKEN_PLATFORMS:
        out = out.when(token.str.contains(pattern)).then(pl.lit(platform))
    return out.otherwise(pl.lit(None, pl.String))


def notifications_enabled(push_subscribe: pl.Expr) -> pl.Expr:
    """Whether a profile's push tokens may be sent notifications: unless it opted out of push
    (`push_subscribe` is `unsubscribed`)."""
    return (push_subscribe != "unsubscribed").fill_null(True)


class ExportError(ValueError):
    """A request the endpoint answers with 400 and this message."""


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def validate_export(body: Any, *, fields_required: bool = True) -> dict[str, Any]:
    """Check an export body in the documented order; returns it or raises ExportError."""
    if not isinstance(body, dict):
        raise ExportError(M.EXPORT_BODY_NOT_OBJECT)
    ext = body.get("external_ids")
    if ext is not None and not _strings(ext):
        raise ExportError(M.EXPORT_EXTERNAL_IDS)
    aliases = body.get("user_aliases")
    if aliases is not None and not (
        isinstance(aliases, list)
        and all(isinstance(a, dict) and isinstance(a.get("alias_name"), str)
                and isinstance(a.get("alias_label"), str) for a in aliases)
    ):
        raise ExportError(M.EXPORT_USER_ALIASES)
    for field in ("service_id", "device_id", "email_address", "phone"):
        if body.get(field) is not None and not isinstance(body[field], str):
            raise ExportError(M.EXPORT_STRING_FIELD.format(field=field))
    if len(ext or []) + len(aliases or []) > 50:
        raise ExportError(M.EXPORT_TOO_MANY)
    if sum(body.get(f) is not None for f in ("device_id", "email_address", "phone")) > 1:
        raise ExportError(M.EXPORT_ONE_OF)
    if not (ext or aliases or any(body.get(f) is not None for f in ("service_id", "device_id", "email_address", "phone"))):
        raise ExportError(M.EXPORT_NO_IDENTIFIER)
    fields = body.get("fields_to_export")
    if fields is None:
        if fields_required:
            raise ExportError(M.EXPORT_FIELDS_REQUIRED)
    elif not _strings(fields):
        raise ExportError(M.EXPORT_FIELDS_SHAPE)
    else:
        unknown = [f for f in fields if f not in M.EXPORT_FIELDS]
        if unknown:
            raise ExportError(M.EXPORT_UNKNOWN_FIELDS.format(names=", ".join(unknown)))
    return body


def _one(value: str, expr_fn: Any) -> str | None:
    out = pl.DataFrame({"v": [value]}).select(expr_fn(pl.col("v")))
    result = out.item()
    return str(result) if result is not None else None


def _tables(fields: list[str] | None) -> list[str]:
    """The tables an export of `fields` reads, beside profiles."""
    want = set(fields) if fields is not None else set(M.EXPORT_FIELDS)
    return [table for table, shown in (
        ("attributes", {"custom_attributes"}), ("aliases", {"user_aliases"}),
        ("push_tokens", {"push_tokens", "devices"}), ("events", {"custom_events"}),
        ("purchases", {"purchases", "total_revenue"}),
    ) if want & shown]


def match_users(state: State, body: dict[str, Any], *, also: Sequence[str] = ()) -> tuple[pl.DataFrame, list[str]]:
    """The matched users (`service_id`, `order`) and the identifiers that matched no one. The
    rows of the matched users in the tables `also` names are read with their profiles, at once."""
    wanted: list[tuple[str, str, str]] = []  # (kind, key, as given)
    for e in body.get("external_ids") or []:
        wanted.append(("ext", e, e))
    for a in body.get("user_aliases") or []:
        wanted.append(("alias", f"{a['alias_label']}\x1f{a['alias_name']}", a["alias_name"]))
    if body.get("service_id") is not None:
        wanted.append(("sid", body["service_id"], body["service_id"]))
    if body.get("device_id") is not None:
        wanted.append(("device", body["device_id"], body["device_id"]))
    if body.get("email_address") is not None:
        wanted.append(("email", _one(body["email_address"], normalize_email) or "", body["email_address"]))
    if body.get("phone") is not None:
        wanted.append(("phone", _one(body["phone"], normalize_phone) or "", body["phone"]))
    req = pl.DataFrame(wanted, schema={"kind": pl.String, "key": pl.String, "given": pl.String},
                       orient="row").with_row_index("order")
    def source(kind: str, keys: pl.Series) -> pl.DataFrame:
        """Rows of the identifier kind's table holding one of `keys`, as (key, service_id)."""
        values = keys.to_list()
        if kind == "alias":
            names = [k.split("\x1f", 1)[1] for k in values]
            rows = state.rows_where("aliases", "alias_name", names)
            return rows.select((pl.col("alias_label") + "\x1f" + pl.col("alias_name")).alias("key"), "service_id")
        table, column = {
            "ext": ("external_ids", "external_id"), "sid": ("profiles", "service_id"),
            "device": ("push_tokens", "device_id"), "email": ("profiles", "email"), "phone": ("profiles", "phone"),
        }[kind]
        return state.rows_where(table, column, values).select(pl.col(column).alias("key"), "service_id")

    index = pl.concat([
        source(kind, keys["key"]).with_columns(kind=pl.lit(kind)).select("kind", "key", "service_id")
        for (kind,), keys in req.group_by("kind")
    ])
    hits = req.join(index, on=["kind", "key"], how="left")
    invalid = hits.filter(pl.col("service_id").is_null())["given"].unique(maintain_order=True).to_list()
    matched = hits.filter(pl.col("service_id").is_not_null())
    if matched.height <= POINT_READS_MAX:
        state.prefetch(["profiles", *also], matched["service_id"])
    users = (
        matched.join(_rows(state, "profiles", matched.select("service_id")).select("service_id", "created_seq"),
                     on="service_id")
        .sort("order", "created_seq")
        .unique("service_id", keep="first", maintain_order=True)
        .select("service_id")
    )
    return users, invalid


def _ts(expr: pl.Expr) -> pl.Expr:
    return expr.dt.strftime(F.TIMESTAMP_OUT)


def _rows(state: State, table: str, users: pl.DataFrame, point_reads: bool = False) -> pl.DataFrame:
    """The table's rows of `users`: binary search for a page of users (or a range of them), a
    join for many."""
    if point_reads or users.height <= POINT_READS_MAX:
        return state.rows_where(table, "service_id", users["service_id"].to_list())
    return state[table].join(users.select("service_id"), on="service_id", how="semi")


def _summaries(log: pl.DataFrame, name_col: str, clock: datetime) -> dict[str, list[dict[str, Any]]]:
    now = pl.lit(clock).cast(UTC_TS)
    s = (
        log
        .filter((pl.col("time") >= now - WINDOW) & (pl.col("time") <= now))
        .group_by("service_id", name_col)
        .agg(first=_ts(pl.col("time").min()), last=_ts(pl.col("time").max()), count=pl.len())
        .sort("service_id", name_col)
    )
    out: dict[str, list[dict[str, Any]]] = {}
    for sid, name, first, last, count in s.iter_rows():  # one row per (user, name) of the page
        out.setdefault(sid, []).append({"name": name, "first": first, "last": last, "count": count})
    return out


def export_frame(state: State, users: pl.DataFrame, fields: list[str] | None, clock: datetime, *,
                 point_reads: bool = False) -> list[dict[str, Any]]:
    """Exported user objects for `users` (column `service_id`, in order). With `point_reads`,
    rows are read by key however many users there are (a chunk of a key range)."""
    want = set(fields) if fields is not None else set(M.EXPORT_FIELDS)
    if point_reads:  # a chunk of a key range (`export_ids` read its users' rows in `match_users`)
        state.prefetch(["profiles", *_tables(fields)], users["service_id"])
    prof = users.join(_rows(state, "profiles", users, point_reads), on="service_id", how="left").with_columns(
        created_at=_ts(pl.col("created_at")), push_opted_in_at=_ts(pl.col("push_opted_in_at")))
    attrs: dict[str, dict[str, Any]] = {}
    if "custom_attributes" in want:
        a = _rows(state, "attributes", users, point_reads).sort("service_id", "name")
        for sid, name, value in a.iter_rows():  # JSON shaping of the exported users' rows
            attrs.setdefault(sid, {})[name] = orjson.loads(value)
    aliases: dict[str, list[dict[str, str]]] = {}
    if "user_aliases" in want:
        al = _rows(state, "aliases", users, point_reads).sort("alias_label", "alias_name")
        for label, name, sid in al.iter_rows():  # JSON shaping, as above
            aliases.setdefault(sid, []).append({"alias_name": name, "alias_label": label})
    tokens: dict[str, list[dict[str, Any]]] = {}
    if want & {"push_tokens", "devices"}:
        tk = (_rows(state, "push_tokens", users, point_reads).sort("update_seq", "pos")
              .join(prof.select("service_id", "push_subscribe"), on="service_id", how="left", maintain_order="left")
              .select("app_id", token_platform(pl.col("token")).alias("platform"), "token", "device_id",
                      notifications_enabled(pl.col("push_subscribe")).alias("notifications_enabled"), "service_id"))
        for app_id, platform, token, device_id, enabled, sid in tk.iter_rows():  # JSON shaping of one page of users: not hot
            t: dict[str, Any] = {"app": app_id}
            if platform is not None:
                t["platform"] = platform
            t["token"] = token
            if device_id is not None:
                t["device_id"] = device_id
            t["notifications_enabled"] = enabled
            tokens.setdefault(sid, []).append(t)
    events = _summaries(_rows(state, "events", users, point_reads), "name", clock) if "custom_events" in want else {}
    bought = _rows(state, "purchases", users, point_reads) if want & {"purchases", "total_revenue"} else None
    purchases = _summaries(bought, "product_id", clock) if bought is not None and "purchases" in want else {}
    revenue: dict[str, float] = {}
    if bought is not None and "total_revenue" in want:
        r = bought.group_by("service_id").agg(
            (pl.col("price") * pl.col("quantity")).sum().round(6).alias("rev"))
        revenue = dict(r.iter_rows())  # one row per exported user
    out = []
    for row in prof.iter_rows(named=True):  # one row per exported user: JSON shaping only
        sid = row["service_id"]
        u: dict[str, Any] = {}
        for f in ("created_at", *PROFILE_FIELDS, "push_opted_in_at"):
            if f in want and row[f] is not None:
                u[f] = row[f]
        if "service_id" in want:
            u["service_id"] = sid
        if "random_bucket" in want:
            u["random_bucket"] = row["random_bucket"]
        if "last_coordinates" in want and row["last_coordinates"] is not None:
            u["last_coordinates"] = list(row["last_coordinates"])
        if sid in attrs:
            u["custom_attributes"] = attrs[sid]
        if sid in aliases:
            u["user_aliases"] = aliases[sid]
        if sid in events:
            u["custom_events"] = events[sid]
        if sid in purchases:
            u["purchases"] = purchases[sid]
        if sid in revenue:
            u["total_revenue"] = revenue[sid]
        if sid in tokens:
            if "push_tokens" in want:
                u["push_tokens"] = tokens[sid]
            if "devices" in want:
                devices = list(dict.fromkeys(t["device_id"] for t in tokens[sid] if "device_id" in t))
                if devices:
                    u["devices"] = [{"device_id": d} for d in devices]
        out.append(u)
    return out


def export_ids(state: State, body: Any, clock: datetime, *, fields_required: bool = True) -> tuple[int, dict[str, Any]]:
    """The whole endpoint: (status, response body)."""
    try:
        body = validate_export(body, fields_required=fields_required)
    except ExportError as e:
        return 400, dump(MessageResponse, {"message": str(e)})
    users, invalid = match_users(state, body, also=_tables(body.get("fields_to_export")))
    result: dict[str, Any] = {
        "message": "success",
        "users": export_frame(state, users, body.get("fields_to_export"), clock),
    }
    if invalid:
        result["invalid_user_ids"] = invalid
    return 200, dump(ExportResponse, result)
