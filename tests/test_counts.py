"""The bulk endpoints' count limits, read on a body's data before its pass (`rules/counts.py`,
issue 56): the router refuses a body past a limit with the message its pass would give, so
that DuckDB never expands its elements, and refuses nothing the pass would answer otherwise."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from engagelake.routes import ROUTER
from engagelake.rules import counts
from engagelake.rules.identity.bulk_requests import parse_identifies, parse_merges
from engagelake.rules.profile.reading import read_track

_ELEMENT = st.one_of(st.just({}), st.just({"external_id": "a"}), st.just(1), st.none(), st.just([]))


def _array(most: int) -> st.SearchStrategy[Any]:
    """A list around the limit, mostly of objects, or something that is no list."""
    objects = st.integers(0, most + 3).map(lambda n: [{}] * n)
    return st.one_of(objects, objects.flatmap(lambda items: st.tuples(st.just(items), _ELEMENT, st.integers(0, 80))
                                              .map(lambda t: t[0][:t[2]] + [t[1]] + t[0][t[2]:])),
                     st.just(None), st.just("x"), st.just({}))


def _bodies(arrays: tuple[str, ...], most: int) -> st.SearchStrategy[Any]:
    return st.one_of(st.fixed_dictionaries({}, optional={a: _array(most) for a in arrays}), st.just([]), st.just(3))


def _track_message(body: Any) -> str | None:
    fatal = read_track([orjson.dumps(body).decode()]).valid.fatal
    return fatal["message"][0] if fatal.height else None


@settings(max_examples=60, deadline=None)
@given(_bodies(counts.TRACK_ARRAYS, counts.TRACK_MOST))
def test_the_track_count_answers_what_the_pass_answers(body: Any) -> None:
    early, late = counts.track_too_many(body), _track_message(body)
    assert early is None or early == late
    if late is not None and "may contain at most 75" in late:
        assert early == late, "the pass counted what the router let through"


@settings(max_examples=50, deadline=None)
@given(_bodies(("merge_updates",), 50))
def test_the_merge_count_answers_what_the_pass_answers(body: Any) -> None:
    early, late = counts.merge_too_many(body), parse_merges([(0, orjson.dumps(body).decode())])[0].get(0)
    assert early is None or early == late
    if late is not None and "may contain at most 50" in late:
        assert early == late


@settings(max_examples=50, deadline=None)
@given(_bodies(("aliases_to_identify", "emails_to_identify", "phone_numbers_to_identify"), 50))
def test_the_identify_count_answers_what_the_pass_answers(body: Any) -> None:
    early, late = counts.identify_too_many(body), parse_identifies([(0, orjson.dumps(body).decode())])[0].get(0)
    assert early is None or early == late
    if late is not None and "at most 50 objects together" in late:
        assert early == late


def test_the_server_refuses_a_million_objects_before_the_queue() -> None:
    """The issue's body: 2.9 MiB of `{}` objects, which DuckDB expanded into 1.5 GiB."""
    body = orjson.dumps({"attributes": [{}] * 1_000_000})
    refusal = ROUTER.body_refusal("POST", "/users/track", body)
    message = "attributes may contain at most 75 objects"
    assert refusal is not None and (refusal.status, refusal.body) == (400, {"message": message, "errors": [message]})
    merge = ROUTER.body_refusal("POST", "/users/merge", orjson.dumps({"merge_updates": [{}] * 100_000}))
    assert merge is not None and merge.body == {"message": "merge_updates may contain at most 50 objects"}
    identify = ROUTER.body_refusal("POST", "/users/identify", orjson.dumps({"emails_to_identify": [{}] * 100_000}))
    assert identify is not None and identify.status == 400
    assert ROUTER.body_refusal("POST", "/users/track", orjson.dumps({"attributes": [{}] * 75})) is None
