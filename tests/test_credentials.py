"""API keys and SCIM tokens: created, checked, listed and revoked through the workspace and the
CLI (`engagelake keys`, `engagelake scim-tokens`), and the rate limiter's windows."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers import open_ws
from typer.testing import CliRunner

from engagelake.api.limits import Limit, RateLimiter, parse_limit
from engagelake.cli import app
from engagelake.errors import ConfigError
from engagelake.permissions import ALL, KEY_PERMISSIONS, check_permissions

runner = CliRunner()


def test_a_key_is_found_by_its_id_and_checked_by_its_secret(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    key = ws.credentials.create_key("ingest", ["users.track", "users.export.ids"])
    prefix, key_id, secret = key.split("_", 2)
    assert prefix == "elk" and len(secret) >= 43  # 256 bits, URL-safe base64
    ring = ws.credentials.key_ring()
    found = ring.api_key(key)
    assert found is not None and found.name == "ingest"
    assert found.allows("users.track") and not found.allows("users.merge")
    for wrong in (f"elk_{key_id}_{secret[:-1]}x", f"elk_{key_id}_", f"elk_other_{secret}", secret, "", "elk__x",
                  f"els_{key_id}_{secret}"):
        assert ring.api_key(wrong) is None, wrong
    assert ring.scim_token(key) is None


def test_all_grants_every_permission(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    assert ws.credentials.key_ring().api_key("elk_x_y") is None  # a store without keys
    everything = ws.credentials.create_key("admin", ["all"])
    found = ws.credentials.key_ring().api_key(everything)
    assert found is not None and all(found.allows(p) for p in KEY_PERMISSIONS)


@pytest.mark.parametrize(("names", "message"), [
    ([], "a key needs at least one permission"),
    ([" ", ""], "a key needs at least one permission"),
    (["users.track", "users.fly"], "unknown permission 'users.fly'; known: all, "),
    (["all", "users.track"], "'all' already holds every permission: give it alone"),
])
def test_permissions_are_checked(names: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_permissions(names)


def test_permissions_are_sorted_once_each() -> None:
    assert check_permissions(["users.track", " users.delete", "users.track"]) == ["users.delete", "users.track"]
    assert check_permissions(["all"]) == [ALL]


def test_names_of_active_keys_are_unique(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    ws.credentials.create_key("ingest", ["users.track"])
    with pytest.raises(ConfigError, match="an active key is already named 'ingest'"):
        ws.credentials.create_key("ingest", ["users.merge"])
    ws.credentials.revoke_key("ingest")
    with pytest.raises(ConfigError, match="no active key named 'ingest'"):
        ws.credentials.revoke_key("ingest")
    ws.credentials.create_key("ingest", ["users.merge"])
    assert [k["permissions"] for k in ws.credentials.list_keys() if k["revoked_at"] is None] == [["users.merge"]]


def test_a_scim_token_is_bound_to_its_origin_until_revoked(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    token = ws.credentials.create_scim_token("https://idp.example.com")
    assert ws.credentials.key_ring().scim_token(token) == "https://idp.example.com"
    token_id = token.split("_", 2)[1]
    assert ws.credentials.revoke_scim_token(token_id) == 1
    assert ws.credentials.key_ring().scim_token(token) is None
    assert [t["token_id"] for t in ws.credentials.list_scim_tokens()] == [token_id]
    with pytest.raises(ConfigError, match="needs the origin"):
        ws.credentials.create_scim_token(" ")


def test_keys_commands(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    created = runner.invoke(app, ["keys", "create", "--store", store, "--name", "ingest", "--permissions",
                                  "users.track,users.export.ids"])
    assert created.exit_code == 0, created.output
    key = created.stdout.strip().splitlines()[-1]
    assert key.startswith("elk_")
    assert open_ws(tmp_path).credentials.key_ring().api_key(key) is not None
    listed = runner.invoke(app, ["keys", "list", "--store", store])
    assert listed.exit_code == 0 and "ingest" in listed.stdout and key.split("_", 2)[2] not in listed.stdout
    bad = runner.invoke(app, ["keys", "create", "--store", store, "--name", "x", "--permissions", "users.fly"])
    assert bad.exit_code == 1 and bad.stderr.startswith("error: unknown permission 'users.fly'")
    revoked = runner.invoke(app, ["keys", "revoke", "ingest", "--store", store])
    assert revoked.exit_code == 0 and "revoked API key 'ingest'" in revoked.stdout
    again = runner.invoke(app, ["keys", "revoke", "ingest", "--store", store])
    assert again.exit_code == 1 and "no active key named 'ingest'" in again.stderr
    token = runner.invoke(app, ["scim-tokens", "create", "--store", store, "--origin", "https://idp.example.com"])
    assert token.exit_code == 0 and token.stdout.strip().splitlines()[-1].startswith("els_")
    for command in (["serve", "--help"], ["keys", "--help"], ["keys", "create", "--help"], ["scim-tokens", "--help"]):
        assert runner.invoke(app, command).exit_code == 0


def test_serve_refuses_bad_limits(tmp_path: Path) -> None:
    result = runner.invoke(app, ["serve", "--store", str(tmp_path / "s"), "--rate-limit", "track=fast"])
    assert result.exit_code == 1 and "expected NAME=REQUESTS/SECONDS" in result.stderr
    result = runner.invoke(app, ["serve", "--store", str(tmp_path / "s"), "--rate-limits", "maybe"])
    assert result.exit_code == 1 and "--rate-limits takes on or off" in result.stderr
    # a key is held to the endpoints' limits only: per address and per link are not a key's
    result = runner.invoke(app, ["serve", "--store", str(tmp_path / "s"), "--key-limit", "anonymous=5/60"])
    assert result.exit_code == 1 and "--key-limit: expected NAME=REQUESTS/SECONDS with NAME one of track," \
        in result.stderr and "anonymous" not in result.stderr.split("one of")[1].split("got")[0]


def test_rate_limiter_windows() -> None:
    now = [1_000_000.5]
    limiter = RateLimiter({"export": Limit(2, 60)}, lambda: now[0])
    assert limiter.hit("export") == (True, {"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "1",
                                            "X-RateLimit-Reset": "1000020"})
    assert limiter.hit("export")[0] and not limiter.hit("export")[0]
    assert limiter.hit("export")[1]["X-RateLimit-Remaining"] == "0"
    now[0] = 1_000_020.0  # the next window starts on the minute
    assert limiter.hit("export") == (True, {"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "1",
                                            "X-RateLimit-Reset": "1000080"})
    assert parse_limit("export=500/60") == ("export", Limit(500, 60))
    for bad in ("export", "nope=1/1", "export=1/0", "export=x/60"):
        with pytest.raises(ValueError, match="expected NAME=REQUESTS/SECONDS"):
            parse_limit(bad)
