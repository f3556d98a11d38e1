"""A third-party client, unchanged, against the real server (issue 53): `edx-braze-client`
(PyPI, pinned in pyproject.toml), the Open edX platform's client of the hosted API. Its email
calls (`POST /email/status`, paging through `GET /email/unsubscribes`) and the user calls it
makes around them run against `served(ws)` with the client's own code and defaults."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from braze.client import BrazeClient
from braze.exceptions import BrazeBadRequestError, BrazeClientError, BrazeUnauthorizedError
from tests.test_api_server import served

from engagelake import Workspace

NOW = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)


def test_edx_braze_client_email_calls(tmp_path: Path) -> None:
    ws = Workspace.open(tmp_path / "s", clock=lambda: NOW)
    # the permissions of the calls below, as an Open edX operator would grant them
    key = ws.credentials.create_key("edx", ["users.track", "users.export.ids", "users.alias.new", "users.identify",
                                            "email.status", "email.unsubscribe"])
    with served(ws) as http:
        client = BrazeClient(api_key=key, api_url=str(http.base_url), app_id="edx-app")
        # users as the client makes them
        client.track_user(attributes=[{"external_id": "1001", "email": "ada@example.com"},
                                      {"external_id": "1002", "email": "bob@example.com"}])
        assert client.get_braze_external_id("ada@example.com") == "1001"
        assert client.get_braze_external_id("nobody@example.com") is None
        client.create_braze_alias(["cy@example.com"], "edx")  # an alias-only user holding cy@

        # one address, then several; one nobody holds yet is kept for the address
        assert client.unsubscribe_user_email("ada@example.com") == {"message": "success"}
        assert client.unsubscribe_user_email(["bob@example.com", "later@example.com"]) == {"message": "success"}
        assert [u.get("email_subscribe") for u in ws.export_users(["external_id", "email_subscribe"])] == [
            "unsubscribed", "unsubscribed", None]  # ada, bob; cy's alias user is left as it was

        # the client pages by 500, newest first, until a page holds fewer
        got = client.retrieve_unsubscribed_emails("2026-06-01", "2026-07-01")
        assert sorted(e["email"] for e in got) == ["ada@example.com", "bob@example.com", "later@example.com"]
        assert all(e["unsubscribed_at"] == "2026-06-15 12:00:00 +0000" for e in got)
        assert client.retrieve_unsubscribed_emails("2026-05-01", "2026-06-01") == []

        # more than a page: its loop asks for the next offset
        for start in range(0, 600, 50):
            client.unsubscribe_user_email([f"u{i:03}@example.com" for i in range(start, start + 50)])
        assert len(client.retrieve_unsubscribed_emails("2026-06-01", "2026-07-01")) == 603

        # errors reach the client as the status codes it maps to its exceptions
        with pytest.raises(BrazeBadRequestError, match="not an email address"):
            client.unsubscribe_user_email("not-an-email")
        with pytest.raises(BrazeClientError, match="start date must be before"):  # its own check
            client.retrieve_unsubscribed_emails("2026-07-01", "2026-06-01")
        with pytest.raises(BrazeUnauthorizedError, match="Invalid API key"):
            BrazeClient(api_key="wrong", api_url=str(http.base_url), app_id="x").unsubscribe_user_email("a@b.co")
