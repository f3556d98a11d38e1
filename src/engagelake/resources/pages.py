"""Preference center pages: the specification's tags as Liquid (python-liquid 2, autoescaping),
the `form_field_name` tag, rendering and template checks. Imported on first use by
`preference_centers.pages()`."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, TextIO

import orjson
from liquid import BoundTemplate, Environment, escape
from liquid.ast import Node
from liquid.context import RenderContext
from liquid.exceptions import LiquidError, LiquidSyntaxError, TemplateNotFoundError
from liquid.stream import TokenStream
from liquid.tag import Tag
from liquid.token import TOKEN_EXPRESSION, TOKEN_TAG, Token

from engagelake.resources.preference_terms import (
    ERR_FORM_TAG,
    ERR_PARTIAL,
    ERR_RENDER,
    ERR_TEMPLATE,
    FIELD_GLOBAL,
    FIELD_GROUP_PREFIX,
    GLOBAL_KEY,
    LINK_KEYS,
    _Refused,
)


# --- templates --------------------------------------------------------------------------------
class FormFieldNode(Node):
    """Writes the form field name of a subscription group or of the global email state."""

    __slots__ = ("field",)

    def __init__(self, token: Token, field: str):
        super().__init__(token)
        self.field = field
        self.blank = False

    def __str__(self) -> str:
        return f"{{% form_field_name {self.field} %}}"

    def render_to_output(self, context: RenderContext, buffer: TextIO) -> int:
        return buffer.write(str(escape(self.field)))


class FormFieldTag(Tag):
    """`{% form_field_name :subscription_group <id> %}` and `{% form_field_name :email_global_state %}`."""

    name = "form_field_name"
    block = False

    def parse(self, stream: TokenStream) -> FormFieldNode:
        token = stream.eat(TOKEN_TAG)
        words = stream.current.value.split() if stream.current.kind == TOKEN_EXPRESSION else []
        if words == [":email_global_state"]:
            return FormFieldNode(token, FIELD_GLOBAL)
        if len(words) == 2 and words[0] == ":subscription_group" and words[1] != GLOBAL_KEY:
            return FormFieldNode(token, FIELD_GROUP_PREFIX + words[1])
        raise LiquidSyntaxError(ERR_FORM_TAG, token=token)


class GroupStates(dict[str, str]):
    """`subscribed_state`: a group the user has no state for reads as unsubscribed."""

    def __missing__(self, key: str) -> str:
        return "unsubscribed"


ENV = Environment(autoescape=True)
ENV.add_tag(FormFieldTag)

# `{{ ... }}` (which may hold `${...}`) or `{% ... %}` (which may hold a nested `{{ ... }}`)
MARKUP_RE = re.compile(r"\{\{(?:[^{}]|\$\{[^{}]*\})*\}\}|\{%.*?%\}", re.DOTALL)
DOLLAR_KEY_RE = re.compile(r"\.\$\{([^{}\"\\\s]+)\}")  # subscribed_state.${<id>} -> ["<id>"]
DOLLAR_NAME_RE = re.compile(r"\$\{(\w+)\}")  # ${email_address} -> email_address
NESTED_OUTPUT_RE = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.DOTALL)


def rewrite_markup(match: re.Match[str]) -> str:
    """One markup span with its `${...}` references in plain Liquid; inside a tag, a nested
    output (`{% if {{subscribed_state.${g}}} == "subscribed" %}`) becomes its expression."""
    text = DOLLAR_NAME_RE.sub(r"\1", DOLLAR_KEY_RE.sub(r'["\1"]', match.group()))
    if text.startswith("{%"):
        text = NESTED_OUTPUT_RE.sub(r"\1", text)
    return text


def to_liquid(source: str) -> str:
    """Page HTML with the specification's `${...}` tag forms rewritten inside markup only
    (page text such as a script's `${x}` is left alone)."""
    return MARKUP_RE.sub(rewrite_markup, source)


@lru_cache(maxsize=256)
def parse_template(source: str) -> BoundTemplate:
    """The parsed template of a page (raises LiquidError)."""
    return ENV.from_string(to_liquid(source))


def declared_fields(source: str) -> list[str]:
    """The form field names a page's `form_field_name` tags write, in page order."""
    template = parse_template(source)
    context = RenderContext(template)
    found: list[str] = []

    def visit(node: Node) -> None:
        if isinstance(node, FormFieldNode) and node.field not in found:
            found.append(node.field)
        for child in node.children(context, include_partials=False):
            visit(child)

    for node in template.nodes:
        visit(node)
    return found


def describe_error(err: LiquidError) -> tuple[str, int]:
    """The short message and the line of a Liquid error."""
    line = 1
    if err.token is not None and err.token.start_index >= 0:
        line = err.token.source.count("\n", 0, err.token.start_index) + 1
    message = str(err.args[0]) if err.args else type(err).__name__
    if isinstance(err, TemplateNotFoundError):
        message = ERR_PARTIAL.format(name=message)
    return message, line


def check_template(field: str, source: str) -> None:
    """Parse a page and render it once for a user without data, so that syntax errors and
    unknown filters are refused when the center is saved rather than when a user opens it."""
    try:
        parse_template(source).render(**user_variables(None, {}, "#"))
    except LiquidError as err:
        message, line = describe_error(err)
        raise _Refused(400, ERR_TEMPLATE.format(field=field, error=message, line=line)) from None


def user_variables(profile: dict[str, Any] | None, groups: dict[str, str], submit_url: str) -> dict[str, Any]:
    """The template variables of one user; autoescaping escapes each of them on output."""
    states = GroupStates(groups)
    email_state = (profile or {}).get("email_subscribe")
    states[GLOBAL_KEY] = email_state if email_state in ("unsubscribed", "opted_in") else "subscribed"
    return {
        "subscribed_state": states,
        "email_address": (profile or {}).get("email") or "",
        "first_name": (profile or {}).get("first_name") or "",
        "last_name": (profile or {}).get("last_name") or "",
        "preference_center_submit_url": submit_url,
    }


def add_head(html: str, center: dict[str, Any]) -> str:
    """The page with its metadata (title, viewport meta, link tags) after the opening `<head>`,
    or before the page when it has no head. A page that has its own `<title>` keeps it."""
    parts = []
    if not re.search(r"<title[\s>]", html, re.IGNORECASE):
        parts.append(f"<title>{escape(center['title'])}</title>")
    options = orjson.loads(center["options"]) if center["options"] else {}
    if "meta-viewport-content" in options:
        parts.append(f'<meta name="viewport" content="{escape(options["meta-viewport-content"])}">')
    for link in options.get("links-tags", []):
        attrs = "".join(f' {key}="{escape(link[key])}"' for key in LINK_KEYS if key in link)
        parts.append(f"<link{attrs}>")
    head = "".join(parts)
    match = re.search(r"<head\b[^>]*>", html, re.IGNORECASE)
    if match is None:
        return head + html
    return html[: match.end()] + head + html[match.end():]


def render_html(center: dict[str, Any], source: str, variables: dict[str, Any]) -> str:
    """One page of a center rendered with a user's variables (422 if the template fails)."""
    try:
        html = parse_template(source).render(**variables)
    except LiquidError as err:
        message, _ = describe_error(err)
        raise _Refused(422, ERR_RENDER.format(center_id=center["center_id"], error=message)) from None
    return add_head(html, center)
