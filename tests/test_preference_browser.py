"""A recipient's preference page in a real browser (issue 16): headless Chromium from Debian's
packages, driven by Playwright (pointed at that binary: nothing downloads a browser), against a
real `engagelake serve` on a free loopback port.

Without Chromium the tests are skipped, unless `ENGAGELAKE_REQUIRE_BROWSER=1` (CI sets it, after
`.ci/run` installs the `chromium` package): then they fail, so that CI never passes by skipping.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from engagelake import Workspace

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# as the machine's notes advise: no background traffic to a closed network, a fresh profile
CHROMIUM_ARGS = ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
GROUPS = {"news": "Newsletter", "offers": "Special offers"}
# where the screenshots stay after the run (test output, ignored by git)
SCREENSHOTS = Path(os.environ.get("ENGAGELAKE_SCREENSHOTS", Path(__file__).resolve().parents[1] / "test-output"))


def _browser_or_skip() -> None:
    if not os.path.exists(CHROMIUM):
        if os.environ.get("ENGAGELAKE_REQUIRE_BROWSER") == "1":
            pytest.fail("Chromium is not installed (apt-get install chromium): the browser tests must run here")
        pytest.skip("Chromium is not installed (apt-get install chromium)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A store with a default center and two users, served by `engagelake serve` (a subprocess)."""
    _browser_or_skip()
    store = tmp_path_factory.mktemp("browser") / "store"
    ws = Workspace.open(store)
    answer = ws.call("POST", "/users/track", {"attributes": [
        {"external_id": "ann", "email": "ann@example.com", "first_name": "Ann",
         "subscription_groups": [{"subscription_group_id": "news", "subscription_state": "subscribed"},
                                 {"subscription_group_id": "offers", "subscription_state": "unsubscribed"}]},
        {"external_id": "eve", "email": "eve@example.com", "first_name": "<img src=x onerror=alert(1)>"},
    ]})
    assert answer.status == 201, answer
    ws.preference_centers.create_default("main", GROUPS, title="Your emails from Example")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    cli = Path(sys.executable).with_name("engagelake")
    process = subprocess.Popen([str(cli), "serve", "--store", str(store), "--port", str(port),
                                "--public-url", base], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else "serve exited"
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        yield {"store": store, "base": base}
    finally:
        process.terminate()
        process.wait(30)


@pytest.fixture(scope="module")
def browser(server: dict[str, Any]) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def link(server: dict[str, Any], external_id: str, **options: Any) -> str:
    """A user's link, made by another process of the store, on the base `serve` recorded."""
    return Workspace.open(server["store"]).preference_centers.link("main", external_id, **options)


def eventually(read: Callable[[], Any], expected: Any, seconds: float = 20.0) -> Any:
    """What `read` gives once it equals `expected`, or its last answer after `seconds`.

    `serve` keeps a batch in its layer until the next flush (at most `--flush-seconds` after it,
    plus the flush): another process sees it only then (docs/operations.md)."""
    deadline = time.monotonic() + seconds
    while (found := read()) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def subscriptions(server: dict[str, Any], external_id: str) -> tuple[dict[str, str], str | None]:
    ws = Workspace.open(server["store"])
    sid = ws.table("external_ids").collect().filter(external_id=external_id)["service_id"][0]
    groups = dict(ws.table("subscriptions").collect().filter(service_id=sid).select("group_id", "state").rows())
    user = ws.call("POST", "/users/export/ids", {"external_ids": [external_id], "fields_to_export": ["email_subscribe"]})
    return groups, user.body["users"][0].get("email_subscribe")


def test_the_page_shows_the_states_and_saves_a_change(server: dict[str, Any], browser: Any) -> None:
    url = link(server, "ann")
    assert url.startswith(server["base"] + "/preferences/")
    page = browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    response = page.goto(url)
    assert response is not None and response.status == 200
    assert page.title() == "Your emails from Example"
    assert page.locator("h1").inner_text() == "Your emails from Example"
    news = page.get_by_label("Newsletter")
    offers = page.get_by_label("Special offers")
    everything = page.get_by_label("Unsubscribe from all emails")
    assert (news.is_checked(), offers.is_checked(), everything.is_checked()) == (True, False, False)
    # a person's change: news off, offers on, and unsubscribe from all
    news.uncheck()
    offers.check()
    everything.check()
    with page.expect_navigation():
        page.get_by_role("button", name="Save preferences").click()
    assert "Your preferences are saved." in page.content()
    assert "ann@example.com receives no more email from us." in page.locator(".box").inner_text()
    saved = ({"news": "unsubscribed", "offers": "subscribed"}, "unsubscribed")
    assert eventually(lambda: subscriptions(server, "ann"), saved) == saved
    log = Workspace.open(server["store"]).table("preference_center_submits").collect()
    assert log.height == 1
    assert log["fields"][0] == ('{"subscription_group:news":"unsubscribed","subscription_group:offers":"subscribed",'
                                '"email_global_state":"unsubscribed"}')
    # the same link again, from the confirmation page: the boxes show the saved states
    page.get_by_role("link", name="Change them again").click()
    page.wait_for_load_state()
    assert (news.is_checked(), offers.is_checked(), everything.is_checked()) == (False, True, True)
    everything.uncheck()
    with page.expect_navigation():
        page.get_by_role("button", name="Save preferences").click()
    saved = ({"news": "unsubscribed", "offers": "subscribed"}, "subscribed")
    assert eventually(lambda: subscriptions(server, "ann"), saved) == saved
    assert dialogs == []
    page.close()


def test_expired_and_forged_links_get_readable_pages(server: dict[str, Any], browser: Any) -> None:
    page = browser.new_page()
    expired = link(server, "ann", expires_in=timedelta(seconds=1))
    time.sleep(1.2)
    response = page.goto(expired)
    assert response is not None and response.status == 403
    assert page.locator("h1").inner_text() == "This link has expired or is not valid"
    assert "most recent email" in page.locator("main").inner_text()
    forged = link(server, "ann")[:-6] + "AAAAAA"
    response = page.goto(forged)
    assert response is not None and response.status == 403
    assert page.locator("h1").inner_text() == "This link has expired or is not valid"
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert response.headers["referrer-policy"] == "no-referrer"
    page.close()


def test_a_hostile_first_name_is_shown_as_text(server: dict[str, Any], browser: Any) -> None:
    page = browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(link(server, "eve"))
    page.wait_for_load_state("load")
    assert page.locator(".who").inner_text().startswith("Hi <img src=x onerror=alert(1)>, choose")
    assert page.locator(".who img").count() == 0
    assert page.locator("img").count() == 0
    assert (dialogs, errors) == ([], [])
    page.close()


@pytest.mark.parametrize(("width", "height"), [(1280, 800), (375, 740)], ids=["desktop", "phone"])
def test_the_default_page_fits_desktop_and_phone(server: dict[str, Any], browser: Any,
                                                 width: int, height: int) -> None:
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(link(server, "ann"))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / f"preference-center-{width}px.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    assert page.evaluate("document.documentElement.scrollWidth") <= width  # no horizontal scrolling
    button = page.get_by_role("button", name="Save preferences")
    button.scroll_into_view_if_needed()
    assert button.is_visible()
    box = button.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width
    page.close()
