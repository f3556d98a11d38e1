"""Bloom filters of a file's keys (`store/membership.py`)."""

from __future__ import annotations

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from engagelake.store import membership


@settings(max_examples=50, deadline=None)
@given(keys=st.lists(st.text(max_size=12), max_size=300), others=st.lists(st.text(max_size=12), max_size=50))
def test_a_filter_holds_every_key_it_was_built_from(keys, others) -> None:
    built = membership.build(pl.Series(keys, dtype=pl.String))
    assert membership.may_hold(built, membership.hashes(pl.Series(keys, dtype=pl.String))).all()
    # another key may be held (a false positive), never the other way round
    assert membership.may_hold(built, membership.hashes(pl.Series(others, dtype=pl.String))).dtype == np.bool_


def test_few_absent_keys_pass_and_nulls_are_no_keys() -> None:
    keys = pl.Series([f"user-{i:07d}" for i in range(50_000)] + [None])
    built = membership.build(keys)
    absent = pl.Series([f"other-{i:07d}" for i in range(50_000)])
    assert membership.may_hold(built, membership.hashes(absent)).mean() < 0.03  # about 1.7% by design
    assert built.nbytes * 8 >= membership.BITS_PER_KEY * 50_000
