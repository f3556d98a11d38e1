"""Email preference centers: create, update, read, render per user, and accept form submits.

Pages are Liquid templates (python-liquid 2, autoescaping on) with the specification's tags.
The `${...}` forms of those tags are rewritten into plain Liquid inside markup only; the user's
values reach the page as template variables, so they are always HTML-escaped.
The submit URL carries a signed, expiring token (HMAC-SHA256 with a key of the store's link
key ring, kept outside the store's data: `link_keys.py`) that names the key, the center, the
user, when it was issued and when it expires, so one user cannot change another's preferences.
A valid submit runs a `/users/track` request, so the track rules (same-email propagation
included) apply to it.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from datetime import datetime, timedelta
from html import escape as html_escape
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlencode, urlsplit

import orjson
import polars as pl

from engagelake.errors import ConfigError, RequestError
from engagelake.link_keys import LinkKeys, Ring

# the pages' messages, re-exported (`X as X`): every message of the API is a name of this module
from engagelake.resources.preference_terms import ERR_FORM_TAG as ERR_FORM_TAG
from engagelake.resources.preference_terms import ERR_PARTIAL as ERR_PARTIAL
from engagelake.resources.preference_terms import ERR_RENDER as ERR_RENDER
from engagelake.resources.preference_terms import ERR_TEMPLATE as ERR_TEMPLATE
from engagelake.resources.preference_terms import (
    FIELD_GLOBAL,
    FIELD_GROUP_PREFIX,
    LINK_KEYS,
)
from engagelake.resources.preference_tokens import ERR_TOKEN as ERR_TOKEN
from engagelake.resources.preference_tokens import ERR_TOKEN_CENTER as ERR_TOKEN_CENTER
from engagelake.resources.preference_tokens import ERR_TOKEN_EXPIRED as ERR_TOKEN_EXPIRED
from engagelake.resources.preference_tokens import ERR_TOKEN_LIFETIME as ERR_TOKEN_LIFETIME
from engagelake.resources.preference_tokens import ERR_TOKEN_REVOKED as ERR_TOKEN_REVOKED
from engagelake.resources.preference_tokens import TOKEN_DOMAIN as TOKEN_DOMAIN
from engagelake.resources.preference_tokens import b64 as b64
from engagelake.resources.preference_tokens import format_time as format_time
from engagelake.resources.preference_tokens import read_token as read_token
from engagelake.resources.preference_tokens import sign_token as sign_token
from engagelake.resources.preference_tokens import unb64 as unb64
from engagelake.resources.refusals import Refused, answering
from engagelake.routing import Client, Context, Handler, Request, Response
from engagelake.rules.state import Changes

BASE = "/preference_center/v1"
# a recipient's page: the link a message carries (`link`), whose token is the only credential
RECIPIENT_BASE = "/preferences"
TOKEN_LIFETIME = timedelta(days=7)
LINK_LIFETIME = timedelta(days=30)  # a link's default life (`link`, `expires_in`)
PUBLIC_URL = "public_url"  # the campaign_settings row of the store's public URL (JSON text)
LIQUID_TAG_RE = re.compile(r"\{\{\s*preference_center\.\$\{([^{}]+)\}\s*\}\}")
STATES = ("active", "draft")
TEXT_FIELDS = ("name", "preference_center_title", "preference_center_page_html", "confirmation_page_html")
BODY_FIELDS = (*TEXT_FIELDS, "state", "options")
OPTION_KEYS = ("meta-viewport-content", "links-tags")
LINK_RELS = ("icon", "shortcut icon", "apple-touch-icon")
LINK_TYPES = ("image/png", "image/svg", "image/gif", "image/x-icon", "image/svg+xml", "mask-icon")
GROUP_STATES = ("subscribed", "unsubscribed")
GLOBAL_STATES = ("subscribed", "unsubscribed", "opted_in")

# --- error texts (400 unless noted) -----------------------------------------------------------
ERR_BODY_NOT_OBJECT = "request body must be a JSON object"
ERR_UNKNOWN_FIELD = "unknown field '{field}': allowed fields are " + ", ".join(BODY_FIELDS)
ERR_MISSING_FIELD = "missing {field}: required when creating a preference center"
ERR_TEXT_FIELD = "invalid {field}: expected a non-empty string"
ERR_STATE = "invalid state: expected active or draft"
ERR_OPTIONS = "invalid options: expected an object with meta-viewport-content and/or links-tags"
ERR_OPTION_KEY = "invalid options: unknown key '{key}'; allowed keys are " + ", ".join(OPTION_KEYS)
ERR_VIEWPORT = "invalid options.meta-viewport-content: expected a string"
ERR_LINKS = "invalid options.links-tags: expected an array of objects"
ERR_LINK = "invalid options.links-tags[{i}]: expected an object"
ERR_LINK_KEY = "invalid options.links-tags[{i}]: unknown key '{key}'; allowed keys are " + ", ".join(LINK_KEYS)
ERR_LINK_REL = "invalid options.links-tags[{i}].rel: required, one of " + ", ".join(LINK_RELS)
ERR_LINK_TYPE = "invalid options.links-tags[{i}].type: expected one of " + ", ".join(LINK_TYPES)
ERR_LINK_TEXT = "invalid options.links-tags[{i}].{key}: expected a string"
ERR_LINK_HREF = "invalid options.links-tags[{i}].href: required, a non-empty string"
ERR_NAME_TAKEN = "name '{name}' is already used by preference center {center_id}; names are unique per workspace"
ERR_NOT_FOUND = "no preference center with id '{center_id}'"  # 404
ERR_USER_QUERY = "give exactly one of the query parameters external_id or service_id"
ERR_USER_NOT_FOUND = "no user with {kind} '{value}'"  # 404
ERR_TOKEN_USER_GONE = "the user this token was issued for was deleted"  # 404
ERR_DRAFT = "preference center {center_id} is a draft: set its state to active to accept submits"  # 409
ERR_FORM_NOT_OBJECT = "form fields must be a JSON object of field name to value"
ERR_FORM_FIELD = "unknown form field '{field}': this page declares {declared}"
ERR_FORM_GROUP_VALUE = "invalid value for form field '{field}': expected subscribed or unsubscribed"
ERR_FORM_GLOBAL_VALUE = "invalid value for form field '{field}': expected subscribed, unsubscribed or opted_in"
ERR_TRACK = "the submit could not be applied: {errors}"  # 400
ERR_NOT_PUBLISHED = "preference center {center_id} is a draft: its page is not published"  # 404
ERR_LINK_USER = ("give exactly one of the query parameters external_id, service_id, or alias_name "
                 "with alias_label")
ERR_LINK_EXPIRES = "invalid expires_in: expected a whole number of seconds, at least 1"
ERR_LINK_TOO_LONG = ("invalid expires_in: {seconds} seconds is longer than this store's longest link life, {most} "
                     "seconds ({days:g} days); `engagelake link-keys max-lifetime` sets it")
ERR_BASE_URL = ("invalid {field}: expected an absolute http or https URL such as https://prefs.example.com "
                "(no query or fragment)")
ERR_NO_BASE_URL = ("no base URL for the link: pass base_url, or record the store's public URL "
                   "(engagelake serve --public-url URL, or ws.preference_centers.set_public_url(URL))")
ERR_CENTER_NAME = "no preference center with id or name '{center}'"


class PreferenceCenterError(RequestError):
    """A preference center request answered with an error: its API status and body."""

    def __init__(self, status: int, body: Any):
        super().__init__(f"{status}: {body}", status, body)




def pages() -> ModuleType:
    """The Liquid page module, imported on first use: python-liquid costs a fresh process
    noticeable start-up time, and only page renders and center saves need it."""
    from engagelake.resources import pages as module

    return module


# --- tokens (signed and read in `preference_tokens.py`) -----------------------------------------
def ring_of(keys: LinkKeys) -> Ring:
    """The current ring, or a 500 saying what to set (a store on object storage without link
    keys) or what is wrong with the key file."""
    try:
        return keys.ring()
    except ConfigError as error:
        raise Refused(500, str(error)) from None


def new_token(ctx: Context, center_id: str, service_id: str, expires: datetime) -> str:
    """A token signed now (the batch's clock) with the ring's signing key (made when it has none)."""
    try:
        key = ctx.link_keys.signing_key(ctx.clock)
    except ConfigError as error:
        raise Refused(500, str(error)) from None
    return sign_token(key, center_id, service_id, ctx.clock, expires)


def submit_url(ctx: Context, center_id: str, service_id: str) -> str:
    lifetime = min(TOKEN_LIFETIME, ring_of(ctx.link_keys).max_lifetime)
    token = new_token(ctx, center_id, service_id, ctx.clock + lifetime)
    return f"{BASE}/{center_id}/submit?" + urlencode({"token": token})


def refuse_link(keys: LinkKeys, center_id: str, token: Any, now: datetime) -> tuple[int, str] | None:
    """The refusal (403, message) of a recipient's link whose token is missing, forged, revoked,
    for another center or expired (500: no link keys to check it with), or None: what the page
    routes and the submit route check first, so that the server can answer a bad link without
    queueing it (only the key ring is needed)."""
    try:
        read_token(ring_of(keys), token, center_id, now)
    except Refused as refused:
        return refused.response.status, refused.response.body["message"]
    return None


def link_key(keys: LinkKeys, center_id: str, token: Any, now: datetime) -> str | None:
    """What a valid link names (center, user, expiry), the same however its token is written
    (base64 padding, say): the key the server counts a link's requests by; None for a link
    `refuse_link` refuses."""
    try:
        service_id, expires = read_token(ring_of(keys), token, center_id, now)
    except Refused:
        return None
    return f"{center_id}|{service_id}|{int(expires.timestamp())}"


def recipient_path(center_id: str, token: str) -> str:
    """The path of a recipient's page: a GET shows it, a form POST to it submits."""
    return f"{RECIPIENT_BASE}/{center_id}?" + urlencode({"token": token})


def recipient_action(center_id: str, token: str) -> str:
    """The page's own address relative to it (`<center_id>?token=...`): its form and links
    work wherever the server is mounted (a proxy may add a path prefix)."""
    return f"{center_id}?" + urlencode({"token": token})


def check_base_url(url: Any, field: str) -> str:
    """An absolute http(s) URL without query or fragment, without its trailing slash."""
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise Refused(400, ERR_BASE_URL.format(field=field))
    return url.rstrip("/")


def public_url(ctx: Context) -> str | None:
    """The store's public URL (`set_public_url`), or None."""
    rows = ctx.state["campaign_settings"].filter(pl.col("setting") == PUBLIC_URL)
    return orjson.loads(rows["value"][0]) if rows.height else None


# --- validation -------------------------------------------------------------------------------
def check_body(body: Any, *, creating: bool) -> dict[str, Any]:
    """The fields of a create or update body, validated (400 naming the first problem)."""
    if not isinstance(body, dict):
        raise Refused(400, ERR_BODY_NOT_OBJECT)
    for field in body:
        if field not in BODY_FIELDS:
            raise Refused(400, ERR_UNKNOWN_FIELD.format(field=field))
    for field in TEXT_FIELDS:
        if field not in body:
            if creating:
                raise Refused(400, ERR_MISSING_FIELD.format(field=field))
            continue
        value = body[field]
        if not isinstance(value, str) or not value.strip():
            raise Refused(400, ERR_TEXT_FIELD.format(field=field))
    if "state" in body and body["state"] not in STATES:
        raise Refused(400, ERR_STATE)
    if "options" in body:
        check_options(body["options"])
    for field in ("preference_center_page_html", "confirmation_page_html"):
        if field in body:
            pages().check_template(field, body[field])
    return body


def check_options(options: Any) -> None:
    if not isinstance(options, dict):
        raise Refused(400, ERR_OPTIONS)
    for key in options:
        if key not in OPTION_KEYS:
            raise Refused(400, ERR_OPTION_KEY.format(key=key))
    if "meta-viewport-content" in options and not isinstance(options["meta-viewport-content"], str):
        raise Refused(400, ERR_VIEWPORT)
    links = options.get("links-tags", [])
    if not isinstance(links, list):
        raise Refused(400, ERR_LINKS)
    for i, link in enumerate(links):
        check_link(i, link)


def check_link(i: int, link: Any) -> None:
    if not isinstance(link, dict):
        raise Refused(400, ERR_LINK.format(i=i))
    for key in link:
        if key not in LINK_KEYS:
            raise Refused(400, ERR_LINK_KEY.format(i=i, key=key))
    if link.get("rel") not in LINK_RELS:
        raise Refused(400, ERR_LINK_REL.format(i=i))
    if "type" in link and link["type"] not in LINK_TYPES:
        raise Refused(400, ERR_LINK_TYPE.format(i=i))
    for key in ("sizes", "color"):
        if key in link and not isinstance(link[key], str):
            raise Refused(400, ERR_LINK_TEXT.format(i=i, key=key))
    href = link.get("href")
    if not isinstance(href, str) or not href.strip():
        raise Refused(400, ERR_LINK_HREF.format(i=i))


def check_form(fields: Any, declared: list[str]) -> tuple[str | None, list[dict[str, str]]]:
    """(new global email state or None, subscription group updates) of a submitted form; only
    the fields the page declares are accepted."""
    if not isinstance(fields, dict):
        raise Refused(400, ERR_FORM_NOT_OBJECT)
    global_state, groups = None, []
    for field, value in fields.items():
        if field not in declared:
            shown = ", ".join(declared) or "no form fields"
            raise Refused(400, ERR_FORM_FIELD.format(field=field, declared=shown))
        if field == FIELD_GLOBAL:
            if value not in GLOBAL_STATES:
                raise Refused(400, ERR_FORM_GLOBAL_VALUE.format(field=field))
            global_state = value
            continue
        if value not in GROUP_STATES:
            raise Refused(400, ERR_FORM_GROUP_VALUE.format(field=field))
        group_id = field.removeprefix(FIELD_GROUP_PREFIX)
        groups.append({"subscription_group_id": group_id, "subscription_state": value})
    return global_state, groups


# --- reading the state ------------------------------------------------------------------------
def find_center(ctx: Context, center_id: str) -> dict[str, Any]:
    centers = ctx.state["preference_centers"]
    rows = centers.filter(pl.col("center_id") == center_id).to_dicts()
    if not rows:
        raise Refused(404, ERR_NOT_FOUND.format(center_id=center_id))
    return rows[0]


def check_name_free(ctx: Context, name: str, center_id: str | None) -> None:
    centers = ctx.state["preference_centers"]
    taken = centers.filter((pl.col("name") == name) & (pl.col("center_id") != (center_id or "")))
    if taken.height:
        raise Refused(400, ERR_NAME_TAKEN.format(name=name, center_id=taken["center_id"][0]))


def new_center_id(ctx: Context, name: str) -> str:
    """A UUID from the seed and the name; a renamed center may leave its name free for a new
    one, so a taken ID is followed by the same hash with a counter."""
    taken = set(ctx.state["preference_centers"]["center_id"].to_list())
    n = 0
    while True:
        suffix = f":{n}" if n else ""
        digest = hashlib.sha256(f"{ctx.seed}:preference_center:{name}{suffix}".encode()).digest()
        center_id = str(uuid.UUID(bytes=digest[:16], version=4))
        if center_id not in taken:
            return center_id
        n += 1


def find_profile(ctx: Context, service_id: str) -> dict[str, Any] | None:
    rows = ctx.state.rows_where("profiles", "service_id", [service_id]).to_dicts()
    return rows[0] if rows else None


def surviving_profile(ctx: Context, service_id: str) -> dict[str, Any] | None:
    """The profile a token's user is now: itself, or the profile it was merged into (redirects
    point straight at the survivor); None when the user was deleted."""
    profile = find_profile(ctx, service_id)
    if profile is None:
        moved = ctx.state.rows_where("redirects", "service_id", [service_id])["into"].drop_nulls()
        profile = find_profile(ctx, moved[0]) if moved.len() else None
    return profile


def user_of_query(ctx: Context, query: dict[str, Any]) -> dict[str, Any]:
    """The profile named by `external_id` (current or deprecated) or `service_id` (404 if none)."""
    given = [k for k in ("external_id", "service_id") if k in query]
    if len(given) != 1 or not isinstance(query[given[0]], str):
        raise Refused(400, ERR_USER_QUERY)
    kind, value = given[0], query[given[0]]
    service_id: str | None = value
    if kind == "external_id":
        ids = ctx.state.rows_where("external_ids", "external_id", [value])
        service_id = ids["service_id"][0] if ids.height else None
    profile = find_profile(ctx, service_id) if service_id else None
    if profile is None:
        raise Refused(404, ERR_USER_NOT_FOUND.format(kind=kind, value=value))
    return profile


def group_states(ctx: Context, service_id: str) -> dict[str, str]:
    rows = ctx.state.rows_where("subscriptions", "service_id", [service_id])
    return dict(rows.select("group_id", "state").rows())


def render_for(ctx: Context, center: dict[str, Any], source: str, profile: dict[str, Any],
               url: str | None = None) -> str:
    """A page of `center` for a user; its form posts to `url` (default: a fresh API submit URL)."""
    service_id = profile["service_id"]
    url = url if url is not None else submit_url(ctx, center["center_id"], service_id)
    p = pages()
    return p.render_html(center, source, p.user_variables(profile, group_states(ctx, service_id), url))


# --- the default page -------------------------------------------------------------------------
def template_folder() -> Path:
    """The default page's files: the project's `data/preference_center/` (a checkout), or the
    copy a built wheel carries inside the package."""
    here = Path(__file__).resolve()
    for folder in (here.parents[3] / "data" / "preference_center", here.parents[1] / "data" / "preference_center"):
        if (folder / "page.html").is_file():
            return folder
    raise FileNotFoundError("the default preference center page (data/preference_center/) is missing")


def default_pages(groups: dict[str, str], heading: str) -> tuple[str, str]:
    """The default page and confirmation page for `groups` (group ID -> label), which share
    `head.html` (the document's start and the common styles). Each group's
    checkbox follows a hidden `unsubscribed` input of the same name: a browser sends nothing
    for an unchecked box, so the form's last value of the field is the state."""
    folder = template_folder()
    head, page, row, confirmation = ((folder / name).read_text(encoding="utf-8") for name in
                                     ("head.html", "page.html", "group.html", "confirmation.html"))
    page, confirmation = (text.replace("<!-- HEAD -->\n", head) for text in (page, confirmation))
    for group_id in groups:
        if not group_id or any(c in group_id for c in "\"'\\{}%<>&") or any(c.isspace() for c in group_id):
            raise PreferenceCenterError(400, {"message": f"invalid group id {group_id!r}: no quotes, "
                                                         "backslashes, braces, %, <, >, & or whitespace"})
    rows = "".join(row.replace("GROUP_ID", group_id).replace("GROUP_LABEL", html_escape(label))
                   for group_id, label in groups.items())
    heading_html = html_escape(heading)
    return (page.replace("<!-- GROUPS -->", rows).replace("PAGE_HEADING", heading_html),
            confirmation.replace("PAGE_HEADING", heading_html))


# --- handlers ---------------------------------------------------------------------------------
def center_row(center: dict[str, Any], body: dict[str, Any], now: datetime) -> pl.DataFrame:
    """The stored row of a center after applying a (validated) body."""
    row = dict(center)
    renames = {"preference_center_title": "title", "preference_center_page_html": "page_html",
               "confirmation_page_html": "confirmation_html"}
    for field, value in body.items():
        if field == "options":
            row["options"] = orjson.dumps(value).decode()
        else:
            row[renames.get(field, field)] = value
    row["updated_at"] = now
    return pl.DataFrame([row])


@answering
def create_center(ctx: Context, req: Request) -> Response:
    body = check_body(req.body, creating=True)
    check_name_free(ctx, body["name"], None)
    center_id = new_center_id(ctx, body["name"])
    start = {"center_id": center_id, "state": "active", "options": None, "created_at": ctx.clock,
             "created_seq": ctx.state["preference_centers"].height}
    changes = Changes()
    changes.upsert("preference_centers", center_row(start, body, ctx.clock))
    ctx.write(changes)
    return Response(200, {
        "preference_center_api_id": center_id,
        "liquid_tag": "{{preference_center.${" + body["name"] + "}}}",
        "created_at": format_time(ctx.clock),
        "message": "success",
    })


@answering
def update_center(ctx: Context, req: Request) -> Response:
    center = find_center(ctx, req.params["preferenceCenterExternalID"])
    body = check_body(req.body, creating=False)
    if "name" in body:
        check_name_free(ctx, body["name"], center["center_id"])
    changes = Changes()
    changes.upsert("preference_centers", center_row(center, body, ctx.clock))
    ctx.write(changes)
    return Response(200, {
        "preference_center_api_id": center["center_id"],
        "created_at": format_time(center["created_at"]),
        "updated_at": format_time(ctx.clock),
        "message": "success",
    })


def public_center(center: dict[str, Any]) -> dict[str, Any]:
    out = {
        "name": center["name"],
        "preference_center_api_id": center["center_id"],
        "created_at": format_time(center["created_at"]),
        "updated_at": format_time(center["updated_at"]),
        "preference_center_title": center["title"],
        "preference_center_page_html": center["page_html"],
        "confirmation_page_html": center["confirmation_html"],
        "state": center["state"],
    }
    if center["options"] is not None:
        out["options"] = orjson.loads(center["options"])
    return out


@answering
def get_center(ctx: Context, req: Request) -> Response:
    return Response(200, public_center(find_center(ctx, req.params["preferenceCenterExternalID"])))


@answering
def list_centers(ctx: Context, req: Request) -> Response:
    centers = ctx.state["preference_centers"].sort("created_seq").to_dicts()
    listed = [{key: public_center(c)[key] for key in
               ("name", "preference_center_api_id", "created_at", "updated_at", "state")} for c in centers]
    return Response(200, {"preference_centers": listed, "message": "success"})


# `GET .../page?preview=true`: the page with a form that posts nowhere, no token in it; the
# server asks for it when the key lacks `preference_center.link` (issue 56: a working form is a link)
PREVIEW = "preview"
PREVIEW_ACTION = "about:blank"


@answering
def render_page(ctx: Context, req: Request) -> Response:
    center = find_center(ctx, req.params["preferenceCenterExternalID"])
    profile = user_of_query(ctx, req.query)
    url = PREVIEW_ACTION if req.query.get(PREVIEW) in ("true", True) else None
    return Response(200, render_for(ctx, center, center["page_html"], profile, url))


@answering
def submit_form(ctx: Context, req: Request) -> Response:
    """The form of a page rendered for staff (`.../page`): its token is checked first (403), as
    the server checks it before it queues the request (`refuse_link`), then the center (404)."""
    token_sid, expires = read_token(ring_of(ctx.link_keys), req.query.get("token"),
                                    req.params["preferenceCenterExternalID"], ctx.clock)
    center = find_center(ctx, req.params["preferenceCenterExternalID"])
    profile = surviving_profile(ctx, token_sid)
    if profile is None:
        raise Refused(404, ERR_TOKEN_USER_GONE)
    service_id = profile["service_id"]
    if center["state"] != "active":
        raise Refused(409, ERR_DRAFT.format(center_id=center["center_id"]))
    global_state, groups = check_form(req.body, pages().declared_fields(center["page_html"]))
    if global_state is not None or groups:
        apply_form(ctx, profile, global_state, groups)
        log_submit(ctx, center["center_id"], service_id, req.body, expires)
        profile = find_profile(ctx, service_id) or profile
    return Response(200, render_for(ctx, center, center["confirmation_html"], profile))


def recipient_of(ctx: Context, req: Request) -> tuple[dict[str, Any], dict[str, Any], str, datetime]:
    """The center, the user's current profile, the token and its expiry of a recipient's page
    request: 403 bad or expired token (checked first, as the server checks it before it
    queues the request: `refuse_link`), 404 unknown center, draft center or deleted user."""
    token = req.query.get("token")
    token_sid, expires = read_token(ring_of(ctx.link_keys), token, req.params["preferenceCenterExternalID"],
                                    ctx.clock)
    assert isinstance(token, str)  # read_token refused anything else
    center = find_center(ctx, req.params["preferenceCenterExternalID"])
    if center["state"] != "active":
        raise Refused(404, ERR_NOT_PUBLISHED.format(center_id=center["center_id"]))
    profile = surviving_profile(ctx, token_sid)
    if profile is None:
        raise Refused(404, ERR_TOKEN_USER_GONE)
    return center, profile, token, expires


@answering
def recipient_page(ctx: Context, req: Request) -> Response:
    center, profile, token, _ = recipient_of(ctx, req)
    return Response(200, render_for(ctx, center, center["page_html"], profile,
                                    recipient_action(center["center_id"], token)))


@answering
def recipient_submit(ctx: Context, req: Request) -> Response:
    """A recipient's form, as the server hands it over (a browser's form, repeated fields
    folded, the last value of each kept) or as a JSON object; the link stays usable."""
    center, profile, token, expires = recipient_of(ctx, req)
    global_state, groups = check_form(req.body if req.body is not None else {},
                                      pages().declared_fields(center["page_html"]))
    if global_state is not None or groups:
        apply_form(ctx, profile, global_state, groups)
        log_submit(ctx, center["center_id"], profile["service_id"], req.body, expires)
        profile = find_profile(ctx, profile["service_id"]) or profile
    return Response(200, render_for(ctx, center, center["confirmation_html"], profile,
                                    recipient_action(center["center_id"], token)))


def link_user(ctx: Context, query: dict[str, Any]) -> dict[str, Any]:
    """The profile a link is made for: by external_id, user alias or service_id (404 if none)."""
    alias = [k for k in ("alias_name", "alias_label") if k in query]
    given = [k for k in ("external_id", "service_id") if k in query] + (["alias"] if alias else [])
    if len(given) != 1 or (alias and len(alias) != 2) or not all(
            isinstance(query[k], str) for k in ("external_id", "service_id", "alias_name", "alias_label") if k in query):
        raise Refused(400, ERR_LINK_USER)
    if given == ["alias"]:
        rows = ctx.state.rows_where("aliases", "alias_name", [query["alias_name"]]).filter(
            pl.col("alias_label") == query["alias_label"])
        profile = find_profile(ctx, rows["service_id"][0]) if rows.height else None
        if profile is None:
            raise Refused(404, ERR_USER_NOT_FOUND.format(
                kind="alias", value=f"{query['alias_label']}:{query['alias_name']}"))
        return profile
    return user_of_query(ctx, {given[0]: query[given[0]]})


@answering
def make_link(ctx: Context, req: Request) -> Response:
    """`GET .../{id}/link?external_id=...[&expires_in=seconds][&base_url=...]`: the absolute
    URL of a user's page, signed; base: `base_url`, else the store's public URL."""
    center = find_center(ctx, req.params["preferenceCenterExternalID"])
    profile = link_user(ctx, req.query)
    longest = ring_of(ctx.link_keys).max_lifetime
    lifetime = req.query.get("expires_in", int(min(LINK_LIFETIME, longest).total_seconds()))
    if isinstance(lifetime, str) and lifetime.isdigit():
        lifetime = int(lifetime)
    if not isinstance(lifetime, int) or isinstance(lifetime, bool) or lifetime < 1:
        raise Refused(400, ERR_LINK_EXPIRES)
    if lifetime > longest.total_seconds():
        raise Refused(400, ERR_LINK_TOO_LONG.format(seconds=lifetime, most=int(longest.total_seconds()),
                                                     days=longest / timedelta(days=1)))
    if "base_url" in req.query:
        base = check_base_url(req.query["base_url"], "base_url")
    elif (stored := public_url(ctx)) is not None:
        base = stored
    else:
        raise Refused(400, ERR_NO_BASE_URL)
    expires = ctx.clock + timedelta(seconds=lifetime)
    token = new_token(ctx, center["center_id"], profile["service_id"], expires)
    return Response(200, {"url": base + recipient_path(center["center_id"], token),
                          "expires_at": format_time(expires), "message": "success"})


@answering
def set_public_url(ctx: Context, req: Request) -> Response:
    """`PUT .../public_url` `{"public_url": URL}`: the base of the links (`make_link`)."""
    body = req.body
    if not isinstance(body, dict) or set(body) != {PUBLIC_URL}:
        raise Refused(400, ERR_BASE_URL.format(field=PUBLIC_URL))
    url = check_base_url(body[PUBLIC_URL], PUBLIC_URL)
    changes = Changes()
    changes.upsert("campaign_settings", pl.DataFrame({
        "setting": [PUBLIC_URL], "value": [orjson.dumps(url).decode()], "updated_at": [ctx.clock]}))
    ctx.write(changes)
    return Response(200, {PUBLIC_URL: url, "message": "success"})


def apply_form(ctx: Context, profile: dict[str, Any], global_state: str | None,
               groups: list[dict[str, str]]) -> None:
    """The new states through `/users/track`: by external_id when the user has one, so the
    same-email propagation of the track rules applies; by service_id otherwise."""
    who = ({"external_id": profile["external_id"]} if profile["external_id"]
           else {"service_id": profile["service_id"]})
    update: dict[str, Any] = dict(who)
    if global_state is not None:
        update["email_subscribe"] = global_state
    if groups:
        update["subscription_groups"] = groups
    answer = ctx.track({"attributes": [update]})
    if answer.status != 201 or answer.body.get("errors"):
        raise Refused(400, ERR_TRACK.format(errors=answer.body.get("errors") or answer.body))


def log_submit(ctx: Context, center_id: str, service_id: str, fields: dict[str, Any],
               expires: datetime) -> None:
    changes = Changes()
    changes.upsert("preference_center_submits", pl.DataFrame([{
        "center_id": center_id, "service_id": service_id, "fields": orjson.dumps(fields).decode(),
        "token_expires_at": expires, "at": ctx.clock,
    }]))
    ctx.write(changes)


# `list` before `{preferenceCenterExternalID}`: the dispatch takes the first matching pattern
ROUTES: dict[str, dict[str, Handler]] = {
    BASE: {"POST": create_center},
    f"{BASE}/list": {"GET": list_centers},
    f"{BASE}/public_url": {"PUT": set_public_url},
    f"{BASE}/{{preferenceCenterExternalID}}": {"GET": get_center, "PUT": update_center},
    f"{BASE}/{{preferenceCenterExternalID}}/page": {"GET": render_page},
    f"{BASE}/{{preferenceCenterExternalID}}/submit": {"POST": submit_form},
    f"{BASE}/{{preferenceCenterExternalID}}/link": {"GET": make_link},
    f"{RECIPIENT_BASE}/{{preferenceCenterExternalID}}": {"GET": recipient_page, "POST": recipient_submit},
}


class PreferenceCenters:
    """Friendly methods over `Workspace.call` (`ws.preference_centers`): each returns the
    response body on success and raises `PreferenceCenterError` (status, body) otherwise."""

    def __init__(self, ws: Client):
        self.ws = ws

    def _call(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Any:
        response = self.ws.call(method, path, body, query)
        if response.status != 200:
            raise PreferenceCenterError(response.status, response.body)
        return response.body

    def create(self, name: str, title: str, page_html: str, confirmation_html: str, *,
               state: str = "active", options: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": name, "preference_center_title": title, "preference_center_page_html": page_html,
            "confirmation_page_html": confirmation_html, "state": state,
        }
        if options is not None:
            body["options"] = options
        result: dict[str, Any] = self._call("POST", BASE, body)
        return result

    def update(self, center_id: str, **fields: Any) -> dict[str, Any]:
        """PUT with the given body fields (`name=`, `preference_center_title=`, `state=`, ...)."""
        result: dict[str, Any] = self._call("PUT", f"{BASE}/{center_id}", fields)
        return result

    def get(self, center_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"{BASE}/{center_id}")
        return result

    def list_all(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", f"{BASE}/list")["preference_centers"]
        return result

    def render(self, center_id: str, user: str) -> str:
        """The page of a center for a user given by external_id (tried first) or service_id."""
        known = self.ws.table("external_ids").collect().filter(pl.col("external_id") == user).height
        query = {"external_id": user} if known else {"service_id": user}
        page: str = self._call("GET", f"{BASE}/{center_id}/page", query=query)
        return page

    def submit(self, url: str, fields: dict[str, str]) -> str:
        """POST a form to a rendered page's submit URL; the confirmation page."""
        page: str = self._call("POST", url, fields)
        return page

    def center_id(self, center: str) -> str:
        """The ID of a center given by ID or by name."""
        for listed in self.list_all():
            if center in (listed["preference_center_api_id"], listed["name"]):
                return str(listed["preference_center_api_id"])
        raise PreferenceCenterError(404, {"message": ERR_CENTER_NAME.format(center=center)})

    def link(self, center: str, user: str | dict[str, str], *, expires_in: timedelta | None = None,
             base_url: str | None = None) -> str:
        """The absolute URL of `user`'s page of `center` (an ID or a name): a signed link, the
        recipient's only credential, usable until `expires_in` from now (default 30 days, or the
        store's longest link life when shorter; longer than that is refused). `user` is an
        external ID or a user alias (`{"alias_name", "alias_label"}`). The base is `base_url`,
        else the store's public URL (`set_public_url`, `engagelake serve --public-url`)."""
        query: dict[str, Any] = dict(user) if isinstance(user, dict) else {"external_id": user}
        if expires_in is not None:
            query["expires_in"] = int(expires_in.total_seconds())
        if base_url is not None:
            query["base_url"] = base_url
        result = self._call("GET", f"{BASE}/{self.center_id(center)}/link", query=query)
        return str(result["url"])

    def set_public_url(self, url: str) -> str:
        """Record the store's public URL, the base of links made without `base_url`."""
        return str(self._call("PUT", f"{BASE}/public_url", {PUBLIC_URL: url})[PUBLIC_URL])

    def render_tags(self, text: str, user: str | dict[str, str], *, expires_in: timedelta | None = None,
                    base_url: str | None = None) -> str:
        """`text` (a message) with each center's `liquid_tag`, `{{preference_center.${name}}}`,
        replaced by `user`'s link to that center (`link`); an unknown center raises
        `PreferenceCenterError` (404)."""
        return LIQUID_TAG_RE.sub(lambda m: self.link(m.group(1), user, expires_in=expires_in, base_url=base_url), text)

    def create_default(self, name: str, groups: dict[str, str], *, title: str = "Email preferences",
                       heading: str | None = None, state: str = "active",
                       options: dict[str, Any] | None = None) -> dict[str, Any]:
        """Create a center from the default page (`data/preference_center/`): one checkbox per
        subscription group (`groups`: group ID -> label, in page order) and a global
        unsubscribe; responsive, no JavaScript."""
        page, confirmation = default_pages(groups, heading or title)
        return self.create(name, title, page, confirmation, state=state,
                           options={"meta-viewport-content": "width=device-width, initial-scale=1", **(options or {})})
