"""Deprecated external IDs resolve like the primary one (docs/identity.md, "Deprecated external IDs"), and a
language set through the API is marked explicit (section 3).

Renaming is issue 3's endpoint; here a deprecated ID is written through the store layer, the
way the rename rule will write it, so that track and export are proven ready for it."""

from datetime import UTC, datetime
from pathlib import Path

import polars as pl
from tests.helpers import export_one, track

from engagelake import Workspace
from engagelake.rules.state import Changes

NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)


def deprecate(ws: Workspace, old: str, current: str) -> None:
    """Record `old` as a deprecated external ID of the user whose primary ID is `current`."""
    sid = ws.table("external_ids").collect().filter(pl.col("external_id") == current)["service_id"].item()
    changes = Changes()
    changes.upsert("external_ids", pl.DataFrame({"external_id": [old], "service_id": [sid], "primary": [False]}))
    state = ws.state
    ws.store.commit(changes, key=None, responses=[], next_profile_n=state.next_profile_n,
                    next_update_seq=state.next_update_seq)


def test_a_deprecated_external_id_updates_and_exports_the_same_user(tmp_path: Path) -> None:
    ws = Workspace.open(tmp_path / "s", clock=lambda: NOW, seed="d")
    track(ws, attributes=[{"external_id": "new-id", "plan": "gold"}])
    deprecate(ws, "old-id", "new-id")
    ws = Workspace.open(tmp_path / "s", clock=lambda: NOW)  # the commit is durable
    r = track(ws, attributes=[{"external_id": "old-id", "visits": {"inc": 2}}],
              events=[{"external_id": "old-id", "name": "e", "time": "2026-11-20T00:00:00Z"}])
    assert r.status == 201 and "errors" not in r.body
    assert ws.table("profiles").collect().height == 1  # no profile was created for the old ID
    user = export_one(ws, "new-id", ["external_id", "custom_attributes", "custom_events"])
    assert user is not None
    assert user["external_id"] == "new-id"
    assert user["custom_attributes"] == {"plan": "gold", "visits": 2}
    assert [e["count"] for e in user["custom_events"]] == [1]
    by_old = ws.call("POST", "/users/export/ids", {"external_ids": ["old-id"], "fields_to_export": ["external_id"]})
    assert by_old.body == {"message": "success", "users": [{"external_id": "new-id"}]}


def test_language_set_through_the_api_is_marked_explicit(tmp_path: Path) -> None:
    ws = Workspace.open(tmp_path / "s", clock=lambda: NOW, seed="d")
    track(ws, attributes=[{"external_id": "a", "language": "FR"}, {"external_id": "b", "first_name": "B"}])
    rows = ws.table("profiles").collect().sort("external_id").select("external_id", "language", "language_explicit")
    assert rows.to_dicts() == [
        {"external_id": "a", "language": "fr", "language_explicit": True},
        {"external_id": "b", "language": None, "language_explicit": False},
    ]
    track(ws, attributes=[{"external_id": "a", "language": None}])
    row = ws.table("profiles").collect().filter(pl.col("external_id") == "a").row(0, named=True)
    assert (row["language"], row["language_explicit"]) == (None, False)
