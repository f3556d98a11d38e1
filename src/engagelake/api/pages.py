"""The recipients' pages over HTTP: a preference center's page and its form, opened from the
signed link in a message. These routes are the only ones the server answers as HTML, errors
included: a browser never sees a JSON error or a framework's page.

The rules stay behind `Workspace.apply`: a browser's form (`application/x-www-form-urlencoded`,
a field may repeat and its last value wins) becomes the JSON object the route takes, and the
route's answer (the page, or `{"message": ...}` with its status) becomes an HTML page here.
"""

from __future__ import annotations

from html import escape
from urllib.parse import parse_qsl

import orjson
from fastapi.responses import HTMLResponse

from engagelake.resources.preference_centers import RECIPIENT_BASE
from engagelake.routing import Response, split_path

FORM = "application/x-www-form-urlencoded"
# What a recipient's page may load and do (issue 56): nothing by default (no script runs: the
# link's token is in the page's URL, which a script could send anywhere); styles inline or over
# https, images and fonts from the server, over https or inline (`data:`); its form posts to the
# server only; no `<base>` may move its relative form address; no other site may frame it.
CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'none'",
    "style-src 'self' 'unsafe-inline' https:",
    "img-src 'self' https: data:",
    "font-src 'self' https: data:",
    "form-action 'self'",
    "base-uri 'none'",
    "frame-ancestors 'none'",
))
# on every answer of these routes: the link's token is in the URL (no Referer carries it on),
# a page is one recipient's (no cache keeps it), and what it may load is bounded (above)
HEADERS = {
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
}
# what a person reads for each status: a title, then what to do
ADVICE: dict[int, tuple[str, str]] = {
    400: ("We could not save your choices",
          "The form was not one this page sent. Open the link from your email again and save once more."),
    403: ("This link has expired or is not valid",
          "Links to this page work for a limited time. Open the link in our most recent email, "
          "or contact us for a new one."),
    404: ("This page is not available",
          "The page may have been withdrawn, or the account it was made for no longer exists. "
          "If you still receive our emails, use the link in the most recent one."),
    405: ("This page cannot do that", "Open the link from your email to see your preferences."),
    409: ("This page is not accepting changes right now",
          "Nothing was changed. Please try again later with the link from your email."),
    413: ("Too much was sent", "Nothing was changed. Open the link from your email and save again."),
    422: ("This page cannot be shown", "Nothing was changed. Please contact us: the page has a fault."),
    429: ("Too many attempts", "Nothing was changed. Please wait a minute and try again."),
    503: ("We are busy", "Nothing was changed. Please try again in a moment."),
}
FALLBACK = ("Something went wrong", "Nothing was changed. Please try again later.")


def is_page(path: str) -> bool:
    """Whether `path` is a recipient's page (`/preferences/<center>`), read as the router reads
    it (`split_path`): `//preferences/<center>/` is one too, and answers as a page."""
    return split_path(path)[0].startswith(RECIPIENT_BASE + "/")


def form_body(body: bytes, content_type: str) -> bytes:
    """The body the route takes: a browser's form as a JSON object of each field's last value
    (an unchecked box sends nothing, so a hidden field before it gives its default); any other
    body as it came (JSON from an API caller)."""
    if content_type.split(";", 1)[0].strip().lower() != FORM:
        return body
    fields = dict(parse_qsl(body.decode("utf-8", errors="replace"), keep_blank_values=True))
    return orjson.dumps(fields)


def answer(response: Response, headers: dict[str, str] | None = None) -> HTMLResponse:
    """The route's answer as a page: the rendered page, or an error page with its status;
    `headers` (the rate limit's) added to HEADERS."""
    if response.status == 200 and isinstance(response.body, str):
        return HTMLResponse(response.body, status_code=200, headers={**HEADERS, **(headers or {})})
    message = response.body.get("message") if isinstance(response.body, dict) else None
    return error(response.status, message, headers=headers)


def error(status: int, detail: str | None = None, *, headers: dict[str, str] | None = None) -> HTMLResponse:
    """A small page that says what happened and what to do."""
    title, advice = ADVICE.get(status, FALLBACK)
    detail_html = f'<p class="detail">{escape(detail)}</p>' if detail else ""
    html = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>
body {{ margin: 0; background: #f4f5f7; color: #1f2933; font: 16px/1.5 system-ui, sans-serif; }}
main {{ max-width: 36rem; margin: 0 auto; padding: 2rem 1rem; overflow-wrap: anywhere; }}
h1 {{ font-size: 1.4rem; }} .detail {{ color: #52606d; font-size: .875rem; }}
</style></head>
<body><main><h1>{escape(title)}</h1><p>{escape(advice)}</p>{detail_html}</main></body></html>
"""
    return HTMLResponse(html, status_code=status, headers={**HEADERS, **(headers or {})})
