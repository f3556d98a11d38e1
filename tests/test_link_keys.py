"""Link keys (issue 56): recipients' links are signed with a key ring kept outside the store's
data, not with the store's seed (which every `_ledger` row holds); keys rotate, links can be
revoked, a link's life is bounded, and a new store's folder is the owner's alone."""

from __future__ import annotations

import base64
import glob
import hashlib
import hmac
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import orjson
import polars as pl
import pytest
from tests.helpers import NOW, Clock, open_ws
from tests.test_api_server import served
from tests.test_preference_pages import BASE_URL, FORM, email_subscribe, path_of, seeded, token_sid
from typer.testing import CliRunner

from engagelake import Workspace
from engagelake.cli import app
from engagelake.errors import ConfigError
from engagelake.link_keys import KEY_FILE, LINK_KEYS_ENV, SECRETS_FOLDER, LinkKeys, LinkKeysMissing
from engagelake.resources import preference_centers as P
from engagelake.resources.preference_centers import PreferenceCenterError
from engagelake.store.layout import STORE_MODE_ENV

pytest_plugins = ["tests.s3_server"]

runner = CliRunner()


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def token_of(link: str) -> str:
    return parse_qs(urlsplit(link).query)["token"][0]


def key_id_of(link: str) -> str:
    return P.unb64(token_of(link).split(".")[0]).decode().split("|")[0]


def opens(ws: Workspace, link: str) -> int:
    """The status a recipient's GET of `link` gets through `call`."""
    parts = urlsplit(link)
    return ws.call("GET", parts.path, query={"token": token_of(link)}).status


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- the seed signs nothing -------------------------------------------------------------------
def test_a_token_forged_from_the_seed_in_the_stores_files_is_refused(tmp_path: Path) -> None:
    """The attack of the issue: the seed read off the ledger's Parquet files, a 10-year token
    signed with the key derived from it (the scheme before link keys), in the old format and in
    the new one: the page and its form refuse both, over HTTP and through `call`."""
    ws = open_ws(tmp_path)
    center = seeded(ws)
    good = ws.preference_centers.link("main", "u1", base_url=BASE_URL)  # the store's ring exists now
    seed = pl.read_parquet(glob.glob(str(tmp_path / "store" / "_ledger" / "*.parquet")))["seed"][0]
    assert seed == ws.store.head.seed
    old_key = hmac.new(seed.encode(), b"engagelake preference center submit token", hashlib.sha256).digest()
    sid, later = token_sid(ws, "u1"), int((NOW + timedelta(days=3650)).timestamp())
    old = f"{center}|{sid}|{later}".encode()
    new = f"{key_id_of(good)}|{center}|{sid}|{int(NOW.timestamp() * 1000)}|{later}".encode()
    forged = [b64(old) + "." + b64(hmac.new(old_key, old, hashlib.sha256).digest()),
              b64(new) + "." + b64(hmac.new(old_key, P.TOKEN_DOMAIN + new, hashlib.sha256).digest()),
              b64(new) + "." + b64(hmac.new(old_key, new, hashlib.sha256).digest())]
    with served(ws) as client:
        for token in forged:
            page = client.get(f"/preferences/{center}", params={"token": token})
            posted = client.post(f"/preferences/{center}", params={"token": token},
                                 content="email_global_state=unsubscribed", headers=FORM)
            submit = client.post(f"{P.BASE}/{center}/submit", params={"token": token},
                                 json={"email_global_state": "unsubscribed"})
            assert (page.status_code, posted.status_code, submit.status_code) == (403, 403, 403), token
            assert ws.call("GET", f"/preferences/{center}", query={"token": token}).body == {"message": P.ERR_TOKEN}
        assert client.get(path_of(good)).status_code == 200
    assert email_subscribe(ws, "u1") is None  # nothing changed
    assert ws.table("preference_center_submits").collect().height == 0


# --- where the keys are ---------------------------------------------------------------------------
def test_the_key_file_is_the_owners_alone_in_a_store_folder_that_is_too(tmp_path: Path) -> None:
    ws = Workspace.open(tmp_path / "store", clock=lambda: NOW)  # created here, not copied
    assert mode_of(tmp_path / "store") == 0o700
    secrets = tmp_path / "store" / SECRETS_FOLDER
    assert not secrets.exists()  # made with the first link, not before
    seeded(ws)
    ws.preference_centers.link("main", "u1", base_url=BASE_URL)
    assert ws.link_keys.path == secrets / KEY_FILE
    assert mode_of(secrets) == 0o700 and mode_of(secrets / KEY_FILE) == 0o600
    ring = orjson.loads((secrets / KEY_FILE).read_bytes())
    assert len(ring["keys"]) == 1 and len(base64.b64decode(ring["keys"][0]["secret"])) == 32
    assert ring["max_lifetime_seconds"] == 90 * 86400 and ring["revoked_before"] is None
    # the secret is in no table's file (the tables' readers never need it)
    secret = ring["keys"][0]["secret"].encode()
    assert not [p for p in (tmp_path / "store").rglob("*") if p.is_file() and SECRETS_FOLDER not in p.parts
                and secret in p.read_bytes()]


def test_a_store_folder_mode_is_a_setting_and_an_existing_store_keeps_its_own(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    Workspace.create(tmp_path / "shared", mode=0o750)
    assert mode_of(tmp_path / "shared") == 0o750
    monkeypatch.setenv(STORE_MODE_ENV, "0755")
    Workspace.open(tmp_path / "public")
    assert mode_of(tmp_path / "public") == 0o755
    (tmp_path / "empty").mkdir(mode=0o755)  # an empty folder made a store: the setting's mode too
    monkeypatch.delenv(STORE_MODE_ENV)
    Workspace.open(tmp_path / "empty")
    assert mode_of(tmp_path / "empty") == 0o700
    os.chmod(tmp_path / "shared", 0o755)  # an existing store is never chmod-ed
    Workspace.open(tmp_path / "shared")
    assert mode_of(tmp_path / "shared") == 0o755
    for bad in ("0644", "rwx", "0o1777"):
        monkeypatch.setenv(STORE_MODE_ENV, bad)
        with pytest.raises(ConfigError, match=STORE_MODE_ENV):
            Workspace.open(tmp_path / f"bad-{bad}")
        assert not (tmp_path / f"bad-{bad}").exists()


def test_another_workspace_of_the_store_checks_its_links_and_sees_its_rotations(tmp_path: Path) -> None:
    """Every process of a store finds the same key file: a second `open` (as `engagelake serve`
    beside the CLI) checks the links the first made, and a rotation made by one counts at the
    other's next request, without a reopen."""
    ws = open_ws(tmp_path)
    center = seeded(ws)
    first = ws.preference_centers.link("main", "u1", base_url=BASE_URL)
    other = Workspace.open(tmp_path / "store", clock=lambda: NOW)
    assert opens(other, first) == 200
    rotated = other.link_keys.rotate(retire_others=True)
    assert opens(ws, first) == 403  # this workspace read the file again
    second = ws.preference_centers.link("main", "u1", base_url=BASE_URL)
    assert key_id_of(second) == rotated.id and opens(other, second) == 200
    with served(other) as client:  # the server's pre-queue check reads the same file
        assert client.get(path_of(second)).status_code == 200
        assert client.get(path_of(first)).status_code == 403
    # a process of its own (the CLI, a flow): it finds the file by the store's path alone
    code = ("import sys; from datetime import datetime; from engagelake import Workspace\n"
            "now = datetime.fromisoformat(sys.argv[4])\n"
            "ws = Workspace.open(sys.argv[1], create=False, clock=lambda: now)\n"
            "print([ws.call('GET', sys.argv[2], query={'token': t}).status for t in sys.argv[3].split()])")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "store"), f"/preferences/{center}",
                          f"{token_of(second)} {token_of(first)}", NOW.isoformat()],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[200, 403]"


def test_an_explicit_key_file_is_shared_by_stores_and_must_be_local(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    keys = tmp_path / "keys.json"
    a = open_ws(tmp_path, "a")
    monkeypatch.setenv(LINK_KEYS_ENV, str(keys))
    b = open_ws(tmp_path, "b")
    explicit = Workspace.open(tmp_path / "c", link_keys=keys, clock=lambda: NOW)
    assert a.link_keys.path == tmp_path / "a" / SECRETS_FOLDER / KEY_FILE  # opened before the setting
    assert b.link_keys.path == explicit.link_keys.path == keys
    seeded(b)
    b.preference_centers.link("main", "u1", base_url=BASE_URL)
    assert mode_of(keys) == 0o600 and not (tmp_path / "b" / SECRETS_FOLDER).exists()
    with pytest.raises(ConfigError, match="must be a local file"):
        Workspace.open(tmp_path / "d", link_keys="s3://bucket/keys.json")
    assert not (tmp_path / "d").exists()


def test_a_store_on_object_storage_without_a_key_file_says_what_to_set(tmp_path: Path) -> None:
    keys = LinkKeys.of_store("s3://bucket/store")
    assert keys.path is None
    for use in (keys.ring, lambda: keys.signing_key(NOW), keys.rotate):
        with pytest.raises(LinkKeysMissing, match=f"set {LINK_KEYS_ENV}") as raised:
            use()
        assert "object storage" in str(raised.value) and "link_keys=PATH" in str(raised.value)
    assert LinkKeys.of_store("s3://bucket/store", tmp_path / "k.json").path == tmp_path / "k.json"
    # what the routes answer then (a local store given the same ring): a 500 that says it
    ws = open_ws(tmp_path)
    center = seeded(ws)
    ws.link_keys = keys
    made = ws.call("GET", f"{P.BASE}/{center}/link", query={"external_id": "u1", "base_url": BASE_URL})
    assert made.status == 500 and f"set {LINK_KEYS_ENV}" in made.body["message"]
    opened = ws.call("GET", f"/preferences/{center}", query={"token": "x.y"})
    assert opened.status == 500 and f"set {LINK_KEYS_ENV}" in opened.body["message"]
    with pytest.raises(PreferenceCenterError, match=LINK_KEYS_ENV):
        ws.preference_centers.link("main", "u1", base_url=BASE_URL)
    assert P.refuse_link(keys, center, "x.y", NOW) == (500, opened.body["message"])


@pytest.mark.slow  # a store on moto: seconds
def test_links_of_a_store_on_s3_need_a_key_file(s3: Callable[[], str], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    uri = s3()
    ws = Workspace.open(uri, clock=lambda: NOW)
    center = seeded(ws)
    made = ws.call("GET", f"{P.BASE}/{center}/link", query={"external_id": "u1", "base_url": BASE_URL})
    assert made.status == 500 and f"set {LINK_KEYS_ENV}" in made.body["message"]
    monkeypatch.setenv(LINK_KEYS_ENV, str(tmp_path / "keys.json"))
    keyed = Workspace.open(uri, clock=lambda: NOW)
    link = keyed.preference_centers.link("main", "u1", base_url=BASE_URL)
    assert opens(keyed, link) == 200 and mode_of(tmp_path / "keys.json") == 0o600


def test_a_damaged_key_file_is_named(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    center = seeded(ws)
    link = ws.preference_centers.link("main", "u1", base_url=BASE_URL)
    assert ws.link_keys.path is not None
    ws.link_keys.path.write_text("{not json")
    r = ws.call("GET", urlsplit(link).path, query={"token": token_of(link)})
    assert r.status == 500 and "link keys at" in r.body["message"] and "damaged" in r.body["message"]
    assert P.refuse_link(ws.link_keys, center, token_of(link), NOW) is not None


# --- rotation, retirement, revocation, lifetime ---------------------------------------------------
def test_rotation_signs_new_links_with_the_new_key_and_keeps_old_links_working(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    seeded(ws)
    old = ws.preference_centers.link("main", "u1", base_url=BASE_URL)
    first = ws.link_keys.ring().signing
    assert first is not None and key_id_of(old) == first.id
    new_key = ws.link_keys.rotate()
    new = ws.preference_centers.link("main", "u1", base_url=BASE_URL)
    assert key_id_of(new) == new_key.id != first.id and new != old
    assert opens(ws, old) == 200 and opens(ws, new) == 200
    # retiring the old key ends its links; the key that signs cannot be retired
    with pytest.raises(ConfigError, match="rotate first"):
        ws.link_keys.retire(new_key.id)
    with pytest.raises(ConfigError, match="no link key 'nope'"):
        ws.link_keys.retire("nope")
    ws.link_keys.retire(first.id)
    refused = ws.call("GET", urlsplit(old).path, query={"token": token_of(old)})
    assert (refused.status, refused.body) == (403, {"message": P.ERR_TOKEN_REVOKED})
    assert opens(ws, new) == 200


def test_revocation_refuses_every_link_issued_before_it(tmp_path: Path) -> None:
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    center = seeded(ws)
    before = [ws.preference_centers.link("main", u, base_url=BASE_URL) for u in ("u1", "u2")]
    staff_page = ws.call("GET", f"{P.BASE}/{center}/page", query={"external_id": "u1"}).body
    found = re.search(r'action="([^"]+)"', staff_page)
    assert found is not None
    submit = found.group(1)
    clock.advance(seconds=1)
    epoch = ws.link_keys.revoke()  # the workspace's clock
    assert epoch == clock.now
    for link in before:
        r = ws.call("GET", urlsplit(link).path, query={"token": token_of(link)})
        assert (r.status, r.body) == (403, {"message": P.ERR_TOKEN_REVOKED})
    r = ws.call("POST", submit, {"email_global_state": "unsubscribed"})
    assert (r.status, r.body) == (403, {"message": P.ERR_TOKEN_REVOKED})
    after = ws.preference_centers.link("main", "u1", base_url=BASE_URL)
    assert opens(ws, after) == 200 and key_id_of(after) == key_id_of(before[0])  # the keys stay
    with served(ws) as client:  # refused before it is queued, as a page
        batches = client.writer.batches  # type: ignore[attr-defined]
        page = client.get(path_of(before[0]))
        assert page.status_code == 403 and "revoked" in page.text
        assert client.writer.batches == batches  # type: ignore[attr-defined]
    assert email_subscribe(ws, "u1") is None


def test_a_links_life_is_bounded(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    center = seeded(ws)
    route = f"{P.BASE}/{center}/link"
    query = {"external_id": "u1", "base_url": BASE_URL}
    most = 90 * 86400
    assert ws.call("GET", route, query={**query, "expires_in": str(most)}).status == 200
    too_long = ws.call("GET", route, query={**query, "expires_in": str(most + 1)})
    assert (too_long.status, too_long.body) == (400, {"message": P.ERR_LINK_TOO_LONG.format(
        seconds=most + 1, most=most, days=90)})
    with pytest.raises(PreferenceCenterError, match="longer than this store's longest link life"):
        ws.preference_centers.link("main", "u1", base_url=BASE_URL, expires_in=timedelta(days=3650))
    month = ws.preference_centers.link("main", "u1", base_url=BASE_URL)  # 30 days by default
    # a shorter maximum: longer links are refused when made, and when used (made before it too)
    ws.link_keys.set_max_lifetime(timedelta(days=7))
    r = ws.call("GET", urlsplit(month).path, query={"token": token_of(month)})
    assert (r.status, r.body) == (403, {"message": P.ERR_TOKEN_LIFETIME.format(days=7)})
    week = ws.call("GET", route, query=query).body  # the default shrinks to the maximum
    assert week["expires_at"] == P.format_time(NOW + timedelta(days=7)) and opens(ws, week["url"]) == 200
    staff_page = ws.call("GET", f"{P.BASE}/{center}/page", query={"external_id": "u1"})
    assert staff_page.status == 200
    for bad in (timedelta(minutes=5), timedelta(days=400)):
        with pytest.raises(ConfigError, match="longest link life"):
            ws.link_keys.set_max_lifetime(bad)


# --- the CLI ------------------------------------------------------------------------------------
def test_the_link_keys_commands(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    seeded(ws)
    store = str(tmp_path / "store")
    listed = runner.invoke(app, ["link-keys", "list", "--store", store])
    assert listed.exit_code == 0, listed.output
    assert "no key yet" in listed.stdout and "no link was revoked" in listed.stdout
    old = ws.preference_centers.link("main", "u1", base_url=BASE_URL, expires_in=timedelta(days=1))
    rotated = runner.invoke(app, ["link-keys", "rotate", "--store", store])
    assert rotated.exit_code == 0, rotated.output
    new_id = rotated.stdout.strip().splitlines()[-1]
    assert new_id == ws.link_keys.ring().keys[-1].id != key_id_of(old)
    listed = runner.invoke(app, ["link-keys", "list", "--store", store], env={"COLUMNS": "200"})
    assert listed.exit_code == 0 and "signs and checks" in listed.stdout and key_id_of(old) in listed.stdout
    assert "90 days at most" in listed.stdout
    assert base64.b64encode(ws.link_keys.ring().keys[0].secret).decode() not in listed.stdout
    refused = runner.invoke(app, ["link-keys", "retire", new_id, "--store", store])
    assert refused.exit_code == 1 and "rotate first" in refused.stderr
    assert runner.invoke(app, ["link-keys", "max-lifetime", "30", "--store", store]).exit_code == 0
    assert ws.link_keys.ring().max_lifetime == timedelta(days=30)
    bad = runner.invoke(app, ["link-keys", "max-lifetime", "400", "--store", store])
    assert bad.exit_code == 1 and "366 days" in bad.stderr
    assert runner.invoke(app, ["link-keys", "retire", key_id_of(old), "--store", store]).exit_code == 0
    assert opens(ws, old) == 403
    revoked = runner.invoke(app, ["link-keys", "revoke", "--store", store])
    assert revoked.exit_code == 0 and "is refused from now on" in revoked.stdout
    assert ws.link_keys.ring().revoked_before is not None
    again = runner.invoke(app, ["link-keys", "rotate", "--retire-others", "--store", store])
    assert again.exit_code == 0 and "every older key is retired" in again.stdout
    assert [k.retired is None for k in ws.link_keys.ring().keys] == [False, False, True]
    missing = runner.invoke(app, ["link-keys", "list", "--store", str(tmp_path / "nowhere")])
    assert missing.exit_code == 1 and "no store at" in missing.stderr
    # a key file others may read is flagged
    assert ws.link_keys.path is not None
    ws.link_keys.path.chmod(0o644)
    flagged = runner.invoke(app, ["link-keys", "list", "--store", store], env={"COLUMNS": "200"})
    assert "can be read by other users" in flagged.stdout
