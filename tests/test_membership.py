"""Bloom filters of a file's keys (`store/membership.py`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from engagelake.store import membership
from engagelake.store.footers import bloom_path, load_bloom, prune_indexes, save_bloom


@settings(max_examples=50, deadline=None)
@given(keys=st.lists(st.text(max_size=12), max_size=300), others=st.lists(st.text(max_size=12), max_size=50))
def test_a_filter_holds_every_key_it_was_built_from(keys, others) -> None:
    built = membership.build(pl.Series(keys, dtype=pl.String))
    assert membership.may_hold(built, membership.hashes(pl.Series(keys, dtype=pl.String))).all()
    # another key may be held (a false positive), never the other way round
    assert membership.may_hold(built, membership.hashes(pl.Series(others, dtype=pl.String))).dtype == np.bool_


@settings(max_examples=50, deadline=None)
@given(keys=st.lists(st.sampled_from(["a", "b", "c", "é", "", "user-1"]) | st.text(max_size=6), max_size=300),
       cut=st.lists(st.integers(0, 300), max_size=4))
def test_a_filter_built_from_parts_equals_one_built_from_all_its_keys(keys, cut) -> None:
    """A file's keys come a slice of row groups at a time, a key in several slices: the bits
    and the size follow the distinct keys only."""
    series = pl.Series(keys, dtype=pl.String)
    bounds = sorted({0, len(keys), *(min(c, len(keys)) for c in cut)})
    parts = [series.slice(a, b - a) for a, b in zip(bounds[:-1], bounds[1:], strict=False)]
    whole = membership.build(series)
    assert np.array_equal(membership.build(iter(parts)), whole)
    assert np.array_equal(membership.build(iter([series, series])), whole)
    # the bits, as a byte per bit set at once (the former way) gives them
    distinct = series.drop_nulls().unique()
    flags = np.zeros(whole.size * 8, dtype=bool)
    flags[membership._positions(membership.hashes(distinct), flags.size).ravel()] = True
    assert np.array_equal(np.packbits(flags, bitorder="little"), whole)


def test_few_absent_keys_pass_and_nulls_are_no_keys() -> None:
    keys = pl.Series([f"user-{i:07d}" for i in range(50_000)] + [None])
    built = membership.build(keys)
    absent = pl.Series([f"other-{i:07d}" for i in range(50_000)])
    assert membership.may_hold(built, membership.hashes(absent)).mean() < 0.03  # about 1.7% by design
    assert built.nbytes * 8 >= membership.BITS_PER_KEY * 50_000


def test_only_the_filters_of_live_files_and_this_hash_are_kept_and_a_bad_one_is_none(tmp_path) -> None:
    """`prune_indexes` drops the filters of vacuumed files, of another Polars version's hash and
    a writer's leftovers; a filter that does not load is no filter (the probe reads without)."""
    root = tmp_path / "store"
    (root / "t").mkdir(parents=True)
    data = root / "t" / "f.parquet"
    pl.DataFrame({"k": ["a", "b"]}).write_parquet(data)
    path = Path(bloom_path(str(root), str(data)))
    save_bloom(str(path), membership.build(pl.Series(["a", "b"])))
    kept = load_bloom(str(path))
    assert kept is not None and membership.may_hold(kept, membership.hashes(pl.Series(["a", "b"]))).all()
    shutil.copy(path, str(path).replace(membership.HASH_VERSION, "polars-0.0.0"))  # another version's
    shutil.copy(path, path.parent / path.name.replace("f.parquet", "gone.parquet"))  # a vacuumed file's
    (path.parent / f"{path.name}.123.456.tmp").write_bytes(b"half")  # a writer killed midway
    assert prune_indexes(str(root)) == 3
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    path.write_bytes(b"not a filter")
    assert load_bloom(str(path)) is None
