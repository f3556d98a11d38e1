"""Email lists of the hosted API (issue 53): an address's global subscription state
(`POST /email/status`), the blocklist (`POST /email/blocklist`: unsubscribed and hard-bounced),
taking an address off the hard-bounce or spam list (`POST /email/bounce/remove`,
`/email/spam/remove`), and the lists read back by date (`GET /email/unsubscribes`,
`GET /email/hard_bounces`).

A state set for an address is written to each current holder through `/users/track` objects
(`email_subscribe` by service_id, run in the batch: the same rules, `updated_at`, and the time
the user unsubscribed, `profiles.email_unsubscribed_at`), and kept for the address itself in
`email_addresses` (`tables/emails.py`), which answers for an address nobody holds and holds
the bounce and spam lists. The decisions are in `docs/semantics.md`, "Email lists".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import polars as pl

from engagelake.resources.catalogs import raise_for_response
from engagelake.resources.refusals import Refused, answering
from engagelake.resources.subscription_writes import write
from engagelake.resources.subscriptions import whole_number
from engagelake.routing import Client, Context, Handler, Request, Response
from engagelake.rules import messages as M
from engagelake.rules.profile.validate import normalize_email
from engagelake.rules.state import Changes
from engagelake.tables.schema import conform
from engagelake.tables.types import UTC_TS

STATUS = "/email/status"
BLOCKLIST = "/email/blocklist"
BOUNCE_REMOVE = "/email/bounce/remove"
SPAM_REMOVE = "/email/spam/remove"
UNSUBSCRIBES = "/email/unsubscribes"
HARD_BOUNCES = "/email/hard_bounces"

STATES = ("subscribed", "unsubscribed", "opted_in")
MAX_EMAILS = 50  # addresses of one write, as the hosted API
DEFAULT_LIMIT, MAX_LIMIT = 100, 500  # a list's page, as the hosted API
TABLE = "email_addresses"

ERR_EMAIL = "email is required: an email address, or an array of 1 to {most}"
ERR_EMAIL_VALUE = "invalid email: {value} is not an email address"
ERR_TOO_MANY = "too many email values: at most {most} per request, got {count}"
ERR_STATE = "invalid subscription_state: expected subscribed, unsubscribed or opted_in"
ERR_DATE = "invalid {name}: expected a date as YYYY-MM-DD"
ERR_RANGE = "give start_date and end_date (YYYY-MM-DD), or an email"
ERR_ORDER = "start_date must not be after end_date"
ERR_LIMIT = "invalid limit: expected a whole number from 1 to {most}"
ERR_OFFSET = "invalid offset: expected a whole number, 0 or more"
ERR_SORT = "invalid sort_direction: expected asc or desc"

# the hosted reference's sample shows unsubscribes so; it names hard bounces' times ISO 8601
UNSUBSCRIBED_AT = "%Y-%m-%d %H:%M:%S +0000"
HARD_BOUNCED_AT = "%Y-%m-%dT%H:%M:%S%.3fZ"
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


# --- bodies ----------------------------------------------------------------------------------------
def addresses(body: Any) -> list[str]:
    """The normalized addresses of a write's `email` (one text or an array), each once, in order."""
    if not isinstance(body, dict):
        raise Refused(400, M.BODY_NOT_OBJECT)
    given = body.get("email")
    items: list[Any] = given if isinstance(given, list) else [given]
    if given is None or not items:
        raise Refused(400, ERR_EMAIL.format(most=MAX_EMAILS))
    for item in items:
        if not isinstance(item, str):
            raise Refused(400, ERR_EMAIL_VALUE.format(value=repr(item)))
    emails: list[str] = []
    for item, email in zip(items, _normalized(items), strict=True):
        if email is None:
            raise Refused(400, ERR_EMAIL_VALUE.format(value=repr(item)))
        emails.append(email)
    emails = list(dict.fromkeys(emails))
    if len(emails) > MAX_EMAILS:
        raise Refused(400, ERR_TOO_MANY.format(most=MAX_EMAILS, count=len(emails)))
    return emails


def _normalized(values: list[str]) -> list[str | None]:
    """Each address as track normalizes it (trimmed, lower-cased), None when not valid."""
    frame = pl.DataFrame({"e": values}, schema={"e": pl.String})
    return frame.select(normalize_email(pl.col("e")))["e"].to_list()


# --- the writes ------------------------------------------------------------------------------------
def _rows(ctx: Context, emails: list[str]) -> pl.DataFrame:
    """The `email_addresses` rows of `emails`, one per address (a new one all null)."""
    stored = ctx.state.rows_where(TABLE, "email", emails)
    wanted = pl.DataFrame({"email": emails}, schema={"email": pl.String})
    return conform(TABLE, wanted.join(stored, on="email", how="left"))


def _set_holders(ctx: Context, emails: list[str], state: str) -> None:
    """`email_subscribe` set to `state` for every current holder of the addresses, through track."""
    holders = ctx.state.rows_where("profiles", "email", emails).sort("created_seq")
    write(ctx, [{"service_id": sid, "email_subscribe": state} for sid in holders["service_id"]])


def _keep(ctx: Context, rows: pl.DataFrame) -> None:
    """Write the address rows: those with nothing left to say are deleted."""
    empty = pl.all_horizontal(pl.col("state", "hard_bounced_at", "spam_at").is_null())
    changes = Changes()
    changes.upsert(TABLE, rows.filter(~empty))
    changes.delete(TABLE, rows.filter(empty))
    ctx.write(changes)


def _now(ctx: Context) -> pl.Expr:
    return pl.lit(ctx.clock).cast(UTC_TS)


@answering
def status(ctx: Context, req: Request) -> Response:
    """`{"email": text or [texts], "subscription_state"}` -> 201 `{"message": "success"}`."""
    emails = addresses(req.body)
    state = req.body.get("subscription_state")
    if state not in STATES:
        raise Refused(400, ERR_STATE)
    _set_holders(ctx, emails, state)
    _keep(ctx, _rows(ctx, emails).with_columns(state=pl.lit(state), state_at=_now(ctx)))
    return Response(201, {"message": "success"})


@answering
def blocklist(ctx: Context, req: Request) -> Response:
    """`{"email": ...}` -> 201: each address unsubscribed and hard-bounced (since now, unless it
    bounced before)."""
    emails = addresses(req.body)
    _set_holders(ctx, emails, "unsubscribed")
    _keep(ctx, _rows(ctx, emails).with_columns(
        state=pl.lit("unsubscribed"), state_at=_now(ctx), hard_bounced_at=pl.coalesce("hard_bounced_at", _now(ctx))))
    return Response(201, {"message": "success"})


def _removing(column: str) -> Handler:
    @answering
    def remove(ctx: Context, req: Request) -> Response:
        """`{"email": ...}` -> 201: the addresses off the list; one not on it is no error."""
        _keep(ctx, _rows(ctx, addresses(req.body)).with_columns(pl.lit(None, UTC_TS).alias(column)))
        return Response(201, {"message": "success"})
    return remove


# --- the lists -------------------------------------------------------------------------------------
def _date(query: dict[str, Any], name: str) -> datetime | None:
    value = query.get(name)
    if value is None:
        return None
    try:
        if not isinstance(value, str) or not _DATE.fullmatch(value.strip()):
            raise ValueError(value)
        return datetime.fromisoformat(value.strip()).replace(tzinfo=UTC)
    except ValueError:
        raise Refused(400, ERR_DATE.format(name=name)) from None


def _window(query: dict[str, Any]) -> tuple[str | None, datetime | None, datetime | None]:
    """(email, start, end) of a list's query: one address (the dates then do not count), or the
    days from start_date's midnight (UTC) to end_date's, end_date's excluded."""
    start, end = _date(query, "start_date"), _date(query, "end_date")
    given = query.get("email")
    if given is not None:
        email = _normalized([given])[0] if isinstance(given, str) else None
        if email is None:
            raise Refused(400, ERR_EMAIL_VALUE.format(value=repr(given)))
        return email, None, None
    if start is None or end is None:
        raise Refused(400, ERR_RANGE)
    if start > end:
        raise Refused(400, ERR_ORDER)
    return None, start, end


def _page(query: dict[str, Any], listed: pl.DataFrame, *, newest_first: bool, column: str,
          shown: str) -> Response:
    email, start, end = _window(query)
    limit = whole_number(query, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT, ERR_LIMIT.format(most=MAX_LIMIT))
    offset = whole_number(query, "offset", 0, 0, None, ERR_OFFSET)
    if email is not None:
        listed = listed.filter(pl.col("email") == email)
    else:
        assert start is not None and end is not None
        listed = listed.filter((pl.col("at") >= start) & (pl.col("at") < end))
    page = (listed.sort(["at", "email"], descending=[newest_first, False]).slice(offset, limit)
            .select("email", pl.col("at").dt.strftime(shown).alias(column)))
    return Response(200, {"emails": page.to_dicts(), "message": "success"})


def unsubscribed(ctx: Context) -> pl.DataFrame:
    """(email, at) of every unsubscribed address: one a current user holds is unsubscribed when
    any holder is, since that holder last unsubscribed; one nobody holds, by its own state."""
    users = (ctx.state.rows_where("profiles", "email_subscribe", ["unsubscribed"])
             .filter(pl.col("email").is_not_null())
             .group_by("email").agg(at=pl.coalesce("email_unsubscribed_at", "updated_at").max()))
    own = ctx.state[TABLE].filter(pl.col("state") == "unsubscribed")
    held = ctx.state.rows_where("profiles", "email", own["email"]).select("email").unique()
    alone = own.join(held, on="email", how="anti").select("email", at="state_at")
    return pl.concat([users, alone], how="vertical_relaxed")


@answering
def unsubscribes(ctx: Context, req: Request) -> Response:
    """`{"emails": [{"email", "unsubscribed_at"}], "message": "success"}`, newest first unless
    `sort_direction=asc`."""
    direction = req.query.get("sort_direction", "desc")
    if direction not in ("asc", "desc"):
        raise Refused(400, ERR_SORT)
    return _page(req.query, unsubscribed(ctx), newest_first=direction == "desc", column="unsubscribed_at",
                 shown=UNSUBSCRIBED_AT)


@answering
def hard_bounces(ctx: Context, req: Request) -> Response:
    """`{"emails": [{"email", "hard_bounced_at"}], "message": "success"}`, newest first."""
    bounced = ctx.state[TABLE].filter(pl.col("hard_bounced_at").is_not_null()).select("email", at="hard_bounced_at")
    return _page(req.query, bounced, newest_first=True, column="hard_bounced_at", shown=HARD_BOUNCED_AT)


ROUTES: dict[str, dict[str, Handler]] = {
    STATUS: {"POST": status},
    BLOCKLIST: {"POST": blocklist},
    BOUNCE_REMOVE: {"POST": _removing("hard_bounced_at")},
    SPAM_REMOVE: {"POST": _removing("spam_at")},
    UNSUBSCRIBES: {"GET": unsubscribes},
    HARD_BOUNCES: {"GET": hard_bounces},
}


class EmailLists:
    """`ws.emails`: friendly methods over `Workspace.call` for addresses' states and lists; a
    refused request raises RequestError with the endpoint's message."""

    def __init__(self, ws: Client):
        self.ws = ws

    def _post(self, path: str, body: dict[str, Any]) -> None:
        raise_for_response("POST", path, self.ws.call("POST", path, body=body))

    def set_status(self, emails: Sequence[str], state: str) -> None:
        """`POST /email/status`: `subscribed`, `unsubscribed` or `opted_in` for each address."""
        self._post(STATUS, {"email": list(emails), "subscription_state": state})

    def blocklist(self, emails: Sequence[str]) -> None:
        """`POST /email/blocklist`: unsubscribe the addresses and mark them hard-bounced."""
        self._post(BLOCKLIST, {"email": list(emails)})

    def remove_bounces(self, emails: Sequence[str]) -> None:
        self._post(BOUNCE_REMOVE, {"email": list(emails)})

    def remove_spam(self, emails: Sequence[str]) -> None:
        self._post(SPAM_REMOVE, {"email": list(emails)})

    def _list(self, path: str, start: str | None, end: str | None, email: str | None, **query: Any) -> list[dict[str, str]]:
        """Every page of a list (500 a call), as the hosted reference tells clients to page."""
        base = {k: v for k, v in {"start_date": start, "end_date": end, "email": email, **query}.items() if v is not None}
        listed: list[dict[str, str]] = []
        while True:
            page = raise_for_response("GET", path, self.ws.call(
                "GET", path, query={**base, "limit": MAX_LIMIT, "offset": len(listed)}))["emails"]
            listed += page
            if len(page) < MAX_LIMIT:
                return listed

    def unsubscribes(self, start: str | None = None, end: str | None = None, *, email: str | None = None,
                     sort_direction: str = "desc") -> list[dict[str, str]]:
        """`GET /email/unsubscribes`, every page: `{"email", "unsubscribed_at"}` each."""
        return self._list(UNSUBSCRIBES, start, end, email, sort_direction=sort_direction)

    def hard_bounces(self, start: str | None = None, end: str | None = None, *,
                     email: str | None = None) -> list[dict[str, str]]:
        """`GET /email/hard_bounces`, every page: `{"email", "hard_bounced_at"}` each."""
        return self._list(HARD_BOUNCES, start, end, email)

