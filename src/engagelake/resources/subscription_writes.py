"""Subscription group writes of the hosted API (issue 53): `POST /subscription/status/set`
(one group and state for up to 50 external IDs, and 50 emails or 50 phones) and
`POST /v2/subscription/status/set` (several such entries in one call).

Both are translated into `/users/track` attribute objects run in the batch (`ctx.track`), so a
state is written by the very rules of track's `subscription_groups`: the same `updated_at`,
update counter and same-email propagation, and a batch of these requests equals calling them
one by one. Users are resolved as the reads resolve them (`subscriptions.matches`); this
endpoint creates no one (the hosted API sends new users to `/users/track`). The decisions are in
`docs/semantics.md`, "Subscription groups".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from engagelake.resources.catalogs import raise_for_response
from engagelake.resources.refusals import Refused, answering
from engagelake.resources.subscriptions import MAX_USERS, Subscriptions, matches, named_users
from engagelake.routing import Context, Handler, Request, Response
from engagelake.rules import messages as M
from engagelake.rules.counts import TRACK_MOST

STATUS_SET = "/subscription/status/set"
STATUS_SET_V2 = "/v2/subscription/status/set"

STATES = ("subscribed", "unsubscribed")
MAX_ENTRIES = 50  # entries of one v2 request: the hosted reference gives no bound; 50 as its users

ERR_GROUP = "{where}subscription_group_id is required: the ID of one subscription group, as text"
ERR_STATE = "{where}invalid subscription_state: expected subscribed or unsubscribed"
ERR_VALUES = "{where}invalid {field}: expected non-empty text or an array of non-empty texts"
ERR_TOO_MANY = "{where}too many {field} values: at most {most} per request, got {count}"
ERR_NO_USER = "{where}give at least one user: {fields}"
ERR_DOUBLE_OPT_IN = "{where}invalid use_double_opt_in_logic: expected true or false"
# the hosted API's own words for this one
ERR_EMAIL_AND_PHONE = "Either an email address or a phone number should be provided, but not both."
ERR_ENTRIES = "subscription_groups is required: an array of 1 to {most} objects"
ERR_ENTRY = "subscription_groups[{index}] must be an object"
ERR_TRACK = "the states could not be written: {errors}"

V1_FIELDS = {"external_id": "external_id", "email": "email", "phone": "phone"}  # kind -> body field
V2_FIELDS = {"external_id": "external_ids", "email": "emails", "phone": "phones"}


# --- bodies ----------------------------------------------------------------------------------------
def _values(entry: dict[str, Any], field: str, where: str) -> list[str]:
    """A field's identifiers, in order, each once: one text or an array of texts, as sent (no
    comma splitting and no trimming: an external ID may hold either; emails and phones are
    normalized when looked up)."""
    given = entry.get(field)
    if given is None:
        return []
    items = given if isinstance(given, list) else [given]
    if not all(isinstance(item, str) and item.strip() for item in items):
        raise Refused(400, ERR_VALUES.format(where=where, field=field))
    values = list(dict.fromkeys(items))
    if len(values) > MAX_USERS:
        raise Refused(400, ERR_TOO_MANY.format(where=where, field=field, most=MAX_USERS, count=len(values)))
    return values


def checked_entry(entry: dict[str, Any], fields: dict[str, str], where: str) -> tuple[str, str, dict[str, list[str]]]:
    """(group, state, {kind: identifiers}) of one entry, or a Refused naming what to fix."""
    group = entry.get("subscription_group_id")
    if not isinstance(group, str) or not group.strip():
        raise Refused(400, ERR_GROUP.format(where=where))
    state = entry.get("subscription_state")
    if state not in STATES:
        raise Refused(400, ERR_STATE.format(where=where))
    # accepted and without effect: this store sends no SMS, so there is no opt-in workflow to enter
    if entry.get("use_double_opt_in_logic") is not None and not isinstance(entry["use_double_opt_in_logic"], bool):
        raise Refused(400, ERR_DOUBLE_OPT_IN.format(where=where))
    users = {kind: _values(entry, field, where) for kind, field in fields.items()}
    if users["email"] and users["phone"]:
        raise Refused(400, ERR_EMAIL_AND_PHONE)
    if not any(users.values()):
        raise Refused(400, ERR_NO_USER.format(where=where, fields=", ".join(fields.values())))
    return group, state, users


def _body(req: Request) -> dict[str, Any]:
    if not isinstance(req.body, dict):
        raise Refused(400, M.BODY_NOT_OBJECT)
    return req.body


# --- the writes ------------------------------------------------------------------------------------
def track_objects(ctx: Context, group: str, state: str, users: dict[str, list[str]]) -> list[dict[str, Any]]:
    """One attribute object per current user the identifiers name, each once, in the order
    named: by its external ID when an external ID named it (so that the track rules propagate
    the state to its email's other holders, as they do for track), by service_id when an email
    or phone did (every holder of the address is named: nothing to propagate)."""
    hits = matches(ctx.state, named_users(users))
    found = (hits.filter(pl.col("service_id").is_not_null())
             .sort("order", "created_seq")
             .unique("service_id", keep="first", maintain_order=True))
    groups = [{"subscription_group_id": group, "subscription_state": state}]
    return [{"external_id": ext, "subscription_groups": groups} if kind == "external_id" and ext is not None
            else {"service_id": sid, "subscription_groups": groups}
            for kind, sid, ext in found.select("kind", "service_id", "external_id").iter_rows()]


def write(ctx: Context, objects: list[dict[str, Any]]) -> None:
    """The objects through `/users/track`, in order, in requests of at most 75."""
    for start in range(0, len(objects), TRACK_MOST):
        answer = ctx.track({"attributes": objects[start:start + TRACK_MOST]})
        if answer.status != 201 or answer.body.get("errors"):  # built valid: should never be
            raise Refused(500, ERR_TRACK.format(errors=answer.body.get("errors") or answer.body))


@answering
def status_set(ctx: Context, req: Request) -> Response:
    """`{"subscription_group_id", "subscription_state", "external_id", "email" | "phone"}` ->
    201 `{"message": "success"}`."""
    group, state, users = checked_entry(_body(req), V1_FIELDS, "")
    write(ctx, track_objects(ctx, group, state, users))
    return Response(201, {"message": "success"})


@answering
def status_set_v2(ctx: Context, req: Request) -> Response:
    """`{"subscription_groups": [{"subscription_group_id", "subscription_state", "external_ids",
    "emails" | "phones"}, ...]}` -> 201 `{"message": "success"}`: every entry checked before any
    is written, then written in order (a later entry for the same user and group wins)."""
    entries = _body(req).get("subscription_groups")
    if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_ENTRIES:
        raise Refused(400, ERR_ENTRIES.format(most=MAX_ENTRIES))
    checked = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise Refused(400, ERR_ENTRY.format(index=i))
        checked.append(checked_entry(entry, V2_FIELDS, f"subscription_groups[{i}]: "))
    # resolved entry by entry: a state written does not change whom an identifier names
    write(ctx, [obj for group, state, users in checked for obj in track_objects(ctx, group, state, users)])
    return Response(201, {"message": "success"})


ROUTES: dict[str, dict[str, Handler]] = {
    STATUS_SET: {"POST": status_set},
    STATUS_SET_V2: {"POST": status_set_v2},
}


class SubscriptionGroups(Subscriptions):
    """`ws.subscriptions`: the reads (`Subscriptions`) and the writes of group states."""

    def set(self, group: str, state: str, *, external_ids: Sequence[str] = (), emails: Sequence[str] = (),
            phones: Sequence[str] = ()) -> None:
        """Set `group` to `state` (`subscribed` or `unsubscribed`) for every current user the
        identifiers name; unknown identifiers change nothing. Raises RequestError when refused."""
        body: dict[str, Any] = {"subscription_group_id": group, "subscription_state": state}
        for field, values in (("external_id", external_ids), ("email", emails), ("phone", phones)):
            if values:
                body[field] = list(values)
        raise_for_response("POST", STATUS_SET, self.ws.call("POST", STATUS_SET, body=body))

    def set_many(self, entries: Sequence[dict[str, Any]]) -> None:
        """Several groups at once, as `POST /v2/subscription/status/set`'s `subscription_groups`."""
        body = {"subscription_groups": [dict(entry) for entry in entries]}
        raise_for_response("POST", STATUS_SET_V2, self.ws.call("POST", STATUS_SET_V2, body=body))
