"""`Workspace.forget_check` and `engagelake forget-check` (store/forget.py): every copy of a
user's data left anywhere in a store folder, on real stores, before and after a hard delete
(`/users/delete` then `compact`)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from tests.helpers import ALL_FIELDS, EXPORT, TRACK, copy_of, event, open_ws, post, track_ok
from typer.testing import CliRunner

from engagelake import NotAStore, Workspace
from engagelake.cli import app
from engagelake.store.forget import (
    CHECKPOINT,
    DATA,
    DELTA_LOG,
    FOOTER_CACHE,
    OLD_DATA,
    OTHER,
    STATISTICS,
    ForgetReport,
    Retained,
    find_copies,
)

runner = CliRunner()
DELETE = "/users/delete"
VICTIM = {"external_id": "victim-77", "email": "victim77@example.com", "first_name": "Vicky",
          "favourite_colour": "ultramarine-blue"}
KEEPER = {"external_id": "keeper-5", "email": "keeper5@example.com", "first_name": "Kenneth",
          "favourite_colour": "burnt-sienna"}
VICTIM_VALUES = {"victim-77", "victim77@example.com", "Vicky", "ultramarine-blue", "bought-umbrella"}
KEEPER_VALUES = {"keeper-5", "keeper5@example.com", "Kenneth", "burnt-sienna", "watered-plants"}


def places(report: ForgetReport, value: str) -> set[tuple[str, str | None, str | None]]:
    """(place, table, column) of every occurrence of `value`."""
    return {(o.place, o.table, o.column) for o in report.occurrences if o.value == value}


def tables(report: ForgetReport) -> set[str | None]:
    return {o.table for o in report.occurrences}


def files_of(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def delete(ws: Workspace, external_id: str) -> None:
    r = ws.call("POST", DELETE, {"external_ids": [external_id]})
    assert (r.status, r.body) == (200, {"deleted": 1, "message": "success"})


@pytest.fixture
def two(tmp_path: Path) -> Workspace:
    """The victim and a user who stays, each with an email, a first name, a custom attribute
    and an event (a copy of a store built once)."""
    return copy_of(tmp_path, _two)


def _two(ws: Workspace) -> None:
    track_ok(ws, attributes=[VICTIM, KEEPER], events=[event("bought-umbrella", external_id="victim-77"),
                                                      event("watered-plants", external_id="keeper-5")])


# --- while the user exists -------------------------------------------------------------------------


def test_finds_the_users_values_in_data_logs_and_statistics(two: Workspace) -> None:
    report = two.forget_check(external_id="victim-77")

    assert report.profiles == 1
    assert set(report.values) == VICTIM_VALUES  # strings of the export, not the service_id nor times
    email = places(report, "victim77@example.com")
    assert {(DATA, "profiles", "email"), (STATISTICS, "profiles", "email"), (DELTA_LOG, "profiles", "email"),
            (DATA, "_index_profiles_email", "email")} <= email
    assert (DATA, "attributes", "value") in places(report, "ultramarine-blue")
    assert (DATA, "events", "name") in places(report, "bought-umbrella")
    assert (DATA, "external_ids", "external_id") in places(report, "victim-77")
    assert report.found and report.retained == [] and report.unreadable == []


def test_after_compaction_the_footer_caches_and_checkpoints_hold_them_too(two: Workspace) -> None:
    two.compact()  # the user still exists: compaction writes checkpoints and footer caches

    email = places(two.forget_check(email="victim77@example.com"), "victim77@example.com")

    assert (FOOTER_CACHE, "_index_profiles_email", "x_ends") in email  # the email index's fences: its max
    assert {(CHECKPOINT, "profiles", "email"), (DATA, "profiles", "email")} <= email


def test_checking_writes_nothing(two: Workspace, tmp_path: Path) -> None:
    before = files_of(tmp_path / "store")

    two.forget_check(external_id="victim-77")

    assert files_of(tmp_path / "store") == before  # the export it runs commits no ledger row


# --- after a hard delete -----------------------------------------------------------------------------


def test_after_delete_and_compact_nothing_is_found_and_no_old_version_remains(two: Workspace) -> None:
    two.store.background_merges = False
    two.store.merge_trigger = 1  # run merges leave replaced files on disk until compaction
    for name in ("Vic", "Victoria", "Vicky"):
        track_ok(two, attributes=[{"external_id": "victim-77", "first_name": name}])
    before = two.forget_check(external_id="victim-77")
    delete(two, "victim-77")

    deleted = two.forget_check(external_id="victim-77", values=before.values)
    assert deleted.profiles == 0
    assert {DATA, OLD_DATA, DELTA_LOG} <= {o.place for o in deleted.occurrences}  # a delete alone is soft
    assert any(kept.table == "profiles" and kept.old_files for kept in deleted.retained)

    two.compact()
    after = two.forget_check(external_id="victim-77", values=before.values)

    assert after.occurrences == []
    assert after.retained == [] and after.unreadable == [] and not after.found
    assert set(after.values) == VICTIM_VALUES


def test_another_users_data_is_neither_searched_nor_touched(two: Workspace) -> None:
    report = two.forget_check(external_id="victim-77")
    assert not set(report.values) & KEEPER_VALUES
    delete(two, "victim-77")
    two.compact()

    keeper = two.forget_check(external_id="keeper-5")

    assert set(keeper.values) == KEEPER_VALUES
    email = places(keeper, "keeper5@example.com")
    assert {(DATA, "profiles", "email"), (DATA, "_index_profiles_email", "email")} <= email
    assert two.export_users(["external_id", "email", "first_name"]) == [
        {"external_id": "keeper-5", "email": "keeper5@example.com", "first_name": "Kenneth"}]


# --- copies left on current main -----------------------------------------------------------------


def test_the_issues_reproduction_finds_nothing_after_delete_and_compact(two: Workspace) -> None:
    """Issue 15's reproduction: a keyed export of the victim, a keyed export of the keeper, then
    delete and compact. Every file decoded: no value of the victim anywhere; the keeper's data
    and stored responses intact."""
    victim = [post(EXPORT, {"external_ids": ["victim-77"], "fields_to_export": ALL_FIELDS})]
    keeper = [post(EXPORT, {"external_ids": ["keeper-5"], "fields_to_export": ALL_FIELDS})]
    assert two.apply(victim, idempotency_key="k1")[0].body["users"][0]["email"] == "victim77@example.com"
    kept = two.apply(keeper, idempotency_key="k2")
    values = sorted(two.forget_check(external_id="victim-77").values)
    delete(two, "victim-77")
    two.compact()

    report = two.forget_check(external_id="victim-77", values=values)

    assert not report.found, report.occurrences
    assert not report.retained
    assert two.apply(keeper, idempotency_key="k2") == kept
    still = two.forget_check(external_id="keeper-5")
    assert {(DATA, "_ledger", "responses"), (DATA, "profiles", "email")} <= places(still, "keeper5@example.com")


def test_a_keyless_batchs_export_is_never_stored(tmp_path: Path) -> None:
    """A batch without a key stores no responses: nothing can replay them."""
    ws = open_ws(tmp_path)
    ws.apply([post(TRACK, {"attributes": [{"external_id": "victim-77", "email": "victim77@example.com"}]}),
              post(EXPORT, {"external_ids": ["victim-77"], "fields_to_export": ["email"]})])
    assert (DATA, "_ledger", "responses") not in places(
        ws.forget_check(external_id="victim-77", values=["victim77@example.com"]), "victim77@example.com")
    delete(ws, "victim-77")
    ws.compact()

    assert not ws.forget_check(external_id="victim-77", values=["victim77@example.com"]).found


def test_an_unresolved_identifier_of_a_deleted_user_leaves_the_lineage(two: Workspace) -> None:
    """A delete retried after the user went writes a skipped lineage row naming the identifier
    as sent, with no profile: compaction redacts it (a deleted profile held it)."""
    delete(two, "victim-77")
    r = two.call("POST", DELETE, {"external_ids": ["victim-77"]})  # a retry
    assert r.body == {"deleted": 0, "message": "success"}
    before = two.forget_check(external_id="victim-77")
    assert (DATA, "merges", "source") in places(before, "victim-77")
    two.compact()

    assert not two.forget_check(external_id="victim-77").found
    skipped = two.lineage("keeper-5")  # the keeper's lineage is untouched (it has none)
    assert skipped.height == 0


def test_the_deleted_service_id_stays_in_redirects_and_lineage(two: Workspace) -> None:
    """Not searched by default: the generated key is kept on purpose (it never resolves again)."""
    sid = two.call("POST", EXPORT, {"external_ids": ["victim-77"], "fields_to_export": ["service_id"]}).body
    sid = sid["users"][0]["service_id"]
    assert sid not in two.forget_check(external_id="victim-77").values
    delete(two, "victim-77")
    two.compact()

    report = two.forget_check(values=[sid])

    assert {(DATA, "redirects", "service_id"), (DATA, "merges", "source_sid"),
            (FOOTER_CACHE, "redirects", "x_starts")} <= places(report, sid)
    assert tables(report) == {"redirects", "merges"}


def test_compaction_publishes_the_copy_again_and_a_later_publication_holds_no_old_copy(two: Workspace) -> None:
    """`current/` (from `publish`) is written again by the compaction, its replaced files
    erased at once; the hour a later publication keeps old files for its readers holds no copy."""
    two.publish()
    delete(two, "victim-77")
    two.compact()
    assert not two.forget_check(external_id="victim-77", values=["victim77@example.com"]).retained
    two.publish()

    report = two.forget_check(external_id="victim-77", values=["victim77@example.com"])

    assert not report.found, report.occurrences
    assert {"current/profiles", "current/external_ids"} <= {kept.table for kept in report.retained}


def test_leftover_files_are_searched_as_bytes_and_unreadable_ones_fail_the_check(two: Workspace,
                                                                                 tmp_path: Path) -> None:
    root = tmp_path / "store"
    (root / "notes.txt").write_text("ticket: erase victim77@example.com\n")
    (root / "_staging.parquet").write_bytes(b"not parquet, but victim77@example.com")
    torn = root / "_repaired" / "profiles" / "_delta_log" / "00000000000000000009.json"
    torn.parent.mkdir(parents=True)
    torn.write_text('{"add":{"path":"x.parquet","stats":"{\\"minValues\\":{\\"email\\":\\"victim77@example.com')
    delete(two, "victim-77")
    two.compact()

    report = two.forget_check(values=["victim77@example.com"])

    assert places(report, "victim77@example.com") == {(OTHER, None, None), (DELTA_LOG, "_repaired/profiles", None)}
    assert {o.path for o in report.occurrences} == {"notes.txt", "_staging.parquet", str(torn.relative_to(root))}
    assert [line.split(":")[0] for line in report.unreadable] == ["_staging.parquet"]
    assert [note.split(":")[0] for note in report.notes] == ["_repaired/profiles"]  # its log does not load


def test_a_folder_that_is_not_there_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(NotAStore, match="no store folder"):
        find_copies(tmp_path / "typo", ["victim-77"])


# --- values only in logs or statistics -----------------------------------------------------------


def test_finds_a_value_only_in_a_delta_log_entry(tmp_path: Path) -> None:
    """A data file gone, its log entry's statistics still hold the value, whole or cut."""
    long_value = "x" * 50 + "secret-person@example.com"  # statistics keep its first 64 bytes
    write_deltalake(str(tmp_path / "t"), pa.table({"email": ["only-in-log@example.com"], "note": [long_value]}))
    for data in (tmp_path / "t").glob("*.parquet"):
        data.unlink()

    report = find_copies(tmp_path, ["only-in-log@example.com", "secret-person@example.com"])

    assert places(report, "only-in-log@example.com") == {(DELTA_LOG, "t", "email")}
    assert {o.detail for o in report.occurrences if o.value == "only-in-log@example.com"} == {"minValues", "maxValues"}
    cut = [o for o in report.occurrences if o.value == "secret-person@example.com"]
    assert {(o.place, o.column) for o in cut} == {(DELTA_LOG, "note")}
    assert any("cut copy" in o.detail and o.detail.startswith("minValues") for o in cut)


def test_finds_a_value_only_in_parquet_footer_statistics(tmp_path: Path) -> None:
    """A string beyond 64 bytes as delta-rs writes it: its max statistic is cut and its last
    character raised, text that occurs in no row (nor in the pages)."""
    write_deltalake(str(tmp_path / "t"), pa.table({"name": ["a" * 60 + "pers" + "on-name"]}))
    only_in_max = "a" * 60 + "pert"

    report = find_copies(tmp_path, [only_in_max])

    assert {(o.place, o.column, o.detail) for o in report.occurrences} == {
        (STATISTICS, "name", "row group 0 max"), (DELTA_LOG, "name", "maxValues")}


def test_reports_older_versions_still_on_disk(tmp_path: Path) -> None:
    """An overwrite without a vacuum: the old file and the log entry that added it stay."""
    write_deltalake(str(tmp_path / "t"), pa.table({"email": ["old@example.com"]}))
    write_deltalake(str(tmp_path / "t"), pa.table({"email": ["new@example.com"]}), mode="overwrite")

    report = find_copies(tmp_path, ["old@example.com", "new@example.com"])

    assert places(report, "old@example.com") == {(OLD_DATA, "t", "email"), (STATISTICS, "t", "email"),
                                                   (DELTA_LOG, "t", "email")}
    assert (DATA, "t", "email") in places(report, "new@example.com")
    [old] = {o.path for o in report.occurrences if o.place == OLD_DATA}
    assert report.retained == [Retained("t", 1, (old,), ("t/_delta_log/00000000000000000000.json",))]


def test_finds_values_inside_nested_and_json_columns(tmp_path: Path) -> None:
    pq.write_table(pa.table({
        "props": [{"tags": ["a", 'say "hi" victim']}],
        "json": ['{"name":"say \\"hi\\" victim"}'],
        "raw": [b"\x00victim-bytes\x00"],
    }), tmp_path / "nested.parquet")

    report = find_copies(tmp_path, ['say "hi" victim', "victim-bytes"])

    assert {(o.column, o.value) for o in report.occurrences if o.detail == "1 row"} == {
        ("props", 'say "hi" victim'), ("json", 'say "hi" victim'), ("raw", "victim-bytes")}
    assert {o.place for o in report.occurrences if o.detail == "1 row"} == {OTHER}  # a file outside any table


# --- the command line --------------------------------------------------------------------------------


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["forget-check", *args], env={"COLUMNS": "250"})
    return result.exit_code, result.output


def test_cli_prints_where_the_values_are_and_exits_1(two: Workspace, tmp_path: Path) -> None:
    code, out = invoke("--store", str(tmp_path / "store"), "--external-id", "victim-77")

    assert code == 1, out
    assert "copies found" in out and "victim77@example.com" in out and "_index_profiles_email" in out
    assert "the identifiers name 1 profile(s)" in out and "value(s) found in" in out
    assert "--value victim-77 --value Vicky --value victim77@example.com" in out  # for the check after the delete


def test_cli_after_delete_and_compact_exits_0(two: Workspace, tmp_path: Path) -> None:
    r = two.call("POST", "/users/alias/new", {"user_aliases": [
        {"alias_name": "vic-crm-9", "alias_label": "crm", "external_id": "victim-77"}]})
    assert r.status == 200
    store = str(tmp_path / "store")
    code, out = invoke("--store", store, "--alias", "vic-crm-9:crm")
    assert code == 1 and "aliases" in out and "vic-crm-9" in out
    delete(two, "victim-77")
    two.compact()

    code, out = invoke("--store", store, "--alias", "vic-crm-9:crm", "--value", "victim77@example.com",
                       "--value", "ultramarine-blue")

    assert code == 0, out
    assert "no copy of any value found" in out and "copies found" not in out


def test_cli_shows_old_versions_still_on_disk(two: Workspace, tmp_path: Path) -> None:
    two.publish()
    two.publish()

    code, out = invoke("--store", str(tmp_path / "store"), "--value", "nobody-has-this")

    assert code == 0, out
    assert "old versions still on disk" in out and "current/profiles" in out


@pytest.mark.parametrize("alias", ["victim", ":crm", "vic-crm-9:", ":"])
def test_cli_refuses_an_alias_that_is_not_name_colon_label(alias: str, two: Workspace, tmp_path: Path) -> None:
    code, out = invoke("--store", str(tmp_path / "store"), "--alias", alias)

    assert code == 1
    assert "is not NAME:LABEL" in out and "Traceback" not in out


def test_cli_errors_say_what_to_fix(tmp_path: Path) -> None:
    code, out = invoke("--store", str(tmp_path / "missing"), "--external-id", "victim-77")
    assert code == 1 and "no store at" in out
    assert not (tmp_path / "missing").exists()

    code, out = invoke("--store", str(tmp_path / "missing"))
    assert code == 1 and "nothing to look for" in out


def test_cli_help_has_an_example() -> None:
    result = runner.invoke(app, ["forget-check", "--help"], env={"COLUMNS": "250"})

    assert result.exit_code == 0
    assert "engagelake forget-check --store" in result.output and "--alias" in result.output
    assert "Examples:" in result.output
