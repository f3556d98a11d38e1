"""Published current rows (`Workspace.publish`): plain Delta tables that readers outside the
library (`pl.read_delta`, delta-rs, Spark, DuckDB's `delta_scan`) read without any rule."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
from deltalake import DeltaTable
from tests.helpers import NOW, TRACK
from tests.test_out_of_core import USERS, _sorted_rows, changed_store

from engagelake import Workspace
from engagelake.store.publish import BATCH_KEY, MARKER


def test_every_published_table_holds_exactly_the_current_rows(tmp_path: Path) -> None:
    ws = changed_store(tmp_path)
    raw = pl.read_delta(str(tmp_path / "s" / "profiles"))
    assert raw.height > USERS  # the log itself holds every version: what outside readers met
    ws.credentials.create_key("reader", ["users.export.ids"])
    rows = ws.publish()
    out = tmp_path / "s" / "current"
    assert set(rows) == set(ws.table_names()) - {"api_keys", "scim_tokens"}  # credentials stay in the store
    assert not (out / "api_keys").exists()
    ws.publish(tables=["api_keys"])  # named: published
    assert pl.read_delta(str(out / "api_keys"))["name"].to_list() == ["reader"]
    ws.publish()  # not named again: the copy goes, rather than go stale
    assert not (out / "api_keys").exists()
    for name in rows:
        current = ws.table(name).collect()
        published = pl.read_delta(str(out / name))
        assert published.columns == current.columns, name
        assert _sorted_rows(published) == _sorted_rows(current), name
        as_arrow = pl.from_arrow(DeltaTable(str(out / name)).to_pyarrow_table())  # another reader
        assert isinstance(as_arrow, pl.DataFrame)
        assert _sorted_rows(as_arrow) == _sorted_rows(current), name
        assert rows[name] == current.height
    assert rows["profiles"] == USERS - 2  # u8 merged away, u3 deleted


def test_a_new_publication_replaces_the_last_and_names_its_batch(tmp_path: Path) -> None:
    ws = changed_store(tmp_path)
    out = tmp_path / "published"
    ws.publish(out, tables=["profiles", "attributes"])
    first = json.loads((out / MARKER).read_text())
    ws.call("POST", TRACK, {"attributes": [{"external_id": "new-user", "plan": "gold"}]})
    ws.call("POST", "/users/delete", {"external_ids": ["u4"]})
    ws.publish(out, tables=["profiles", "attributes"])
    marker = json.loads((out / MARKER).read_text())
    assert marker["batch"] > first["batch"] and set(marker["tables"]) == {"profiles", "attributes"}
    profiles = pl.read_delta(str(out / "profiles"))
    assert profiles.height == USERS - 2  # one user in, one deleted: replaced, not appended
    assert set(profiles["external_id"]) >= {"new-user"} and "u4" not in set(profiles["external_id"])
    assert marker["tables"]["profiles"]["rows"] == profiles.height
    table = DeltaTable(str(out / "profiles"))
    assert table.version() == marker["tables"]["profiles"]["version"]
    assert table.history(1)[0][BATCH_KEY] == str(marker["batch"])
    older = pl.read_delta(str(out / "profiles"), version=first["tables"]["profiles"]["version"])
    assert "u4" in set(older["external_id"])  # the last cut stays readable until vacuumed


def test_publishing_an_unknown_table_is_refused(tmp_path: Path) -> None:
    ws = Workspace.open(tmp_path / "s", clock=lambda: NOW)
    try:
        ws.publish(tables=["profile"])
    except KeyError as error:
        assert "profile" in str(error) and "profiles" in str(error)
    else:
        raise AssertionError("publish accepted an unknown table")
    assert not (tmp_path / "s" / "current").exists()
