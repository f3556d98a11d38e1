"""`ws.cleanup_push_profiles()`: the monthly check of `push_token_import`'s temporary anonymous
profiles deletes those left without a push token, with lineage, across compaction and merges."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from tests.helpers import (
    NOW,
    export,
    export_users,
    profile_count,
    service_id,
    track_ok,
)


def token(tok: str, app: str = "app") -> dict[str, str]:
    return {"app_id": app, "token": tok, "device_id": f"d-{tok}"}


def import_tokens(ws, *tokens: str) -> None:
    track_ok(ws, attributes=[{"push_token_import": True, "push_tokens": [token(t) for t in tokens]}])


def sids(ws) -> set[str]:
    return set(ws.table("profiles").select("service_id").collect()["service_id"])


def cleanup_rows(ws) -> pl.DataFrame:
    return ws.table("merges").filter(pl.col("kind") == "cleanup").collect()


def test_a_temporary_profile_whose_token_moved_away_is_deleted(ws):
    import_tokens(ws, "T1", "T2")  # profiles 0 and 1
    track_ok(ws, attributes=[{"external_id": "u1", "push_tokens": [token("T1")]}])  # the token moves to u1
    assert ws.cleanup_push_profiles() == 1
    assert sids(ws) == {service_id(1), service_id(2)}
    assert export(ws, ["service_id"], service_id=service_id(0)).body == {
        "message": "success", "users": [], "invalid_user_ids": [service_id(0)]}
    # u1 keeps the token; the other temporary profile keeps its own
    assert export_users(ws, ["external_id"], device_id="d-T1") == [{"external_id": "u1"}]
    assert export_users(ws, ["service_id"], device_id="d-T2") == [{"service_id": service_id(1)}]
    assert ws.cleanup_push_profiles() == 0  # nothing left to do: a second run changes nothing


def test_temporary_profiles_that_still_hold_a_token_are_kept(ws):
    import_tokens(ws, "T1", "T2")
    before = ws.store.head
    assert ws.cleanup_push_profiles() == 0
    assert profile_count(ws) == 2
    assert ws.store.head == before  # nothing deleted: no batch committed


def test_profiles_that_are_not_temporary_are_kept_without_tokens(ws):
    track_ok(ws, attributes=[{"external_id": "u1"}, {"email": "ann@example.com"},
                             {"user_alias": {"alias_name": "a", "alias_label": "crm"}, "_update_existing_only": False}])
    import_tokens(ws, "T1", "T2")  # profiles 3 and 4
    # profile 3 gains an email (an identifier) before its token moves away: a user's profile now
    track_ok(ws, attributes=[{"service_id": service_id(3), "email": "bo@example.com"},
                             {"external_id": "u1", "push_tokens": [token("T1"), token("T2")]}])
    assert ws.cleanup_push_profiles() == 1  # only profile 4
    assert sids(ws) == {service_id(n) for n in range(4)}


def test_a_merged_profile_is_gone_already_and_its_tokens_stay_with_the_survivor(ws):
    import_tokens(ws, "T1", "T2")  # profiles 0 and 1
    track_ok(ws, attributes=[{"service_id": service_id(0), "email": "p@example.com"},
                             {"external_id": "u2"}])  # profile 2
    r = ws.call("POST", "/users/merge", {"merge_updates": [{
        "identifier_to_merge": {"email": "p@example.com", "prioritization": ["unidentified"]},
        "identifier_to_keep": {"external_id": "u2"}}]})
    assert r.status == 202
    # T2 moves to u2 too: profile 1 is left without a token
    track_ok(ws, attributes=[{"external_id": "u2", "push_tokens": [token("T2")]}])
    assert ws.cleanup_push_profiles() == 1
    assert sids(ws) == {service_id(2)}
    assert [t["token"] for t in export_users(ws, ["push_tokens"], external_ids=["u2"])[0]["push_tokens"]] == ["T1", "T2"]
    assert cleanup_rows(ws)["source_sid"].to_list() == [service_id(1)]


def test_the_flag_and_the_deletion_survive_compaction(ws):
    import_tokens(ws, "T1", "T2", "T3")
    ws.compact()  # the flag is read back from compacted files
    track_ok(ws, attributes=[{"external_id": "u1", "push_tokens": [token("T1"), token("T3")]}])
    assert ws.cleanup_push_profiles() == 2
    ws.compact()
    assert sids(ws) == {service_id(1), service_id(3)}
    assert ws.cleanup_push_profiles() == 0
    # after compaction no file holds the deleted profiles' rows
    gone = [service_id(0), service_id(2)]
    for name in ("profiles", "push_tokens"):
        files = [f for f in (Path(ws.store.uri) / name).rglob("*.parquet") if "_delta_log" not in f.parts]
        assert files, name
        for f in files:
            assert pl.read_parquet(f).filter(pl.col("service_id").is_in(gone)).height == 0, f


def test_each_deleted_profile_gets_a_lineage_row(ws):
    import_tokens(ws, "T1", "T2")
    track_ok(ws, attributes=[{"external_id": "u1", "push_tokens": [token("T2"), token("T1")]}])
    assert ws.cleanup_push_profiles() == 2
    rows = cleanup_rows(ws).sort("item")
    assert rows.select("kind", "rule", "outcome", "source", "source_sid", "target_sid").to_dicts() == [
        {"kind": "cleanup", "rule": "push_token_cleanup", "outcome": "applied",
         "source": f'{{"service_id":"{sid}"}}', "source_sid": sid, "target_sid": None}
        for sid in sorted([service_id(0), service_id(1)])
    ]
    assert rows["batch"].n_unique() == 1 and rows["at"].to_list() == [NOW, NOW]
    assert ws.lineage(service_id(0), kind="service_id")["kind"].to_list() == ["cleanup"]


def test_many_profiles_in_one_pass(ws):
    import_tokens(ws, *[f"T{i}" for i in range(300)])
    for start in (0, 150):  # at most 75 objects a request
        track_ok(ws, attributes=[{"external_id": f"u{i}", "push_tokens": [token(f"T{i}")]}
                                 for i in range(start, start + 150, 3)])
    assert ws.cleanup_push_profiles() == 100
    assert profile_count(ws) == 300  # 200 temporary profiles and 100 users
