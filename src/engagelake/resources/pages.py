"""Preference center pages: the specification's tags as Liquid (python-liquid 2, autoescaping),
the `form_field_name` tag, rendering and template checks. Imported on first use by
`preference_centers.pages()`."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sized
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, TextIO

import orjson
from liquid import BoundTemplate, Environment, escape
from liquid.ast import Node
from liquid.builtin.expressions.primitive import RangeLiteral
from liquid.builtin.tags.for_tag import ForLoop, ForNode, ForTag
from liquid.builtin.tags.tablerow_tag import TableRow, TablerowNode, TablerowTag
from liquid.context import RenderContext
from liquid.exceptions import (
    LiquidError,
    LiquidSyntaxError,
    LocalNamespaceLimitError,
    LoopIterationLimitError,
    OutputStreamLimitError,
    ResourceLimitError,
    TemplateNotFoundError,
)
from liquid.expression import Expression
from liquid.stream import TokenStream
from liquid.tag import Tag
from liquid.token import TOKEN_EOF, TOKEN_EXPRESSION, TOKEN_TAG, Token
from liquid.undefined import UNDEFINED

from engagelake.resources.preference_terms import (
    ERR_FORM_TAG,
    ERR_PARTIAL,
    ERR_RENDER,
    ERR_TEMPLATE,
    ERR_TEMPLATE_SIZE,
    FIELD_GLOBAL,
    FIELD_GROUP_PREFIX,
    GLOBAL_KEY,
    LINK_KEYS,
)
from engagelake.resources.refusals import Refused


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


# --- limits (docs/preference_centers.md, "Limits"; docs/decisions.md, issue 56) --------------
# A page is rendered in the writer thread, at save (once, for a user without data) and at every
# view and submit of a recipient's page: what a template may cost is bounded, and a render that
# reaches a bound fails with a message that names it (400 at save, 422 at view), never a 500.
MAX_TEMPLATE_CHARS = 128 * 1024  # of each page's HTML (the default page with 5 groups: about 4,000)
LOOP_ITERATION_LIMIT = 10_000  # Liquid's own: the iterations of one loop, nested loops multiplied
OUTPUT_LIMIT_BYTES = 2 * 1024 * 1024  # Liquid's own: what a render writes, captures included (UTF-8)
NAMESPACE_LIMIT_BYTES = 4 * 1024 * 1024  # Liquid's own: the assigned variables (`sys.getsizeof`)
BLOCK_NESTING_LIMIT = 30  # Liquid's own (its default): blocks inside blocks
MAX_RANGE = LOOP_ITERATION_LIMIT  # the numbers a range `(a..b)` may hold
MAX_VALUE_CHARS = OUTPUT_LIMIT_BYTES  # the text a filter may make
MAX_NUMBER_DIGITS = 300  # of a whole number a filter makes (`times` again and again)
# The work of one render, in steps (a few microseconds each): each loop iteration costs the
# weight of the loop (a step per node of its tree, and per 32 characters of their expressions);
# reading a variable, or a filter's argument or result, a step per item of a list, a range or a
# map and per 1,000 characters of text (`uniq`, which compares every item with those before it,
# the square of its items over 100); and a filter a step. The nodes of a page outside loops are
# bounded by its size.
RENDER_STEPS = 100_000
EXPRESSION_CHARS_PER_STEP = 32
TEXT_CHARS_PER_STEP = 1_000
NUMBER_BOUND = 10**MAX_NUMBER_DIGITS

TEMPLATE_FAULTS = (ArithmeticError, LookupError, TypeError, ValueError, RecursionError)
ERR_FAULT = "the template failed ({kind}: {detail})"
ERR_RANGE = f"range limit reached: a range may hold at most {MAX_RANGE:,} numbers"
ERR_VALUE = f"value limit reached: a filter may make at most {MAX_VALUE_CHARS:,} characters"
ERR_NUMBER = f"number limit reached: a filter may make whole numbers of at most {MAX_NUMBER_DIGITS} digits"
ERR_STEPS = (f"work limit reached: the page took over {RENDER_STEPS:,} steps to render (loop iterations "
             f"times the size of their bodies, and the items of the lists its variables and filters read)")
ERR_TOO_LARGE = f"the page is over {MAX_TEMPLATE_CHARS:,} characters"
ERR_UNCLOSED = "'{opener}' is never closed: no '{closer}' follows it"
ERR_NAMESPACE = (f"variable limit reached: a page's assigned variables may hold at most "
                 f"{NAMESPACE_LIMIT_BYTES:,} bytes")
# Liquid's own limit errors, with the bound they reached
LIMIT_MESSAGES: dict[type[LiquidError], str] = {
    LoopIterationLimitError: f"loop iteration limit reached: a page's loops may run {LOOP_ITERATION_LIMIT:,} "
                             f"iterations (nested loops multiply)",
    OutputStreamLimitError: f"output limit reached: a page may render at most {OUTPUT_LIMIT_BYTES:,} bytes",
    LocalNamespaceLimitError: ERR_NAMESPACE,
}


class PageLimitError(ResourceLimitError):
    """A page reached one of the bounds above (a Liquid error, so it answers as one)."""


class PageFault(LiquidError):
    """A render that failed outside Liquid's own errors (`render_source`)."""


class BoundedRange(RangeLiteral):
    """A range literal that refuses to hold more than MAX_RANGE numbers: a loop's `offset`
    and `reversed`, and filters such as `join`, go through every number of a range before any
    of Liquid's limits counts them. Put in place of each parsed `RangeLiteral` (`bound_ranges`)."""

    __slots__ = ()

    def _make_range(self, start: Any, stop: Any) -> range:
        numbers = super()._make_range(start, stop)
        if numbers.stop - numbers.start > MAX_RANGE:
            raise PageLimitError(ERR_RANGE, token=self.token)
        return numbers


def node_weight(node: Node, context: RenderContext) -> int:
    """What one rendering of `node` costs in steps: a step per node of its tree and per 32
    characters of their expressions."""
    weight = 1 + sum(len(str(expression)) for expression in node.expressions()) // EXPRESSION_CHARS_PER_STEP
    return weight + sum(node_weight(child, context) for child in node.children(context, include_partials=False))


class WeighedLoop:
    """A loop node (`for`, `tablerow`) that gives the render context its weight, which each
    of its iterations costs (`PageContext.loop`). Computed at its first render, then kept."""

    _weight: int | None = None

    def render_to_output(self, context: RenderContext, buffer: TextIO) -> int:
        if not isinstance(context, PageContext):
            return super().render_to_output(context, buffer)  # type: ignore[misc]
        if self._weight is None:
            self._weight = node_weight(self, context)  # type: ignore[arg-type]
        context.weights.append(self._weight)
        try:
            return super().render_to_output(context, buffer)  # type: ignore[misc]
        finally:
            context.weights.pop()


class PageForNode(WeighedLoop, ForNode):
    pass


class PageTablerowNode(WeighedLoop, TablerowNode):
    pass


class PageForTag(ForTag):
    node_class = PageForNode


class PageTablerowTag(TablerowTag):
    node_class = PageTablerowNode


def items(value: object) -> int:
    """The steps reading `value` costs: its items, or its characters over 1,000."""
    if isinstance(value, str):
        return len(value) // TEXT_CHARS_PER_STEP
    if isinstance(value, Sized) and not isinstance(value, bytes | bytearray):
        return len(value)
    return 0


def made_over_limit(name: str, left: object, args: tuple[object, ...]) -> bool:
    """Whether a filter that multiplies text would make more than MAX_VALUE_CHARS, known before
    it runs: `replace` of many matches by a long text, `join` of many items by a long separator."""
    if name == "replace" and isinstance(left, str) and args:
        old, new = str(args[0]), str(args[1]) if len(args) > 1 else ""
        matches = left.count(old) if old else len(left) + 1
        return len(left) + matches * len(new) > MAX_VALUE_CHARS
    if name == "join" and isinstance(left, Sized) and args:
        return len(left) * len(str(args[0])) > MAX_VALUE_CHARS
    return False


class PageContext(RenderContext):
    """A render context that counts a render's steps (RENDER_STEPS), bounds what filters make
    (MAX_VALUE_CHARS, MAX_NUMBER_DIGITS), and keeps the size of the assigned variables as they
    change (Liquid's own count sums every variable at each `assign`: a page of 6,000 assigns
    took it 18 million sizes)."""

    __slots__ = ("steps", "weights", "local_sizes", "local_bytes")

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.steps = 0
        self.weights: list[int] = []
        self.local_sizes: dict[str, int] = {}
        self.local_bytes = 0

    def spend(self, steps: int) -> None:
        self.steps += steps
        if self.steps > RENDER_STEPS:
            raise PageLimitError(ERR_STEPS, token=None)

    def assign(self, key: str, val: Any) -> None:
        self.locals[key] = val
        size = sys.getsizeof(val, 1)
        self.local_bytes += size - self.local_sizes.get(key, 0)
        self.local_sizes[key] = size
        if self.local_bytes > NAMESPACE_LIMIT_BYTES:
            raise LocalNamespaceLimitError(ERR_NAMESPACE, token=None)

    def get_size_of_locals(self) -> int:
        return self.local_bytes + self.local_namespace_size_carry

    def get(self, path: list[object], *, token: Token | None, default: object = UNDEFINED) -> object:
        value = super().get(path, token=token, default=default)
        self.spend(items(value))
        return value

    @contextmanager
    def loop(self, namespace: Mapping[str, object], forloop: ForLoop | TableRow) -> Iterator[RenderContext]:
        with super().loop(namespace, forloop) as context:  # Liquid's own limit first
            self.spend(forloop.length * (self.weights[-1] if self.weights else 1))
            yield context

    def filter(self, name: str, token: Token | None) -> Callable[..., object]:  # noqa: A003
        run = super().filter(name, token)

        def bounded(left: object, *args: object, **kwargs: object) -> object:
            self.spend(1 + items(left) + sum(items(arg) for arg in (*args, *kwargs.values())))
            if name == "uniq" and isinstance(left, Sized):
                self.spend(len(left) ** 2 // 100)
            if made_over_limit(name, left, args):
                raise PageLimitError(ERR_VALUE, token=token)
            made = run(left, *args, **kwargs)
            if isinstance(made, str) and len(made) > MAX_VALUE_CHARS:
                raise PageLimitError(ERR_VALUE, token=token)
            if isinstance(made, int) and abs(made) >= NUMBER_BOUND:
                raise PageLimitError(ERR_NUMBER, token=token)
            self.spend(items(made))
            return made

        return bounded


class PageTemplate(BoundTemplate):
    context_class = PageContext


class PageEnvironment(Environment):
    loop_iteration_limit = LOOP_ITERATION_LIMIT
    output_stream_limit = OUTPUT_LIMIT_BYTES
    local_namespace_limit = NAMESPACE_LIMIT_BYTES
    block_nesting_limit = BLOCK_NESTING_LIMIT
    template_class = PageTemplate


ENV = PageEnvironment(autoescape=True)
for _tag in (FormFieldTag, PageForTag, PageTablerowTag):
    ENV.add_tag(_tag)


# --- the specification's `${...}` forms, rewritten by scans that read each character a bounded
# number of times (a regex with lazy or nested repetition went back over the rest of the page
# from every `{%`: 40,000 characters of `{%` took 7 s)
DOLLAR_KEY_RE = re.compile(r"\.\$\{([^{}\"\\\s]+)\}")  # subscribed_state.${<id>} -> ["<id>"]
DOLLAR_NAME_RE = re.compile(r"\$\{(\w+)\}")  # ${email_address} -> email_address
BRACE_RE = re.compile(r"[{}]")


def output_end(source: str, start: int) -> int:
    """The end of the output markup `{{ ... }}` at `start` (its text may hold `${...}` and no
    other brace), or -1. Reads up to the first brace that ends or breaks it."""
    at = start + 2
    while (brace := BRACE_RE.search(source, at)) is not None:
        i = brace.start()
        if source[i] == "}":
            return i + 2 if source.startswith("}}", i) else -1
        if i - 1 < at or source[i - 1] != "$":  # a `{` only as the start of `${...}`
            return -1
        close = BRACE_RE.search(source, i + 1)
        if close is None or source[close.start()] != "}":
            return -1
        at = close.start() + 1
    return -1


def markup_spans(source: str) -> Iterator[tuple[int, int]]:
    """The (start, end) of each markup span of a page, left to right: `{{ ... }}` (which may
    hold `${...}`) or `{% ... %}` up to the first `%}` (which may hold a nested `{{ ... }}`)."""
    at, tags_closed = 0, True  # False once a `{%` found no `%}` after it: no later one will
    while (i := source.find("{", at)) >= 0:
        after = source[i + 1: i + 2]
        if after == "{" and (end := output_end(source, i)) >= 0:
            yield i, end
            at = end
            continue
        if after == "%" and tags_closed:
            close = source.find("%}", i + 2)
            if close >= 0:
                yield i, close + 2
                at = close + 2
                continue
            tags_closed = False
        at = i + 1


def unnest_outputs(tag: str) -> str:
    """A tag's nested outputs as their expressions: `{% if {{ x -}} == 1 %}` -> `{% if x == 1 %}`
    (each `{{` up to the first `}}` after it, its `-` and spaces trimmed)."""
    parts, at = [], 0
    while (i := tag.find("{{", at)) >= 0 and (close := tag.find("}}", i + 2)) >= 0:
        inner = tag[i + 2: close].removeprefix("-").lstrip()
        parts += [tag[at:i], inner.removesuffix("-").rstrip()]
        at = close + 2
    parts.append(tag[at:])
    return "".join(parts)


def rewrite_markup(text: str) -> str:
    """One markup span with its `${...}` references in plain Liquid; inside a tag, a nested
    output (`{% if {{subscribed_state.${g}}} == "subscribed" %}`) becomes its expression."""
    text = DOLLAR_NAME_RE.sub(r"\1", DOLLAR_KEY_RE.sub(r'["\1"]', text))
    return unnest_outputs(text) if text.startswith("{%") else text


def to_liquid(source: str) -> str:
    """Page HTML with the specification's `${...}` tag forms rewritten inside markup only
    (page text such as a script's `${x}` is left alone)."""
    parts, at = [], 0
    for start, end in markup_spans(source):
        parts += [source[at:start], rewrite_markup(source[start:end])]
        at = end
    parts.append(source[at:])
    return "".join(parts)


# Liquid's lexer tries each `{{`, `{%` and `{% raw %}` it meets against the rest of the page:
# one that is never closed makes it read on to the end, from each of them (20,000 characters of
# `{{`: 72 s). `unclosed` reads the page as that lexer does, once, and such a page is refused
# before Liquid reads it (Liquid refuses it too, but inside a comment).
OPENER_RE = re.compile(r"\{[{%]")
TAG_NAME_RE = re.compile(r"\{%-?\s*(?:#|\w+)")
BLOCKS_RE: tuple[tuple[re.Pattern[str], re.Pattern[str], str, str], ...] = (
    (re.compile(r"\{%-?\s*raw\s*-?%\}"), re.compile(r"\{%-?\s*endraw\s*-?%\}"), "{% raw %}", "{% endraw %}"),
    (re.compile(r"\{%-?\s*doc\s*-?%\}"), re.compile(r"\{%-?\s*enddoc\s*-?%\}"), "{% doc %}", "{% enddoc %}"),
)


def unclosed(text: str) -> tuple[str, str, int] | None:
    """The first opener of the Liquid text that Liquid's lexer would try and find no closer for,
    as (opener, closer, position), or None. Goes from match to match as that lexer does: `{{`
    to the first `}}` after it, `{% raw %}` and `{% doc %}` to their end tags, a named `{%` to
    the first `%}` after it, anything else to the next `{{` or `{%`."""
    at = 0
    while (found := OPENER_RE.search(text, at)) is not None:
        i = found.start()
        if text.startswith("{{", i):
            close = text.find("}}", i + 2)
            if close < 0:
                return "{{", "}}", i
            at = close + 2
            continue
        for opener, ender, opener_name, ender_name in BLOCKS_RE:
            if (block := opener.match(text, i)) is not None:
                if (end := ender.search(text, block.end())) is None:
                    return opener_name, ender_name, i
                at = end.end()
                break
        else:
            if TAG_NAME_RE.match(text, i) is None:  # not a tag: text, up to the next opener
                at = i + 1
                continue
            close = text.find("%}", i + 2)
            if close < 0:
                return "{%", "%}", i
            at = close + 2
    return None


def check_lexable(text: str) -> None:
    """Raise the syntax error of a Liquid text with an opener that is never closed."""
    if (open_ := unclosed(text)) is not None:
        opener, closer, position = open_
        raise LiquidSyntaxError(ERR_UNCLOSED.format(opener=opener, closer=closer),
                                token=Token(TOKEN_EOF, opener, start_index=position, source=text))


def bound_ranges(template: BoundTemplate) -> BoundTemplate:
    """The template with each range literal a `BoundedRange` (the same object, its class
    changed: a range can stand in any expression, and the nodes and expressions name their
    children, as Liquid's static analysis reads them)."""
    context = RenderContext(template)

    def expression(expr: Expression) -> None:
        if type(expr) is RangeLiteral:
            expr.__class__ = BoundedRange
        for child in expr.children():
            expression(child)

    def visit(node: Node) -> None:
        for expr in node.expressions():
            expression(expr)
        for child in node.children(context, include_partials=False):
            visit(child)

    for node in template.nodes:
        visit(node)
    return template


@lru_cache(maxsize=256)
def parse_template(source: str) -> BoundTemplate:
    """The parsed template of a page (raises LiquidError), within its limits: a page stored
    before them is bounded when it is viewed too."""
    if len(source) > MAX_TEMPLATE_CHARS:
        raise PageLimitError(ERR_TOO_LARGE, token=None)
    text = to_liquid(source)
    check_lexable(text)
    return bound_ranges(ENV.from_string(text))


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
    message = LIMIT_MESSAGES.get(type(err), message)
    if isinstance(err, TemplateNotFoundError):
        message = ERR_PARTIAL.format(name=message)
    return message, line


def render_source(source: str, variables: dict[str, Any]) -> str:
    """A page's template rendered (raises LiquidError). A fault of the template's values that
    Liquid does not catch (a number too long to write, say) is a Liquid error too: a page that
    fails answers as one, never as a server error."""
    try:
        return parse_template(source).render(**variables)
    except LiquidError:
        raise
    except TEMPLATE_FAULTS as fault:
        raise PageFault(ERR_FAULT.format(kind=type(fault).__name__, detail=fault), token=None) from None


def check_template(field: str, source: str) -> None:
    """Parse a page and render it once for a user without data, so that syntax errors and
    unknown filters are refused when the center is saved rather than when a user opens it;
    a page over MAX_TEMPLATE_CHARS, or whose render reaches a limit, is refused too."""
    if len(source) > MAX_TEMPLATE_CHARS:
        raise Refused(400, ERR_TEMPLATE_SIZE.format(field=field, size=len(source), most=MAX_TEMPLATE_CHARS))
    try:
        render_source(source, user_variables(None, {}, "#"))
    except LiquidError as err:
        message, line = describe_error(err)
        raise Refused(400, ERR_TEMPLATE.format(field=field, error=message, line=line)) from None


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
    end = head_end(html)
    return head + html if end < 0 else html[:end] + head + html[end:]


HEAD_RE = re.compile(r"<head\b", re.IGNORECASE)


def head_end(html: str) -> int:
    """The end of the first `<head ...>` tag, or -1: what `<head\\b[^>]*>` finds, read once (that
    regex went on to the end of the page from every `<head` with no `>` after it). When the
    first `<head` has no `>` after it, no later one has."""
    start = HEAD_RE.search(html)
    if start is None:
        return -1
    close = html.find(">", start.end())
    return -1 if close < 0 else close + 1


def render_html(center: dict[str, Any], source: str, variables: dict[str, Any]) -> str:
    """One page of a center rendered with a user's variables (422 if the template fails)."""
    try:
        html = render_source(source, variables)
    except LiquidError as err:
        message, _ = describe_error(err)
        raise Refused(422, ERR_RENDER.format(center_id=center["center_id"], error=message)) from None
    return add_head(html, center)
