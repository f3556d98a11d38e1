"""Preference centers for recipients (issue 16): signed links, the page and its form served over
HTTP by a real server as a browser meets them (HTML, a form-encoded POST), readable error pages,
the safety headers, and the default page."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
from tests.helpers import NOW, Clock, open_ws, track_ok
from tests.test_api_server import UnixClock, served

from engagelake import Workspace
from engagelake.api import pages as http_pages
from engagelake.api.limits import DEFAULT_LIMITS, Limit
from engagelake.resources import preference_centers as P
from engagelake.resources.preference_centers import PreferenceCenterError

BASE_URL = "https://prefs.example.com"
GROUPS = {"news": "Newsletter", "offers": "Special offers"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def seeded(ws: Workspace, first_name: str = "Ann") -> str:
    """u1 (subscribed to news), u2 with the same email; the default center "main". Its ID."""
    track_ok(ws, attributes=[
        {"external_id": "u1", "email": "ann@x.com", "first_name": first_name,
         "subscription_groups": [{"subscription_group_id": "news", "subscription_state": "subscribed"}]},
        {"external_id": "u2", "email": "ann@x.com"},
    ])
    created = ws.preference_centers.create_default("main", GROUPS, title="Your emails")
    return str(created["preference_center_api_id"])


def path_of(link: str) -> str:
    parts = urlsplit(link)
    return f"{parts.path}?{parts.query}"


def boxes(page: str) -> dict[str, bool]:
    """Each checkbox of a page: its field name, and whether it is checked."""
    found = re.findall(r'<input type="checkbox" name="([^"]+)" value="[^"]+"( checked)?>', page)
    return {name: bool(checked) for name, checked in found}


def states(ws: Workspace, external_id: str) -> dict[str, str]:
    rows = ws.table("subscriptions").collect().join(
        ws.table("external_ids").collect().filter(external_id=external_id), on="service_id")
    return dict(rows.select("group_id", "state").rows())


def email_subscribe(ws: Workspace, external_id: str) -> str | None:
    r = ws.call("POST", "/users/export/ids", {"external_ids": [external_id], "fields_to_export": ["email_subscribe"]})
    return r.body["users"][0].get("email_subscribe")


def assert_page_headers(response: httpx.Response) -> None:
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    for name, value in http_pages.HEADERS.items():
        assert response.headers[name] == value, name


# --- links ------------------------------------------------------------------------------------
def test_a_link_is_signed_absolute_and_expires_when_asked(tmp_path) -> None:
    ws = open_ws(tmp_path)
    center = seeded(ws)
    link = ws.preference_centers.link("main", "u1", base_url=BASE_URL + "/")
    key = ws.link_keys.ring().signing  # the store's first key, made for this link
    assert key is not None
    expected = P.sign_token(key, center, token_sid(ws, "u1"), NOW, NOW + timedelta(days=30))
    assert link == f"{BASE_URL}/preferences/{center}?token={expected}"
    # by ID as by name; a shorter life; another user gets another token
    assert ws.preference_centers.link(center, "u1", base_url=BASE_URL) == link
    short = ws.preference_centers.link("main", "u1", base_url=BASE_URL, expires_in=timedelta(hours=1))
    assert short.endswith(P.sign_token(key, center, token_sid(ws, "u1"), NOW, NOW + timedelta(hours=1)))
    assert ws.preference_centers.link("main", "u2", base_url=BASE_URL) != link


def token_sid(ws: Workspace, external_id: str) -> str:
    rows = ws.table("external_ids").collect().filter(external_id=external_id)
    return str(rows["service_id"][0])


def test_a_link_by_user_alias_and_the_link_errors(tmp_path) -> None:
    ws = open_ws(tmp_path)
    center = seeded(ws)
    assert ws.call("POST", "/users/alias/new", {"user_aliases": [
        {"external_id": "u1", "alias_name": "a1", "alias_label": "crm"}]}).status == 200
    by_alias = ws.preference_centers.link("main", {"alias_name": "a1", "alias_label": "crm"}, base_url=BASE_URL)
    assert by_alias == ws.preference_centers.link("main", "u1", base_url=BASE_URL)
    route = f"{P.BASE}/{center}/link"
    cases = [
        ({"external_id": "u1"}, 400, P.ERR_NO_BASE_URL),
        ({"external_id": "u1", "base_url": "prefs.example.com"}, 400, P.ERR_BASE_URL.format(field="base_url")),
        ({"external_id": "u1", "base_url": BASE_URL + "/?x=1"}, 400, P.ERR_BASE_URL.format(field="base_url")),
        ({"external_id": "u1", "expires_in": "0", "base_url": BASE_URL}, 400, P.ERR_LINK_EXPIRES),
        ({"external_id": "u1", "expires_in": "soon", "base_url": BASE_URL}, 400, P.ERR_LINK_EXPIRES),
        ({"external_id": "u1", "alias_name": "a1", "alias_label": "crm"}, 400, P.ERR_LINK_USER),
        ({"alias_name": "a1"}, 400, P.ERR_LINK_USER),
        ({"external_id": "nobody", "base_url": BASE_URL}, 404,
         P.ERR_USER_NOT_FOUND.format(kind="external_id", value="nobody")),
        ({"alias_name": "a9", "alias_label": "crm", "base_url": BASE_URL}, 404,
         P.ERR_USER_NOT_FOUND.format(kind="alias", value="crm:a9")),
    ]
    for query, status, message in cases:
        r = ws.call("GET", route, query=query)
        assert (r.status, r.body) == (status, {"message": message}), query
    with pytest.raises(PreferenceCenterError) as missing:
        ws.preference_centers.link("nope", "u1", base_url=BASE_URL)
    assert missing.value.status == 404


def test_the_public_url_is_the_links_base_and_the_liquid_tag_renders_to_the_link(tmp_path) -> None:
    ws = open_ws(tmp_path)
    seeded(ws)
    assert ws.preference_centers.set_public_url(BASE_URL + "/") == BASE_URL
    link = ws.preference_centers.link("main", "u1")
    assert link.startswith(BASE_URL + "/preferences/")
    assert ws.preference_centers.link("main", "u1", base_url="http://127.0.0.1:9") != link  # base_url wins
    message = "Hi! Manage your emails: {{preference_center.${main}}} or {{ preference_center.${main} }}."
    assert ws.preference_centers.render_tags(message, "u1") == f"Hi! Manage your emails: {link} or {link}."
    r = ws.call("PUT", f"{P.BASE}/public_url", {"public_url": "ftp://x"})
    assert (r.status, r.body) == (400, {"message": P.ERR_BASE_URL.format(field="public_url")})
    reopened = Workspace.open(ws.store.uri, clock=lambda: NOW, seed="t")
    assert reopened.preference_centers.link("main", "u1") == link  # recorded in the store


# --- the page and its form over HTTP --------------------------------------------------------------
def test_the_link_opens_the_page_with_the_users_states_and_a_browser_form_saves_them(tmp_path) -> None:
    ws = open_ws(tmp_path)
    center = seeded(ws)
    link = path_of(ws.preference_centers.link("main", "u1", base_url=BASE_URL))
    with served(ws) as client:
        page = client.get(link)
        assert page.status_code == 200
        assert_page_headers(page)
        assert "<title>Your emails</title>" in page.text and "Hi Ann," in page.text and "ann@x.com" in page.text
        assert boxes(page.text) == {"subscription_group:news": True, "subscription_group:offers": False,
                                    "email_global_state": False}
        # the form posts back to the link, relative to the page (any path prefix a proxy adds holds)
        assert f'action="{link.removeprefix("/preferences/")}"' in page.text.replace("&amp;", "&")
        # as a browser posts it: news unchecked (its hidden field only), offers checked (both
        # fields, the checkbox last), and "unsubscribe from all" checked
        form = [("subscription_group:news", "unsubscribed"), ("subscription_group:offers", "unsubscribed"),
                ("subscription_group:offers", "subscribed"), ("email_global_state", "subscribed"),
                ("email_global_state", "unsubscribed")]
        saved = client.post(link, content=urlencode(form), headers=FORM)
        assert saved.status_code == 200
        assert_page_headers(saved)
        assert "Your preferences are saved." in saved.text and "receives no more email" in saved.text
        assert states(ws, "u1") == {"news": "unsubscribed", "offers": "subscribed"}
        assert email_subscribe(ws, "u1") == email_subscribe(ws, "u2") == "unsubscribed"  # same email
        submits = ws.table("preference_center_submits").collect()
        assert submits.height == 1 and submits["center_id"][0] == center
        assert submits["fields"][0] == ('{"subscription_group:news":"unsubscribed","subscription_group:offers":'
                                        '"subscribed","email_global_state":"unsubscribed"}')
        # the same link again: the new states, and a second change
        again = client.get(link)
        assert boxes(again.text) == {"subscription_group:news": False, "subscription_group:offers": True,
                                     "email_global_state": True}
        form = [("subscription_group:news", "unsubscribed"), ("subscription_group:offers", "unsubscribed"),
                ("email_global_state", "subscribed")]
        assert client.post(link, content=urlencode(form), headers=FORM).status_code == 200
        assert states(ws, "u1") == {"news": "unsubscribed", "offers": "unsubscribed"}
        assert email_subscribe(ws, "u1") == "subscribed"
        # an API caller's JSON form is taken too
        answered = client.post(link, json={"subscription_group:news": "subscribed"})
        assert answered.status_code == 200 and states(ws, "u1")["news"] == "subscribed"


def test_an_opted_in_user_who_saves_without_unsubscribing_stays_opted_in(tmp_path) -> None:
    ws = open_ws(tmp_path)
    seeded(ws)
    track_ok(ws, attributes=[{"external_id": "u1", "email_subscribe": "opted_in"}])
    link = path_of(ws.preference_centers.link("main", "u1", base_url=BASE_URL))
    with served(ws) as client:
        page = client.get(link).text
        hidden = re.search(r'<input type="hidden" name="email_global_state" value="([^"]+)">', page)
        assert hidden is not None and hidden.group(1) == "opted_in"
        form = [("subscription_group:news", "unsubscribed"), ("subscription_group:offers", "unsubscribed"),
                ("email_global_state", hidden.group(1))]
        assert client.post(link, content=urlencode(form), headers=FORM).status_code == 200
    assert email_subscribe(ws, "u1") == "opted_in"


def test_profile_values_are_escaped_in_the_page(tmp_path) -> None:
    ws = open_ws(tmp_path)
    seeded(ws, first_name="<img src=x onerror=alert(1)>")
    with served(ws) as client:
        page = client.get(path_of(ws.preference_centers.link("main", "u1", base_url=BASE_URL))).text
    assert "<img" not in page and "Hi &lt;img src=x onerror=alert(1)&gt;," in page


# --- errors a person can read -----------------------------------------------------------------
def error_title(response: httpx.Response) -> str:
    assert_page_headers(response)
    match = re.search(r"<h1>([^<]+)</h1>", response.text)
    assert match is not None, response.text
    return match.group(1)


def test_expired_forged_draft_deleted_and_unknown_get_readable_pages(tmp_path) -> None:
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    center = seeded(ws)
    link = path_of(ws.preference_centers.link("main", "u1", base_url=BASE_URL, expires_in=timedelta(days=1)))
    token = parse_qs(urlsplit(link).query)["token"][0]
    payload, signature = token.split(".")
    other_user = P.b64(P.unb64(payload).replace(token_sid(ws, "u1").encode(), token_sid(ws, "u2").encode()))
    expired, not_valid, unavailable = P.ERR_TOKEN.split(":")[0], http_pages.ADVICE[403][0], http_pages.ADVICE[404][0]
    with served(ws) as client:
        forged = client.get(f"/preferences/{center}?token={other_user}.{signature}")
        assert forged.status_code == 403 and error_title(forged) == not_valid and expired in forged.text
        assert client.get(f"/preferences/{center}").status_code == 403  # no token at all
        posted = client.post(f"/preferences/{center}?token=x.y", content="email_global_state=unsubscribed",
                             headers=FORM)
        assert posted.status_code == 403 and error_title(posted) == not_valid
        # the token names its center: another center's path is a bad link (checked first)
        elsewhere = client.get(f"/preferences/nope?token={token}")
        assert elsewhere.status_code == 403 and P.ERR_TOKEN_CENTER in elsewhere.text
        signed = P.sign_token(ws.link_keys.signing_key(NOW), "nope", token_sid(ws, "u1"), NOW, NOW + timedelta(days=1))
        unknown = client.get(f"/preferences/nope?token={signed}")
        assert unknown.status_code == 404 and error_title(unknown) == unavailable
        # a field the page does not have: 400, a page, nothing changed
        odd = client.post(link, content="subscription_group:vip=subscribed", headers=FORM)
        assert odd.status_code == 400 and error_title(odd) == http_pages.ADVICE[400][0]
        # a wrong method and a body too big: pages too, never JSON
        assert client.put(link).status_code == 405 and error_title(client.put(link)) == http_pages.ADVICE[405][0]
        # the center made a draft: not published
        assert ws.call("PUT", f"{P.BASE}/{center}", {"state": "draft"}).status == 200
        draft = client.get(link)
        assert draft.status_code == 404 and error_title(draft) == unavailable
        assert ws.call("PUT", f"{P.BASE}/{center}", {"state": "active"}).status == 200
        assert client.get(link).status_code == 200
        clock.advance(days=1)
        late = client.get(link)
        assert late.status_code == 403 and error_title(late) == not_valid and "expired" in late.text
        clock.advance(days=-1)
        assert ws.call("POST", "/users/delete", {"external_ids": ["u1"]}).status == 200
        gone = client.get(link)
        assert gone.status_code == 404 and error_title(gone) == unavailable
    assert ws.table("preference_center_submits").collect().height == 0


def test_a_bad_link_is_refused_before_it_is_queued(tmp_path) -> None:
    """The server checks a link's token itself (the signing key is the store's): a forged or
    expired link costs no batch, and gets the answer the route would give."""
    ws = open_ws(tmp_path)
    center = seeded(ws)
    link = path_of(ws.preference_centers.link("main", "u1", base_url=BASE_URL, expires_in=timedelta(seconds=1)))
    forged = link[:-4] + "AAAA"
    with served(ws) as client:
        before = client.writer.batches  # type: ignore[attr-defined]
        answers = [client.get(forged), client.post(forged, content="email_global_state=unsubscribed", headers=FORM),
                   client.get(f"/preferences/{center}")]
        assert [a.status_code for a in answers] == [403, 403, 403]
        assert client.writer.batches == before  # type: ignore[attr-defined]
        assert all(error_title(a) == http_pages.ADVICE[403][0] for a in answers)
        assert client.get(link).status_code == 200 and client.writer.batches == before + 1  # type: ignore[attr-defined]
    for path in (forged, f"/preferences/{center}"):  # the route itself answers the same
        query = parse_qs(urlsplit(path).query)
        r = ws.call("GET", urlsplit(path).path, query={k: v[0] for k, v in query.items()})
        assert r.status == 403


def test_a_body_over_the_limit_gets_a_page(tmp_path) -> None:
    ws = open_ws(tmp_path)
    seeded(ws)
    link = path_of(ws.preference_centers.link("main", "u1", base_url=BASE_URL))
    with served(ws, max_body_bytes=100) as client:
        big = client.post(link, content="email_global_state=" + "x" * 200, headers=FORM)
    assert big.status_code == 413 and error_title(big) == http_pages.ADVICE[413][0]


def test_a_link_opened_too_often_gets_a_page_saying_to_wait_and_other_links_still_work(tmp_path) -> None:
    """Recipients' pages count per link (`recipient_page`): one link used past its limit gets a
    429 page, with the limit's headers, and nothing is saved; another recipient's link, and the
    next window, are not held back; a forged link counts nothing."""
    ws = open_ws(tmp_path)
    center = seeded(ws)
    mine, other = (path_of(ws.preference_centers.link("main", u, base_url=BASE_URL)) for u in ("u1", "u2"))
    clock = UnixClock(NOW.timestamp() + 1)  # a second into a minute's window
    reset = str(int(NOW.timestamp()) // 60 * 60 + 60)
    forged = mine[:-4] + ("aaaa" if not mine.endswith("aaaa") else "bbbb")
    with served(ws, rate_limits={**DEFAULT_LIMITS, "recipient_page": Limit(2, 60)}, clock=clock) as client:
        assert client.get(forged).status_code == 403  # refused before it is counted
        opened = client.get(mine)
        assert opened.status_code == 200 and opened.headers["X-RateLimit-Remaining"] == "1"
        assert opened.headers["X-RateLimit-Reset"] == reset
        assert client.post(mine, content="email_global_state=unsubscribed", headers=FORM).status_code == 200
        over = client.post(mine, content="email_global_state=subscribed", headers=FORM)
        assert over.status_code == 429 and error_title(over) == http_pages.ADVICE[429][0]
        assert_page_headers(over)
        assert (over.headers["X-RateLimit-Limit"], over.headers["X-RateLimit-Remaining"]) == ("2", "0")
        padded = mine + "%3D%3D"  # the same link written otherwise (base64 padding): the same count
        assert client.get(padded).status_code == 429
        assert client.get(other).status_code == 200  # another recipient's link counts apart
        # the JSON submit route of a rendered page counts per link too
        sid = ws.table("external_ids").collect().filter(external_id="u2")["service_id"].item()
        token = P.sign_token(ws.link_keys.signing_key(NOW), center, sid, NOW, NOW + timedelta(days=1))
        submit = f"{P.BASE}/{center}/submit"
        answers = [client.post(submit, params={"token": token}, json={}).status_code for _ in range(3)]
        assert answers == [200, 200, 429], answers
        clock.now += 60
        assert client.get(mine).status_code == 200
    assert email_subscribe(ws, "u1") == "unsubscribed"  # the refused form saved nothing


def test_the_api_routes_stay_json(tmp_path) -> None:
    ws = open_ws(tmp_path)
    center = seeded(ws)
    with served(ws) as client:
        refused = client.get(f"{P.BASE}/{center}/link", params={"external_id": "u1"})
        assert refused.status_code == 401 and refused.headers["content-type"] == "application/json"
        assert client.get("/nowhere").headers["content-type"] == "application/json"


# --- the default page --------------------------------------------------------------------------
def test_the_default_page_has_a_box_per_group_and_no_script(tmp_path) -> None:
    ws = open_ws(tmp_path)
    center = seeded(ws)
    stored = ws.preference_centers.get(center)
    assert stored["preference_center_title"] == "Your emails"
    assert stored["options"] == {"meta-viewport-content": "width=device-width, initial-scale=1"}
    page = ws.call("GET", f"{P.BASE}/{center}/page", query={"external_id": "u2"}).body
    assert "<script" not in page.lower()
    assert [label for label in re.findall(r"<span>([^<]+)</span>", page)] == [
        "Newsletter", "Special offers", "Unsubscribe from all emails"]
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    with pytest.raises(PreferenceCenterError) as bad:
        ws.preference_centers.create_default("other", {'a"b': "x"})
    assert bad.value.status == 400


# --- the CLI -----------------------------------------------------------------------------------
def test_the_cli_creates_a_default_center_and_prints_a_link(tmp_path) -> None:
    from typer.testing import CliRunner

    from engagelake.cli import app

    runner = CliRunner()
    ws = open_ws(tmp_path)
    track_ok(ws, attributes=[{"external_id": "u1", "email": "ann@x.com"}])
    store = str(ws.store.uri)
    created = runner.invoke(app, ["preference-centers", "create-default", "--store", store, "--name", "main",
                                  "--group", "news=Newsletter", "--group", "offers = Special offers"])
    assert created.exit_code == 0, created.output
    center = created.stdout.strip().splitlines()[-1]
    assert "its liquid_tag is {{preference_center.${main}}}" in created.stdout
    page = ws.call("GET", f"{P.BASE}/{center}/page", query={"external_id": "u1"}).body
    assert re.findall(r"<span>([^<]+)</span>", page)[:2] == ["Newsletter", "Special offers"]
    bad = runner.invoke(app, ["preference-centers", "create-default", "--store", store, "--name", "x",
                              "--group", "news"])
    assert bad.exit_code == 1 and "--group takes ID=LABEL, not 'news'" in bad.stderr
    # a link: no base yet says how to set one; with one, the URL alone on the last line
    missing = runner.invoke(app, ["preference-centers", "link", "--store", store, "--center", "main",
                                  "--external-id", "u1"])
    assert missing.exit_code == 1 and "engagelake serve --public-url" in missing.stderr
    made = runner.invoke(app, ["preference-centers", "link", "--store", store, "--center", "main",
                               "--external-id", "u1", "--base-url", BASE_URL, "--expires-in-days", "2"])
    assert made.exit_code == 0, made.output
    url = made.stdout.strip().splitlines()[-1]
    assert url.startswith(f"{BASE_URL}/preferences/{center}?token=")
    now = datetime.now(UTC)  # the CLI's store reads the real clock
    # the CLI's workspace made the store's key; this one, of the same store, checks its link
    sid, expires = P.read_token(ws.link_keys.ring(), parse_qs(urlsplit(url).query)["token"][0], center, now)
    assert sid == token_sid(ws, "u1") and abs(expires - (now + timedelta(days=2))) < timedelta(minutes=1)
