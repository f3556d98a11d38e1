"""Hostile templates and the recipients' pages (issue 56, items 3, 5 and the pages of 6): a page's
template is bounded (its size, Liquid's loop, output and variable limits, ranges, the work of a
render) and read by scans that go over it once, so that no template can stall the writer, at
save or at view; a bound reached answers 400 at save and 422 at view, never a 500. The staff page
renders a working form only for a key that may make links; recipients' pages carry a strict
Content-Security-Policy, whatever the path's slashes, and a bad link answers 403 whether or not
its center exists.

No assertion here is on time but one, whose bound is some twenty times what the work takes on a
loaded 2-core machine, measured in CPU seconds, in a process of its own that is stopped if it
runs away (the quadratic scans took minutes to hours on the same inputs)."""

from __future__ import annotations

import html
import json
import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import polars as pl
import pytest
from tests.helpers import open_ws, track_ok
from tests.test_api_server import bearer, served
from tests.test_preference_pages import path_of, seeded

from engagelake import Response, Workspace
from engagelake.api import pages as http_pages
from engagelake.resources import pages
from engagelake.resources import preference_centers as P
from engagelake.resources.preference_terms import ERR_TEMPLATE, ERR_TEMPLATE_SIZE
from engagelake.resources.refusals import Refused
from engagelake.rules.state import Changes

BASE_URL = "https://prefs.example.com"
FIELD = "preference_center_page_html"
ROOT = Path(__file__).resolve().parents[1]


def center_body(page: str, name: str = "limits") -> dict[str, str]:
    return {"name": name, "preference_center_title": "Limits", "preference_center_page_html": page,
            "confirmation_page_html": "<p>saved</p>"}


def refused(error: str, line: int = 1) -> dict[str, str]:
    return {"message": ERR_TEMPLATE.format(field=FIELD, error=error, line=line)}


# --- the scans: what the regexes found, read once -----------------------------------------------
# the regexes they replace (quadratic on `{%` or `<head` with nothing to close them), kept here as
# the reference of what the scans must find
OLD_MARKUP_RE = re.compile(r"\{\{(?:[^{}]|\$\{[^{}]*\})*\}\}|\{%.*?%\}", re.DOTALL)
OLD_NESTED_OUTPUT_RE = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.DOTALL)
OLD_HEAD_RE = re.compile(r"<head\b[^>]*>", re.IGNORECASE)


def old_to_liquid(source: str) -> str:
    def rewrite(match: re.Match[str]) -> str:
        text = pages.DOLLAR_NAME_RE.sub(r"\1", pages.DOLLAR_KEY_RE.sub(r'["\1"]', match.group()))
        return OLD_NESTED_OUTPUT_RE.sub(r"\1", text) if text.startswith("{%") else text

    return OLD_MARKUP_RE.sub(rewrite, source)


def test_the_scans_find_what_the_regexes_found() -> None:
    rng = random.Random(56)
    alphabet = ["{", "}", "%", "$", "-", " ", "\n", "\t", "a", ".", '"', "{{", "}}", "{%", "%}", "${"]
    for _ in range(20_000):
        source = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 16)))
        assert list(pages.markup_spans(source)) == [m.span() for m in OLD_MARKUP_RE.finditer(source)], source
        assert pages.to_liquid(source) == old_to_liquid(source), source
        assert pages.unnest_outputs(source) == OLD_NESTED_OUTPUT_RE.sub(r"\1", source), source
    heads = ["<head", "<HEAD", "<heads", "<head ", "<head\n", ">", "x", "<", "<head>"]
    for _ in range(5_000):
        html = "".join(rng.choice(heads) for _ in range(rng.randint(0, 8)))
        found = OLD_HEAD_RE.search(html)
        assert pages.head_end(html) == (found.end() if found else -1), html
    # the specification's forms, as before
    assert pages.to_liquid('{% if {{subscribed_state.${g1}}} == "subscribed" %}x{% endif %}{{${email_address}}}') \
        == '{% if subscribed_state["g1"] == "subscribed" %}x{% endif %}{{email_address}}'


def test_an_opener_that_is_never_closed_is_refused_before_liquid_reads_it() -> None:
    """Liquid's lexer reads on to the end of the page from each `{{`, `{%` or `{% raw %}` it finds
    no closer for: `unclosed` reads the page as that lexer does, once, and names the first."""
    assert pages.unclosed("<p>{{ a }} {% if b %}c{% endif %} {% raw %}{{{% endraw %}</p>") is None
    assert pages.unclosed("{{ '{%' }} {{ '{{' }}") is None  # inside an output: Liquid never tries them
    assert pages.unclosed("{% {%x%}") is None  # a `{%` without a name is text up to the next `{%`
    assert pages.unclosed("a\n{{ b }}\n{{ c") == ("{{", "}}", 10)
    assert pages.unclosed("{% if a") == ("{%", "%}", 0)
    assert pages.unclosed("{%}") is None  # no name: text (Liquid refuses it itself, at once)
    assert pages.unclosed("{% raw %}x") == ("{% raw %}", "{% endraw %}", 0)
    assert pages.unclosed("{%- doc -%}x{% enddoc") == ("{% doc %}", "{% enddoc %}", 0)
    # Liquid refuses each of these too; none is read past its opener
    for source, error, line in [("<p>\n{{ first_name\n</p>" + "{{" * 1000, "'{{' is never closed: no '}}' follows it", 2),
                                ("{% if a" * 1000, "'{%' is never closed: no '%}' follows it", 1),
                                ("{% raw %}" * 1000, "'{% raw %}' is never closed: no '{% endraw %}' follows it", 1)]:
        with pytest.raises(Refused) as caught:
            pages.check_template(FIELD, source)
        assert caught.value.response == Response(400, refused(error, line))


# runs in a process of its own, so that a scan gone quadratic again fails by a timeout and
# does not hang the run; only names that were there before the limits (check_template, add_head)
BOUNDED_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from engagelake.resources import pages
    from engagelake.resources.refusals import Refused

    N = 128 * 1024 - 256
    def rep(unit, size=N):
        return unit * (size // len(unit))
    cases = {
        "{%": rep("{%"),
        "{% {{": rep("{% {{"),
        "{{": rep("{{"),
        "{{ a": rep("{{ a"),
        "{% if a": rep("{% if a"),
        "{% raw %}": rep("{% raw %}"),
        "{% if {{ %}": "{% if " + rep("{{ a ", N - 16) + "%}",
        "range join": "{{ (1..3000000) | join }}",
        # the rest are bounded as they render: a few kilobytes are enough
        "range joins": "{{ (1..10000) | join | size }}" * 200,
        "loop body": "{% for i in (1..10000) %}" + "{% assign a = i %}" * 500 + "{% endfor %}",
        "loops": "{% for i in (1..10000) %}{{ i }}{% endfor %}" * 100,
        "assigns": "".join("{%% assign a%d = 1 %%}" % i for i in range(4000)),
        "list reads": "{% assign a = (1..10000) | sort %}" + "{% if a == a %}{% endif %}" * 100,
        "uniq": "{% assign a = (1..5000) | sort %}{% assign b = a | uniq %}",
        "replace": "{% assign s = '" + "x" * 2000 + "' %}{{ s | replace: 'x', s }}",
    }
    out = {}
    for name, source in cases.items():
        start = time.process_time()
        try:
            pages.check_template("page", source)
            outcome = "ok"
        except Refused as refusal:
            outcome = refusal.response.body["message"]
        except Exception as error:
            outcome = "raised " + type(error).__name__
        out[name] = [time.process_time() - start, outcome]
    html = "<head" * (N // 5)
    start = time.process_time()
    pages.add_head(html, {"title": "t", "options": None})
    out["<head"] = [time.process_time() - start, "ok"]
    print(json.dumps(out))
""")
CPU_BOUND_S = 20.0  # per case; each takes at most about 1 s of CPU on a loaded 2-core machine
RUN_TIMEOUT_S = 900


def test_hostile_templates_are_answered_in_bounded_time() -> None:
    """Pages of 128 KiB built to make the scans, Liquid's lexer or a render go quadratic: each
    is answered (refused, with the limit it reached) in bounded CPU time. Before the limits, the
    first of them ran for minutes (40,000 characters of `{%`: 7 s; of `{{`: 72 s for 20,000)."""
    try:
        run = subprocess.run([sys.executable, "-c", BOUNDED_SCRIPT], capture_output=True, text=True,
                             timeout=RUN_TIMEOUT_S, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT / "src")})  # this checkout's code
    except subprocess.TimeoutExpired:
        pytest.fail(f"the hostile templates took over {RUN_TIMEOUT_S} s: a scan or a render is unbounded again")
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    slow = {name: round(cpu, 2) for name, (cpu, _) in got.items() if cpu > CPU_BOUND_S}
    assert not slow, slow
    outcomes = {name: outcome for name, (_, outcome) in got.items()}
    steps = ERR_TEMPLATE.format(field="page", error=pages.ERR_STEPS, line=1)
    assert outcomes == {
        "{%": ERR_TEMPLATE.format(field="page", error="missing tag name or closing delimiter", line=1),
        "{% {{": ERR_TEMPLATE.format(field="page", error="'{{' is never closed: no '}}' follows it", line=1),
        "{{": ERR_TEMPLATE.format(field="page", error="'{{' is never closed: no '}}' follows it", line=1),
        "{{ a": ERR_TEMPLATE.format(field="page", error="'{{' is never closed: no '}}' follows it", line=1),
        "{% if a": ERR_TEMPLATE.format(field="page", error="'{%' is never closed: no '%}' follows it", line=1),
        "{% raw %}": ERR_TEMPLATE.format(field="page", error="'{% raw %}' is never closed: no '{% endraw %}' "
                                                             "follows it", line=1),
        "{% if {{ %}": ERR_TEMPLATE.format(field="page", error="unexpected '{'", line=1),
        "range join": ERR_TEMPLATE.format(field="page", error=pages.ERR_RANGE, line=1),
        "range joins": steps, "loop body": steps, "loops": steps, "list reads": steps, "uniq": steps,
        "assigns": "ok",
        "replace": ERR_TEMPLATE.format(field="page", error=pages.ERR_VALUE, line=1),
        "<head": "ok",
    }


# --- the limits, at save ------------------------------------------------------------------------
def test_a_page_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    most = pages.MAX_TEMPLATE_CHARS
    page = "<p>" + "x" * (most - 7) + "</p>"
    assert len(page) == most
    assert ws.call("POST", P.BASE, center_body(page)).status == 200
    over = page + "x"
    r = ws.call("POST", P.BASE, center_body(over, "other"))
    assert (r.status, r.body) == (400, {"message": ERR_TEMPLATE_SIZE.format(field=FIELD, size=most + 1, most=most)})
    center = ws.preference_centers.center_id("limits")
    r = ws.call("PUT", f"{P.BASE}/{center}", {"confirmation_page_html": over})
    assert r.status == 400 and r.body["message"].startswith("invalid confirmation_page_html: 131,073 characters")


@pytest.mark.parametrize(("page", "error"), [
    ("{% for i in (1..2000) %}{% for j in (1..2000) %}{% endfor %}{% endfor %}",  # 4M iterations: 6.4 s before
     pages.LIMIT_MESSAGES[pages.LoopIterationLimitError]),
    ("{% for i in (1..10000) %}" + "x" * 300 + "{% endfor %}", pages.LIMIT_MESSAGES[pages.OutputStreamLimitError]),
    ("{% capture s %}{% for i in (1..10000) %}" + "x" * 300 + "{% endfor %}{% endcapture %}",
     pages.LIMIT_MESSAGES[pages.OutputStreamLimitError]),
    ("{% assign s = 'xx' %}{% for i in (1..30) %}{% assign s = s | append: s %}{% endfor %}",
     pages.ERR_VALUE),
    ("{% for i in (1..100000000) offset: 99999999 %}{{ i }}{% endfor %}", pages.ERR_RANGE),
    ("{{ (1..100000000) | reverse | first }}", pages.ERR_RANGE),
    ("{{ 99999999999999999999" + " | times: 99999999999999999999" * 20 + " }}", pages.ERR_NUMBER),
    ("{% for i in (1..10000) %}" + "{% assign a = i %}" * 20 + "{% endfor %}", pages.ERR_STEPS),
])
def test_a_page_that_reaches_a_limit_is_refused_at_save(tmp_path: Path, page: str, error: str) -> None:
    ws = open_ws(tmp_path)
    r = ws.call("POST", P.BASE, center_body(page))
    assert (r.status, r.body) == (400, refused(error))


def test_pages_within_the_limits_still_render(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    track_ok(ws, attributes=[{"external_id": "u1", "email": "ann@x.com", "first_name": "Ann"}])
    page = ("{% for i in (1..100) %}{% for j in (1..100) %}{% endfor %}{% endfor %}"  # 10,000: the limit
            "{% assign groups = 'news,offers,sales' | split: ',' %}"
            "{% for g in groups %}<p>{{ g | upcase }} {{ subscribed_state[g] }}</p>{% endfor %}"
            "{{ (1..10000) | size }} {{ first_name | append: '!' }}")
    r = ws.call("POST", P.BASE, center_body(page))
    assert r.status == 200, r.body
    html = ws.call("GET", f"{P.BASE}/{r.body['preference_center_api_id']}/page", query={"external_id": "u1"}).body
    assert "<p>NEWS unsubscribed</p><p>OFFERS unsubscribed</p><p>SALES unsubscribed</p>10000 Ann!" in html


# --- the limits, at view ------------------------------------------------------------------------
HEAVY_FOR_BOB = ('<form action="{{ preference_center_submit_url }}" method="post"></form>'
                 '{% if first_name == "Bob" %}{% for i in (1..200) %}{% for j in (1..200) %}{% endfor %}'
                 '{% endfor %}{% endif %}<p>{{ first_name }}</p>')


def store_page(ws: Workspace, center: str, page: str) -> None:
    """Write a center's page as a store made before the limits may hold it (no check)."""
    row = ws.table("preference_centers").collect().filter(pl.col("center_id") == center).with_columns(
        page_html=pl.lit(page))

    def build(ctx: P.Context) -> None:
        changes = Changes()
        changes.upsert("preference_centers", row)
        ctx.write(changes)

    ws.write(build)


def test_a_page_that_reaches_a_limit_for_one_user_answers_422_not_500(tmp_path: Path) -> None:
    """A branch only one user's data reaches can pass the check at save: the limits hold at
    view time too, in the writer, and the page answers its 422 (an HTML page for a recipient)."""
    ws = open_ws(tmp_path)
    track_ok(ws, attributes=[{"external_id": "ann", "first_name": "Ann"}, {"external_id": "bob", "first_name": "Bob"}])
    center = ws.call("POST", P.BASE, center_body(HEAVY_FOR_BOB)).body["preference_center_api_id"]
    loop_limit = pages.LIMIT_MESSAGES[pages.LoopIterationLimitError]
    assert "<p>Ann</p>" in ws.call("GET", f"{P.BASE}/{center}/page", query={"external_id": "ann"}).body
    r = ws.call("GET", f"{P.BASE}/{center}/page", query={"external_id": "bob"})
    assert (r.status, r.body) == (422, {"message": P.ERR_RENDER.format(center_id=center, error=loop_limit)})
    with served(ws) as client:
        for user in ("ann", "bob"):
            link = path_of(ws.preference_centers.link("limits", user, base_url=BASE_URL))
            page = client.get(link)
            assert page.headers["content-type"] == "text/html; charset=utf-8"
            assert page.status_code == (200 if user == "ann" else 422)
        assert "This page cannot be shown" in page.text and html.escape(loop_limit) in page.text
    # a page stored before the limits is bounded when it is viewed: too large, or never closed
    for stored, error in [("<p>" + "x" * pages.MAX_TEMPLATE_CHARS + "</p>", pages.ERR_TOO_LARGE),
                          ("<p>{{ first_name }}</p>" + "{{" * 20_000, "'{{' is never closed: no '}}' follows it")]:
        store_page(ws, center, stored)
        r = ws.call("GET", f"{P.BASE}/{center}/page", query={"external_id": "ann"})
        assert (r.status, r.body) == (422, {"message": P.ERR_RENDER.format(center_id=center, error=error)})


# --- item 3: the staff page's form is a link --------------------------------------------------
def test_the_staff_page_has_a_working_form_only_for_a_key_that_may_make_links(tmp_path: Path) -> None:
    """`preference_center.get` shows the staff page as a preview whose form posts nowhere (no
    token); with `preference_center.link` (or `all`) the form posts to a signed submit URL, as
    `Workspace.call` renders it (Python callers hold the store: no permission applies)."""
    ws = open_ws(tmp_path)
    center = seeded(ws)
    viewer = ws.credentials.create_key("viewer", ["preference_center.get"])
    linker = ws.credentials.create_key("linker", ["preference_center.get", "preference_center.link"])
    everything = ws.credentials.create_key("all", ["all"])
    page_path = f"{P.BASE}/{center}/page"
    with served(ws) as client:
        preview = client.get(page_path, params={"external_id": "u1"}, headers=bearer(viewer))
        assert preview.status_code == 200 and "Hi Ann," in preview.text
        assert f'action="{P.PREVIEW_ACTION}"' in preview.text and "token=" not in preview.text
        # asking for the full page changes nothing without the permission
        asked = client.get(page_path, params={"external_id": "u1", P.PREVIEW: "false"}, headers=bearer(viewer))
        assert asked.text == preview.text
        for key in (linker, everything):
            full = client.get(page_path, params={"external_id": "u1"}, headers=bearer(key))
            action = re.search(r'<form action="([^"]+)"', full.text)
            assert action is not None and "/submit?token=" in action.group(1)
        token = parse_qs(urlsplit(action.group(1).replace("&amp;", "&")).query)["token"][0]
        saved = client.post(f"{P.BASE}/{center}/submit", params={"token": token},
                            json={"email_global_state": "unsubscribed"})
        assert saved.status_code == 200
        # a key with the permission may still ask for the preview
        asked = client.get(page_path, params={"external_id": "u1", P.PREVIEW: "true"}, headers=bearer(linker))
        assert f'action="{P.PREVIEW_ACTION}"' in asked.text
    # in Python: the signed form, or the preview when asked
    assert "/submit?token=" in ws.call("GET", page_path, query={"external_id": "u1"}).body
    called = ws.call("GET", page_path, query={"external_id": "u1", P.PREVIEW: "true"}).body
    assert f'action="{P.PREVIEW_ACTION}"' in called and "token=" not in called


# --- item 6: the recipients' pages ------------------------------------------------------------
def test_recipient_pages_carry_a_strict_content_security_policy(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    center = seeded(ws)
    link = path_of(ws.preference_centers.link("main", "u1", base_url=BASE_URL))
    with served(ws) as client:
        for response in (client.get(link), client.get(f"/preferences/{center}", params={"token": "forged"})):
            policy = dict(part.strip().split(" ", 1) for part in response.headers["content-security-policy"].split(";"))
            assert policy["default-src"] == "'none'"  # no script runs: the token is in the page's URL
            assert policy["form-action"] == "'self'"
            assert policy["base-uri"] == "'none'"
            assert policy["frame-ancestors"] == "'none'"
            assert "script-src" not in policy
        saved = client.post(link, data={"email_global_state": "unsubscribed"})  # the form posts as before
        assert saved.status_code == 200


def test_a_page_path_with_extra_slashes_is_a_page(tmp_path: Path) -> None:
    """`//preferences/{id}` (and a trailing slash) routes as `/preferences/{id}`: it answers as
    the page, HTML with the pages' headers, and a bad link is refused before it is queued."""
    ws = open_ws(tmp_path)
    center = seeded(ws)
    token = parse_qs(urlsplit(ws.preference_centers.link("main", "u1", base_url=BASE_URL)).query)["token"][0]
    with served(ws) as client:
        root = str(client.base_url).rstrip("/")
        before = client.writer.batches  # type: ignore[attr-defined]
        for path in (f"//preferences/{center}", f"/preferences/{center}/", f"//preferences/{center}//"):
            for method in ("GET", "POST"):
                bad = client.request(method, root + path, params={"token": "forged"})
                assert bad.status_code == 403, (method, path)
                assert bad.headers["content-type"] == "text/html; charset=utf-8"
                for name, value in http_pages.HEADERS.items():
                    assert bad.headers[name] == value, (path, name)
        assert client.writer.batches == before  # type: ignore[attr-defined]
        good = client.get(root + f"//preferences/{center}", params={"token": token})
        assert good.status_code == 200 and "Hi Ann," in good.text
        for name, value in http_pages.HEADERS.items():
            assert good.headers[name] == value, name
        # the JSON submit route with extra slashes: refused before it is queued too
        before = client.writer.batches  # type: ignore[attr-defined]
        other = client.post(root + f"//preference_center/v1/{center}/submit/", params={"token": "forged"}, json={})
        assert (other.status_code, other.json()) == (403, {"message": P.ERR_TOKEN})
        assert client.writer.batches == before  # type: ignore[attr-defined]


def test_a_bad_link_is_403_whether_or_not_its_center_exists(tmp_path: Path) -> None:
    """The token is checked first on every link route: a forged link says nothing of which
    centers exist (no 404 for an unknown one)."""
    ws = open_ws(tmp_path)
    center = seeded(ws)
    with served(ws) as client:
        for name in (center, "nope", "342203dd-f39a-4b50-82ad-a96db5d6f000"):
            for method in ("GET", "POST"):
                r = client.request(method, f"/preferences/{name}", params={"token": "forged"})
                assert r.status_code == 403, (method, name)
            r = client.post(f"{P.BASE}/{name}/submit", params={"token": "forged"}, json={})
            assert (r.status_code, r.json()) == (403, {"message": P.ERR_TOKEN})
    for name in (center, "nope"):  # as `Workspace.call` answers
        for method, path in (("GET", f"/preferences/{name}"), ("POST", f"/preferences/{name}"),
                             ("POST", f"{P.BASE}/{name}/submit")):
            assert ws.call(method, path, {} if method == "POST" else None, {"token": "forged"}).status == 403
