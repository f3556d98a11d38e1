"""`find_copies` (store/forget.py): every copy of some values left anywhere in a store folder:
Parquet decoded, Delta logs parsed, statistics, footer caches, other files as bytes."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from engagelake import NotAStore
from engagelake.store.forget import (
    DATA,
    DELTA_LOG,
    OLD_DATA,
    OTHER,
    STATISTICS,
    ForgetReport,
    Retained,
    find_copies,
)


def places(report: ForgetReport, value: str) -> set[tuple[str, str | None, str | None]]:
    """(place, table, column) of every occurrence of `value`."""
    return {(o.place, o.table, o.column) for o in report.occurrences if o.value == value}


def test_a_folder_that_is_not_there_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(NotAStore, match="no store folder"):
        find_copies(tmp_path / "typo", ["victim-77"])


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
