"""Subscription group reads of the hosted API (issue 53): a group's state for given users
(`GET /subscription/status/get`) and the groups of given users (`GET /subscription/user/status`).

Both read the `subscriptions` table (one row per user and group, `subscribed` or
`unsubscribed`, written by the `subscription_groups` of `/users/track`); the store keeps no
group definitions, so a group is known by its ID alone. Users are resolved as
`/users/export/ids` resolves them: external IDs (current or deprecated) through `external_ids`,
emails and phones normalized as in track, and only current profiles count (a deleted or merged
profile has none). The decisions are in `docs/semantics.md`, "Subscription groups".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from engagelake.resources.catalogs import raise_for_response
from engagelake.resources.refusals import Refused, answering
from engagelake.routing import Client, Context, Handler, Request, Response
from engagelake.rules.profile.validate import normalize_email, normalize_phone
from engagelake.rules.state import State

STATUS_GET = "/subscription/status/get"
USER_STATUS = "/subscription/user/status"

KINDS = ("external_id", "email", "phone")  # the identifier parameters, in the order they count
MAX_USERS = 50  # identifiers of one kind per request, as the hosted API
MAX_LIMIT = DEFAULT_LIMIT = 100

ERR_GROUP = "subscription_group_id is required: the ID of one subscription group, as text"
ERR_NO_USER = "give at least one user: external_id, email or phone"
ERR_EMAIL_AND_PHONE = "give email or phone, not both, when no external_id is given"
ERR_VALUE = ("invalid {kind}: expected non-empty text, one value or several (repeated as {kind}[] "
             "or comma-separated)")
ERR_TOO_MANY = "too many {kind} values: at most {most} per request, got {count}"
ERR_LIMIT = "invalid limit: expected a whole number from 1 to {most}"
ERR_OFFSET = "invalid offset: expected a whole number, 0 or more"

SHOWN_STATUS = {"subscribed": "Subscribed", "unsubscribed": "Unsubscribed"}
UNKNOWN = "Unknown"




# --- query parameters ------------------------------------------------------------------------------
def identifiers(query: dict[str, Any], kind: str) -> list[str]:
    """The values of one identifier parameter, in order, each once: `kind` or `kind[]`, each
    text (comma-separated values split) or a list of texts (`Workspace.call`)."""
    values: list[str] = []
    for name in (kind, f"{kind}[]"):
        if name not in query:
            continue
        given = query[name]
        for item in given if isinstance(given, list) else [given]:
            if not isinstance(item, str):
                raise Refused(400, ERR_VALUE.format(kind=kind))
            parts = [part.strip() for part in item.split(",")]
            if not all(parts):
                raise Refused(400, ERR_VALUE.format(kind=kind))
            values.extend(parts)
    values = list(dict.fromkeys(values))
    if len(values) > MAX_USERS:
        raise Refused(400, ERR_TOO_MANY.format(kind=kind, most=MAX_USERS, count=len(values)))
    return values


def whole_number(query: dict[str, Any], name: str, default: int, low: int, high: int | None,
                 message: str) -> int:
    """A whole-number parameter (text of digits, or an int from `Workspace.call`), within bounds."""
    value = query.get(name, default)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        raise Refused(400, message)
    return value


def wanted_users(query: dict[str, Any], *, email_or_phone: bool) -> pl.DataFrame:
    """The identifiers a request's query names (`named_users`): only the external IDs when any
    are given; else the emails and the phones (`email_or_phone`: not both)."""
    given = {kind: identifiers(query, kind) for kind in KINDS}
    if given["external_id"]:
        used = ["external_id"]
    elif given["email"] and given["phone"] and email_or_phone:
        raise Refused(400, ERR_EMAIL_AND_PHONE)
    else:
        used = [kind for kind in ("email", "phone") if given[kind]]
    if not used:
        raise Refused(400, ERR_NO_USER)
    return named_users({kind: given[kind] for kind in used})


def named_users(given: dict[str, list[str]]) -> pl.DataFrame:
    """Identifiers by kind as (`order`, `kind`, `given`, `key`: the value looked up, null for an
    email or phone that is not valid), in the order of `KINDS` and then as given."""
    rows = [(kind, value) for kind in KINDS for value in given.get(kind, [])]
    frame = pl.DataFrame(rows, schema={"kind": pl.String, "given": pl.String}, orient="row").with_row_index("order")
    return frame.with_columns(
        key=pl.when(pl.col("kind") == "email").then(normalize_email(pl.col("given")))
        .when(pl.col("kind") == "phone").then(normalize_phone(pl.col("given")))
        .otherwise(pl.col("given")))


# --- resolution ------------------------------------------------------------------------------------
LOOKUP = {"external_id": ("external_ids", "external_id"), "email": ("profiles", "email"),
          "phone": ("profiles", "phone")}


def matches(state: State, wanted: pl.DataFrame) -> pl.DataFrame:
    """`wanted` joined to the current users each identifier names (one row per identifier and
    user; `service_id` null when it names no one), with their `external_id`, `email`, `phone`
    and `created_seq`."""
    index = pl.concat([
        state.rows_where(LOOKUP[kind][0], LOOKUP[kind][1], keys["key"].drop_nulls().to_list())
        .select(pl.lit(kind).alias("kind"), pl.col(LOOKUP[kind][1]).alias("key"), "service_id")
        for (kind,), keys in wanted.group_by("kind")
    ])
    hits = wanted.join(index, on=["kind", "key"], how="left")
    profiles = state.rows_where("profiles", "service_id", hits["service_id"].drop_nulls().unique().to_list()) \
        .select("service_id", "external_id", "email", "phone", "created_seq")
    # a deleted or merged profile is gone from `profiles`: its identifier names no one
    return hits.join(profiles, on="service_id", how="left").with_columns(
        service_id=pl.when(pl.col("created_seq").is_not_null()).then(pl.col("service_id")))


def group_rows(state: State, users: pl.Series) -> pl.DataFrame:
    """The `subscriptions` rows of `users`."""
    return state.rows_where("subscriptions", "service_id", users.drop_nulls().unique().to_list())


# --- handlers --------------------------------------------------------------------------------------
@answering
def status_get(ctx: Context, req: Request) -> Response:
    """`{"status": {identifier: Subscribed | Unsubscribed | Unknown}, "message": "success"}`."""
    group = req.query.get("subscription_group_id")
    if not isinstance(group, str) or not group.strip():
        raise Refused(400, ERR_GROUP)
    hits = matches(ctx.state, wanted_users(req.query, email_or_phone=True))
    states = group_rows(ctx.state, hits["service_id"]).filter(pl.col("group_id") == group).select("service_id", "state")
    per = (
        hits.join(states, on="service_id", how="left")
        .group_by("order", maintain_order=True)
        .agg(pl.col("kind").first(), pl.col("given").first(), pl.col("key").first(),
             unsubscribed=(pl.col("state") == "unsubscribed").any(), subscribed=(pl.col("state") == "subscribed").any())
        .sort("order")
        .select(
            # a phone shows as its E.164 form: `+` in a URL query reads as a space
            shown=pl.when((pl.col("kind") == "phone") & pl.col("key").is_not_null()).then(pl.col("key"))
            .otherwise(pl.col("given")),
            status=pl.when(pl.col("unsubscribed")).then(pl.lit(SHOWN_STATUS["unsubscribed"]))
            .when(pl.col("subscribed")).then(pl.lit(SHOWN_STATUS["subscribed"]))
            .otherwise(pl.lit(UNKNOWN)))
    )
    return Response(200, {"status": dict(per.iter_rows()), "message": "success"})


@answering
def user_status(ctx: Context, req: Request) -> Response:
    """`{"success": true, "users": [{external_id, email, phone, subscription_groups: [...]}],
    "message": "success"}`: each matched user once, the groups of each paged by limit/offset."""
    limit = whole_number(req.query, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT, ERR_LIMIT.format(most=MAX_LIMIT))
    offset = whole_number(req.query, "offset", 0, 0, None, ERR_OFFSET)
    hits = matches(ctx.state, wanted_users(req.query, email_or_phone=False))
    users = (
        hits.filter(pl.col("service_id").is_not_null())
        .sort("order", "created_seq")
        .unique("service_id", keep="first", maintain_order=True)
        .select("service_id", "external_id", "email", "phone")
    )
    groups = (
        group_rows(ctx.state, users["service_id"])
        .sort("service_id", "group_id")
        .filter(pl.int_range(pl.len()).over("service_id").is_between(offset, offset + limit - 1))
    )
    listed: dict[str, list[dict[str, str]]] = {}
    for sid, group, state in groups.select("service_id", "group_id", "state").iter_rows():  # the answer's JSON
        listed.setdefault(sid, []).append({"subscription_group_id": group, "subscription_status": state})
    answer = [{"external_id": ext, "email": email, "phone": phone, "subscription_groups": listed.get(sid, [])}
              for sid, ext, email, phone in users.iter_rows()]
    return Response(200, {"success": True, "users": answer, "message": "success"})


ROUTES: dict[str, dict[str, Handler]] = {
    STATUS_GET: {"GET": status_get},
    USER_STATUS: {"GET": user_status},
}


class Subscriptions:
    """Friendly methods over `Workspace.call` for subscription group states
    (`ws.subscriptions`); a refused request raises RequestError with the endpoint's message."""

    def __init__(self, ws: Client):
        self.ws = ws

    def status(self, group: str, *, external_ids: Sequence[str] = (), emails: Sequence[str] = (),
               phones: Sequence[str] = ()) -> dict[str, str]:
        """`GET /subscription/status/get`: each identifier's state in `group` (`Subscribed`,
        `Unsubscribed`, `Unknown`), in the order given."""
        query = {"subscription_group_id": group, **_users(external_ids, emails, phones)}
        return dict(raise_for_response("GET", STATUS_GET, self.ws.call("GET", STATUS_GET, query=query))["status"])

    def of_users(self, *, external_ids: Sequence[str] = (), emails: Sequence[str] = (), phones: Sequence[str] = (),
                 limit: int = DEFAULT_LIMIT, offset: int = 0) -> list[dict[str, Any]]:
        """`GET /subscription/user/status`: each matched user with its groups' states."""
        query: dict[str, Any] = {**_users(external_ids, emails, phones), "limit": limit, "offset": offset}
        return list(raise_for_response("GET", USER_STATUS, self.ws.call("GET", USER_STATUS, query=query))["users"])


def _users(external_ids: Sequence[str], emails: Sequence[str], phones: Sequence[str]) -> dict[str, list[str]]:
    given = {"external_id": list(external_ids), "email": list(emails), "phone": list(phones)}
    return {kind: values for kind, values in given.items() if values}
