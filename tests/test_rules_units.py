"""Unit tests of the pure rules: frames in, frames out, no store."""

from datetime import UTC, datetime

import orjson
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal
from tests.test_apply_equals_call import (
    EVENTS_AND_PURCHASES,
    IDENTITIES_AND_ATTRIBUTES,
    PUSH_AND_SUBSCRIPTIONS,
)

from engagelake.rules import messages as M
from engagelake.rules.profile import attributes, parse, parsing, reading
from engagelake.rules.profile.attributes import attribute_errors, fold_attributes
from engagelake.rules.profile.validate import (
    normalize_email,
    normalize_phone,
    parse_time,
    parse_times,
)
from engagelake.rules.state import Changes, State, apply_changes
from engagelake.tables.partial import SET, mask_of

OPS_SCHEMA = {
    "service_id": pl.String, "name": pl.String, "seq": pl.Int64, "kpos": pl.Int64, "op": pl.String,
    "value": pl.String, "inc": pl.Int64, "add": pl.String, "remove": pl.String, "applied": pl.Boolean,
}
CURRENT_SCHEMA = {"service_id": pl.String, "name": pl.String, "value": pl.String}


def ops(*rows: dict) -> pl.DataFrame:
    full = [
        {"service_id": "u", "kpos": 0, "value": None, "inc": None, "add": None, "remove": None,
         "applied": True, **r}
        for r in rows
    ]
    return pl.DataFrame(full, schema=OPS_SCHEMA)


def current(**values: str) -> pl.DataFrame:
    return pl.DataFrame({"service_id": ["u"] * len(values), "name": list(values), "value": list(values.values())},
                        schema=CURRENT_SCHEMA)


def folded(o: pl.DataFrame, cur: pl.DataFrame) -> dict[str, str | None]:
    """The fold's final values (None: deleted), the same whether the keys are coded as
    integers first (big batches) or not (small ones)."""
    results = []
    for code_from in (0, attributes.CODE_KEYS_FROM):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(attributes, "CODE_KEYS_FROM", code_from)
            ups, dels = fold_attributes(o, cur)
        out: dict[str, str | None] = {n: v for _, n, v in ups.iter_rows()}
        out.update({n: None for _, n in dels.iter_rows()})
        results.append(out)
    assert results[0] == results[1]
    return results[0]


def test_inc_sums_over_the_batch_from_the_stored_value():
    o = ops({"name": "n", "seq": 1, "op": "inc", "inc": 2}, {"name": "n", "seq": 5, "op": "inc", "inc": -1})
    assert folded(o, current(n="10")) == {"n": "11"}


def test_inc_on_missing_starts_at_zero_and_float_base_stays_float():
    o = ops({"name": "a", "seq": 1, "op": "inc", "inc": 3}, {"name": "b", "seq": 2, "op": "inc", "inc": 1})
    assert folded(o, current(b="1.5")) == {"a": "3", "b": "2.5"}


def test_set_resets_then_inc_applies_after_it():
    o = ops(
        {"name": "n", "seq": 1, "op": "inc", "inc": 5},
        {"name": "n", "seq": 2, "op": "set", "value": "100"},
        {"name": "n", "seq": 3, "op": "inc", "inc": 1},
    )
    assert folded(o, current(n="1")) == {"n": "101"}


def test_unset_deletes_and_later_add_starts_from_empty():
    assert folded(ops({"name": "t", "seq": 1, "op": "unset"}), current(t='"x"')) == {"t": None}
    o = ops({"name": "t", "seq": 1, "op": "unset"}, {"name": "t", "seq": 2, "op": "arr", "add": '["a"]'})
    assert folded(o, current(t='["z"]')) == {"t": '["a"]'}


def test_ordered_set_add_moves_repeats_to_the_end_and_remove_goes_after_add():
    o = ops(
        {"name": "t", "seq": 1, "op": "arr", "add": '["b","d"]', "remove": '["d"]'},
        {"name": "t", "seq": 2, "op": "arr", "add": '["a"]'},
    )
    assert folded(o, current(t='["a","b","c"]')) == {"t": '["c","b","a"]'}


def test_plain_array_keeps_the_last_place_of_repeats_and_objects_compare_by_content():
    o = ops({"name": "t", "seq": 1, "op": "set", "value": '[1,{"x":1,"y":2},2,1,{"y":2,"x":1}]'})
    assert folded(o, current()) == {"t": '[2,1,{"y":2,"x":1}]'}


def test_cap_keeps_the_newest_500_after_every_step():
    base = "[" + ",".join(str(i) for i in range(500)) + "]"
    # add 1 (drops 0), then remove 499: sequentially 0 is gone for good although 499 values remain
    o = ops(
        {"name": "t", "seq": 1, "op": "arr", "add": "[1000]"},
        {"name": "t", "seq": 2, "op": "arr", "remove": "[499]"},
    )
    value = folded(o, current(t=base))["t"]
    assert value is not None
    items = [int(x) for x in value.strip("[]").split(",")]
    assert items[0] == 1 and items[-1] == 1000 and 499 not in items and len(items) == 499


def test_type_errors_see_only_applied_operations():
    o = ops(
        {"name": "n", "seq": 1, "op": "set", "value": '"text"', "applied": False},  # a rejected object
        {"name": "n", "seq": 2, "op": "inc", "inc": 1},
        {"name": "t", "seq": 3, "op": "arr", "add": "[1]"},
    )
    assert attribute_errors(o, current(n="1", t="5")).to_dicts() == [
        {"seq": 3, "error": M.ERR_ARRAY_OP_NOT_ARRAY}
    ]
    o2 = o.with_columns(applied=pl.lit(True))
    assert attribute_errors(o2, current(t="[]")).to_dicts() == [{"seq": 2, "error": M.ERR_INC_NOT_NUMERIC}]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["u1", "u2", None]), st.sampled_from(["a", "b"]),
                          st.sampled_from(["NUMBER", "ARRAY", "MISSING", None])), max_size=30))
def test_the_last_value_before_in_a_run_equals_the_window_over_the_keys(rows):
    frame = pl.DataFrame(rows, schema={"service_id": pl.String, "name": pl.String, "rt": pl.String},
                         orient="row").sort(["service_id", "name"], maintain_order=True, nulls_last=True)
    keys = ["service_id", "name"]
    got = frame.select(attributes.last_before_in_run("rt", keys))
    want = frame.select(pl.col("rt").shift(1).forward_fill().over(keys))
    assert_frame_equal(got, want)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(" Ada@Example.COM ", "ada@example.com"), ("no-at-sign", None), ("a@b", None), ("a b@c.de", None)],
)
def test_normalize_email(raw, expected):
    assert pl.select(normalize_email(pl.lit(raw))).item() == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("+1 (555) 123-4567", "+15551234567"), ("49.30.1234567", "+49301234567"), ("+0123456789", None),
     ("12345", None)],
)
def test_normalize_phone(raw, expected):
    assert pl.select(normalize_phone(pl.lit(raw))).item() == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2026-11-20T10:00:00Z", datetime(2026, 11, 20, 10, tzinfo=UTC)),
        ("2026-11-20T10:00:00.5+01:00", datetime(2026, 11, 20, 9, 0, 0, 500000, tzinfo=UTC)),
        ("2026-11-20T10:00:00:123-0500", datetime(2026, 11, 20, 15, 0, 0, 123000, tzinfo=UTC)),
        ("2026-11-20T10:00:00", None),
        ("2026-13-20T10:00:00Z", None),
    ],
)
def test_parse_time(raw, expected):
    assert pl.select(parse_time(pl.lit(raw))).item() == expected
    assert parse_times(pl.Series([raw])).item() == expected


_times = st.builds(
    "{}-{}-{}T{}:{}:{}{}{}".format,
    st.sampled_from(["2026", "1970", "0001", "9999"]), st.sampled_from(["01", "02", "12", "13", "00"]),
    st.sampled_from(["01", "28", "29", "31", "32"]), st.sampled_from(["00", "23", "24"]),
    st.sampled_from(["00", "59", "60"]), st.sampled_from(["00", "59", "60"]),
    st.one_of(st.just(""), st.just(":123"), st.just(":12"), st.from_regex(r"\.[0-9]{1,12}", fullmatch=True)),
    st.sampled_from(["Z", "Z", "+01:00", "-0530", "+1", "z", ""]),
)


@pytest.mark.slow  # a property: 100 columns of times, each parsed twice (7 s)
@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), _times, st.text(max_size=30)), max_size=30))
def test_a_column_of_times_parses_as_each_time_alone(raws: list[str | None]) -> None:
    """`parse_times` (UTC times by one fixed format, the rest the general way) equals `parse_time`."""
    column = pl.Series("time", raws, dtype=pl.String)
    want = pl.DataFrame({"t": column}).select(parse_time(pl.col("t"))).to_series()
    assert parse_times(column).eq_missing(want).all()


def test_apply_changes_upserts_by_key_and_appends_logs():
    state = State.empty()
    ch = Changes()
    ch.upsert("attributes", pl.DataFrame({"service_id": ["u", "u"], "name": ["a", "b"], "value": ["1", "2"]}))
    ch.upsert("attributes", pl.DataFrame({"service_id": ["u"], "name": ["a"], "value": ["3"]}))
    ch.delete("attributes", pl.DataFrame({"service_id": ["u"], "name": ["b"]}))
    s2 = apply_changes(state, ch, next_profile_n=0, next_update_seq=0)
    assert_frame_equal(s2["attributes"], pl.DataFrame({"service_id": ["u"], "name": ["a"], "value": ["3"]}))


def test_apply_changes_folds_partial_rows_into_the_rows_it_holds():
    state = State.empty()
    ch = Changes()
    ch.upsert("profiles", pl.DataFrame({"service_id": ["u"], "first_name": ["Ann"], "email": ["a@x.io"]}))
    s1 = apply_changes(state, ch, next_profile_n=1, next_update_seq=0)
    ch = Changes()
    ch.upsert("profiles", pl.DataFrame({"service_id": ["u", "nobody"], "first_name": [None, "B"], "email": ["b@x.io"] * 2,
                                        SET: [mask_of("profiles", ["first_name"])] * 2}))
    s2 = apply_changes(s1, ch, next_profile_n=1, next_update_seq=0)
    row = s2["profiles"].row(0, named=True)
    assert s2["profiles"].height == 1 and row["first_name"] is None and row["email"] == "a@x.io"  # unset; kept
    assert s2.pending == {}  # a whole table has no row for `nobody` to fold into


def test_parsing_in_chunks_equals_parsing_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Big passes are parsed in chunks, two at a time (`rules.profile.parse.parse_duckdb`): the frames,
    `seq` numbering included, are those of one parse. Bad bodies ride along."""
    texts = [orjson.dumps(r.get("body")).decode()
             for r in IDENTITIES_AND_ATTRIBUTES + PUSH_AND_SUBSCRIPTIONS + EVENTS_AND_PURCHASES
             if r["path"] == "/users/track"]
    texts += ["[1, 2]", '{"attributes": 3}', '{"events": [1, {"name": "x"}]}', "null"]
    bodies = pa.table({"req": pa.array(range(len(texts)), pa.int64()), "body": texts})
    monkeypatch.setenv("ENGAGELAKE_SMALL_PARSE_BYTES", "0")  # DuckDB's parse, whatever the pass's size
    whole = parsing.parse_track(bodies)
    assert whole.objects.height > 20
    for limit in (1, 300):  # one request per chunk; a few per chunk
        monkeypatch.setattr(parse, "PARSE_CHUNK_BYTES", limit)
        assert len(parse._chunk_ends(pc.binary_length(bodies["body"]).to_numpy(), limit)) > 3
        chunked = parsing.parse_track(bodies)
        for name in ("requests", "objects", "pairs", "tokens", "groups"):
            assert_frame_equal(getattr(chunked, name), getattr(whole, name))


def test_reading_a_pass_in_shares_equals_reading_it_whole() -> None:
    """A flow's workers read a pass's requests in shares (`rules.profile.reading`): the shares
    read apart, each numbered from its first request, then joined, give the frames of one read,
    `seq` numbering included, with requests refused whole (which take no `seq`) in any share."""
    texts = [orjson.dumps(r.get("body")).decode()
             for r in IDENTITIES_AND_ATTRIBUTES + PUSH_AND_SUBSCRIPTIONS + EVENTS_AND_PURCHASES
             if r["path"] == "/users/track"]
    too_many = orjson.dumps({"attributes": [{"external_id": f"x{i}"} for i in range(76)]}).decode()
    texts[3:3] = [too_many, "[1, 2]"]
    texts += ['{"attributes": 3}', '{"events": [1, {"name": "x"}]}', too_many, "null"]
    whole = reading.read_track(texts, 10)
    assert whole.valid.fatal.height >= 3 and whole.objects > 20
    for cuts in ([1], [4, 5], [2, 9, 10, len(texts) - 1], list(range(1, len(texts)))):
        bounds = list(zip([0, *cuts], [*cuts, len(texts)], strict=True))
        shares = reading.joined([reading.read_track(texts[a:b], 10, first_req=a) for a, b in bounds])
        assert shares.objects == whole.objects
        assert_frame_equal(shares.requests, whole.requests)
        for name, frame in vars(whole.valid).items():
            assert_frame_equal(getattr(shares.valid, name), frame)


def test_shares_are_runs_of_about_equal_text_each_long_enough() -> None:
    assert reading.shares_of(["aaa"] * 4, 2, 1) == [(0, 2), (2, 4)]
    assert reading.shares_of(["a"] * 10, 3, 1) == [(0, 4), (4, 7), (7, 10)]
    assert reading.shares_of(["a"] * 10, 3, 100) == [(0, 10)]  # too short to share
    assert reading.shares_of(["a" * 3000] + ["b" * 600] * 4, 4, 1000) == [(0, 1), (1, 3), (3, 5)]
    assert reading.shares_of(["x" * 10_000, "y", "y", "y"], 4, 1000) == [(0, 4)]  # no share of 3 bytes
    assert reading.shares_of([], 4, 1) == [(0, 0)]


def test_parse_reads_types_nulls_and_operations_of_awkward_values() -> None:
    """What the checks downstream rely on from `parse_track`, pinned on the awkward cases: a JSON
    null reads as absent at the top of an object but stays 'NULL' in a nested path, nested
    properties are flagged, an `inc` past 64 bits has a type and no value, an `add` of null is
    the text 'null', a null value has no text, keys match case-sensitively, and push tokens are
    listed with their own types."""
    body = {
        "attributes": [{
            "external_id": "a", "user_alias": {"alias_name": None, "alias_label": 3}, "email": None,
            "x": {"inc": 18446744073709551615}, "y": {"add": None}, "z": {"remove": [1]}, "s": "é",
            "push_tokens": [{"app_id": "app", "token": "t"}, 3],
        }],
        "events": [None, {"external_id": 5, "name": "e", "properties": {"a": {"b": 1}}},
                   {"name": "f", "properties": {"k": 1}, "External_ID": "b"}],
        "purchases": "not a list",
    }
    p = parsing.parse_track(pa.table({"req": pa.array([0], pa.int64()), "body": [orjson.dumps(body).decode()]}))
    assert p.requests.select("body_type", "attributes_type", "attributes_len", "events_len", "purchases_type",
                             "purchases_len").row(0) == ("OBJECT", "ARRAY", 1, 3, "VARCHAR", None)
    attrs, null_event, nested, flat = p.objects.sort("seq").iter_rows(named=True)
    assert (attrs["ext_t"], attrs["ext"], attrs["email_t"], attrs["alias_t"]) == ("VARCHAR", "a", None, "OBJECT")
    assert (attrs["alias_name_t"], attrs["alias_name"], attrs["alias_label_t"], attrs["alias_label"]) == (
        "NULL", None, "UBIGINT", "3")
    assert attrs["tokens_t"] == "ARRAY" and attrs["props_t"] is None
    assert null_event["obj_t"] == "NULL" and null_event["ext_t"] is None
    assert (nested["ext_t"], nested["ext"], nested["props_nested"]) == ("UBIGINT", "5", True)
    assert (flat["props"], flat["props_keys"], flat["props_nested"]) == ('{"k":1}', ["k"], False)
    pairs = {r["key"]: r for r in p.pairs.iter_rows(named=True)}
    assert list(pairs) == ["external_id", "user_alias", "email", "x", "y", "z", "s", "push_tokens"]  # key order
    assert (pairs["x"]["inc_t"], pairs["x"]["inc"], pairs["x"]["okeys"]) == ("UBIGINT", None, ["inc"])
    assert (pairs["y"]["add_t"], pairs["y"]["add"], pairs["z"]["remove"]) == ("NULL", "null", "[1]")
    assert (pairs["s"]["vt"], pairs["s"]["vs"], pairs["email"]["vt"]) == ("VARCHAR", "é", "NULL")
    assert (pairs["s"]["v"], pairs["email"]["v"]) == ('"é"', None)
    assert flat["ext_t"] is None  # `External_ID` is not `external_id`
    assert p.tokens.select("pos", "elem_t", "app_id", "token").rows() == [(0, "OBJECT", "app", "t"),
                                                                          (1, "UBIGINT", None, None)]
