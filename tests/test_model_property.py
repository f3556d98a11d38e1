"""Property tests: the vectorized engine answers exactly like the sequential reference model.

Random sequences interleaving every user endpoint (`/users/track`, `/users/export/ids`,
`/users/merge`, `/users/identify`, `/users/external_ids/rename` and `/remove`, `/users/alias/new`
and `/update`, `/users/delete`) over small identifier universes (so that users collide, share
emails and phones, steal push tokens, merge in chains, get renamed back and forth, identified,
deleted and recreated) go through the engine (`Workspace.call`, one `Workspace.apply`, `apply` in
random chunks) and through `tests/model.py`; every response and the final `export_users()` must be
equal. Comparison is strict about JSON types (`1`, `1.0` and `true` differ).

Invalid identity requests carry exactly one defect, so that the check order inside a request
(which the contract fixes only partly) never decides the expected message.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st
from tests.model import (
    ALIAS_NEW_PATH,
    ALIAS_UPDATE_PATH,
    DELETE_PATH,
    EMAIL_BLOCKLIST_PATH,
    EMAIL_BOUNCE_REMOVE_PATH,
    EMAIL_HARD_BOUNCES_PATH,
    EMAIL_SPAM_REMOVE_PATH,
    EMAIL_STATUS_PATH,
    EMAIL_UNSUBSCRIBES_PATH,
    EXPORT_PATH,
    IDENTIFY_PATH,
    MERGE_PATH,
    REMOVE_PATH,
    RENAME_PATH,
    SUBSCRIPTION_SET_PATH,
    SUBSCRIPTION_SET_V2_PATH,
    TRACK_PATH,
    Model,
    service_id_for,
)

import engagelake.batch as batch_module
from engagelake.rules.messages import EXPORT_FIELDS

try:
    from engagelake import Workspace
except ImportError:  # the engine lands after this file; until then the engine tests skip
    Workspace = None

CLOCK = datetime(2026, 11, 22, tzinfo=UTC)
SEED = "s"


def clock() -> datetime:
    return CLOCK


ABSENT = object()  # "leave the key out"

# --- identifier universes (small, so that objects collide) -----------------------------------
EXTERNAL_IDS = ["u1", "u2", "u3", "u4"]
BLOCKED_IDS = ["null", " Guest ", "N/A"]
ALIASES = [
    {"alias_name": "a1", "alias_label": "crm"},
    {"alias_name": "a2", "alias_label": "web"},
    {"alias_name": "a3", "alias_label": "crm"},  # same label as a1: one alias per label
    {"alias_name": "a1", "alias_label": "web"},  # same name as a1/crm
]
EMAILS = [
    "ann@example.com",
    " Ann@Example.COM ",
    "bob@example.com",
    "BOB@EXAMPLE.COM",
    "cy@example.org",
]
BAD_EMAIL = "not-an-email"
PHONES = [
    "+14155550100",
    "+1 (415) 555-0100",
    "1.415.555.0100",
    "+447700900123",
    "+44 7700-900-123",
]
BAD_PHONE = "0123 45"
# The first profiles' service_ids are known in advance (sha256 of seed and creation number).
SERVICE_IDS = [service_id_for(SEED, n) for n in range(6)] + ["ffffffffffffffffffffffff"]

TOKENS = [
    {"app_id": "app1", "token": "t1", "device_id": "d1"},
    {"app_id": "app1", "token": "t2", "device_id": "d1"},
    {"app_id": "app2", "token": "t1"},
    {"app_id": "app1", "token": "t1", "device_id": "d2"},
    {"app_id": "app2", "token": "t3", "device_id": "d3"},
    # shapes that name a platform (iOS, Android, Web), and one a byte short of iOS
    {"app_id": "ios", "token": "ab" * 32, "device_id": "d4"},
    {"app_id": "android", "token": "fGx1_-:APA91bHk_z"},
    {"app_id": "web", "token": "https://push.example.com/s/1"},
    {"app_id": "ios", "token": "ab" * 31 + "a"},
]
BAD_TOKENS: list[Any] = [[{"app_id": "", "token": "x"}], "t1", [{"app_id": "app1", "token": 5}]]


def weighted(*pairs: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """one_of with integer weights."""
    options = [s for w, s in pairs for _ in range(w)]
    return st.sampled_from(range(len(options))).flatmap(lambda i: options[i])


def pick(values: list[Any]) -> st.SearchStrategy:
    """One of the values, deep-copied so that no two objects share a mutable value."""
    return st.sampled_from(values).map(lambda v: v if v is ABSENT else copy.deepcopy(v))


def drop_absent(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if v is not ABSENT}


# --- identifiers -----------------------------------------------------------------------------
SHARED_EMAILS = EMAILS[:4]  # ann and bob, in several spellings: profiles end up sharing them
identifiers = weighted(
    (10, pick(EXTERNAL_IDS).map(lambda v: {"external_id": v})),
    (
        6,
        st.tuples(pick(EXTERNAL_IDS), pick(SHARED_EMAILS)).map(
            lambda t: {"external_id": t[0], "email": t[1]}
        ),
    ),
    (3, pick(ALIASES).map(lambda v: {"user_alias": v})),
    (2, pick(SERVICE_IDS).map(lambda v: {"service_id": v})),
    (5, pick(EMAILS).map(lambda v: {"email": v})),
    (2, pick(PHONES).map(lambda v: {"phone": v})),
    (1, st.tuples(pick(EMAILS), pick(PHONES)).map(lambda t: {"email": t[0], "phone": t[1]})),
    (1, pick(EMAILS).map(lambda v: {"external_id": None, "email": v})),
    (
        2,
        pick(
            [
                {"email": BAD_EMAIL},
                {"phone": BAD_PHONE},
                {"external_id": "u1", "user_alias": ALIASES[0]},
                {"service_id": SERVICE_IDS[0], "external_id": "u2"},
                {"external_id": 42},
                {"user_alias": {"alias_name": "a1"}},
                {"service_id": ""},
                {"first_name": "nobody"},  # no identifier at all
            ]
        ),
    ),
)
update_only = weighted(
    (8, st.just(ABSENT)),
    (2, st.just(True)),
    (3, st.just(False)),
    (1, pick(["yes", None])),
)

# --- attributes ------------------------------------------------------------------------------
# valid values (null included: it clears the field), then invalid ones
FIELD_VALUES: dict[str, tuple[list[Any], list[Any]]] = {
    "first_name": (["Ann", "Bo", None], [7, "x" * 256]),
    "last_name": (["Lee", ""], [["Lee"]]),
    "email": ([*EMAILS, None], [BAD_EMAIL]),
    "phone": ([*PHONES, None], [BAD_PHONE]),
    "dob": (["1990-02-28", "2000-02-29", None], ["1990-02-30", "1990/01/01"]),
    "gender": (["F", "M", "P", None], ["m", "X"]),
    "country": (["us", "DE", None], ["XX", "usa"]),
    "language": (["EN", "fr", None], ["zz", "eng"]),
    "home_city": (["Paris", None], [3]),
    "time_zone": (["Europe/Paris", "America/New_York", None], ["Mars/Base", "europe/paris"]),
    "push_subscribe": (["opted_in", "opted_in", "subscribed", "unsubscribed", None], ["maybe"]),
    "last_coordinates": ([[2.35, 48.85], [-74, 40], None], [[200, 0], [1.0], [1, "2"]]),
    "attributed_campaign": (["spring", None], [False]),
}


def field_value(field: str) -> st.SearchStrategy:
    valid, invalid = FIELD_VALUES[field]
    return weighted((8, pick(valid)), (1, pick(invalid)))


CUSTOM_NAMES = ["score", "tags", "prefs", "nick", "stays"]
ARRAY_POOL: list[Any] = ["a", "b", "c", 1, 1.0, True, {"k": 1}]
STAYS = [{"hotel": "h1", "nights": 2}, {"hotel": "h2", "nights": 1}]

small_arrays = st.lists(pick(ARRAY_POOL), max_size=5)
custom_values = weighted(
    (4, pick(["gold", "silver", 3, -2, 1.5, True, False, ""])),
    (2, st.just(None)),
    (3, small_arrays),
    (1, pick([STAYS])),  # an array of objects
    (1, pick([{"k": 1}, {"k": {"j": "v"}}, {"inc": 1, "x": 2}, {}])),
    (4, st.integers(-3, 5).map(lambda n: {"inc": n})),
    (3, small_arrays.map(lambda v: {"add": v})),
    (2, small_arrays.map(lambda v: {"remove": v})),
    (1, st.tuples(small_arrays, small_arrays).map(lambda t: {"add": t[0], "remove": t[1]})),
    (1, pick([list(range(505)), {"add": [1000, 1001, 0]}])),  # the 500 cap
    (
        1,
        pick(
            ["x" * 256, {"inc": 1.5}, {"inc": "1"}, {"inc": True}, {"add": "a"}, {"remove": None}]
        ),
    ),
)
subscription_groups = weighted(
    (
        8,
        st.lists(
            st.fixed_dictionaries(
                {
                    "subscription_group_id": pick(["g1", "g2"]),
                    "subscription_state": pick(["subscribed", "unsubscribed"]),
                }
            ),
            max_size=2,
        ),
    ),
    (1, st.just([{"subscription_group_id": "g1", "subscription_state": "opted_in"}])),
)
push_tokens = weighted(
    (8, st.lists(pick(TOKENS), min_size=1, max_size=2)),
    (1, st.just([])),
    (1, pick(BAD_TOKENS)),
)


@st.composite
def attributes_objects(draw: st.DrawFn) -> dict:
    obj: dict[str, Any] = dict(draw(identifiers))
    obj["_update_existing_only"] = draw(update_only)
    for field in draw(st.lists(st.sampled_from(sorted(FIELD_VALUES)), max_size=3, unique=True)):
        obj[field] = draw(field_value(field))
    if draw(st.integers(0, 2)) == 0:
        obj["email_subscribe"] = draw(
            weighted(
                (10, pick(["subscribed", "unsubscribed", "opted_in"])), (1, pick(["bogus", None]))
            )
        )
    if draw(st.integers(0, 4)) == 0:
        obj["subscription_groups"] = draw(subscription_groups)
    if draw(st.integers(0, 3)) == 0:
        obj["push_tokens"] = draw(push_tokens)
    if draw(st.integers(0, 14)) == 0:
        obj["push_token_import"] = draw(pick([False, False, "yes"]))
    names = draw(st.lists(st.sampled_from(CUSTOM_NAMES), max_size=3, unique=True))
    if draw(st.integers(0, 30)) == 0:
        names.append("$bad")
    for name in names:
        obj[name] = draw(custom_values)
    return drop_absent(obj)


@st.composite
def push_import_objects(draw: st.DrawFn) -> dict:
    obj: dict[str, Any] = {"push_token_import": True}
    obj["push_tokens"] = draw(
        weighted(
            (6, st.lists(pick(TOKENS), max_size=3)), (1, pick(BAD_TOKENS)), (1, st.just(ABSENT))
        )
    )
    if draw(st.booleans()):  # ignored beside push_token_import: true
        obj.update(draw(identifiers))
        obj["nick"] = "ignored"
        obj["_update_existing_only"] = draw(update_only)
    return drop_absent(obj)


# --- events and purchases --------------------------------------------------------------------
def format_time(dt: datetime, style: int) -> str:
    if style == 0:
        return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"
    if style == 1:
        local = dt.astimezone(UTC) + timedelta(hours=2)
        return local.strftime("%Y-%m-%dT%H:%M:%S.%f") + "+02:00"
    if style == 2:
        local = dt.astimezone(UTC) - timedelta(hours=5, minutes=30)
        return local.strftime("%Y-%m-%dT%H:%M:%S") + "-0530"
    return dt.strftime("%Y-%m-%dT%H:%M:%S:") + f"{dt.microsecond // 1000:03d}Z"


valid_times = st.builds(
    format_time,
    st.builds(
        lambda days, secs, ms: CLOCK - timedelta(days=days, seconds=secs, milliseconds=ms),
        st.sampled_from([0, 0, 1, 30, 89, 90, 91, 200, -1]),
        st.sampled_from([0, 0, 3600, 86399]),
        st.sampled_from([0, 0, 1, 250]),
    ),
    st.integers(0, 3),
)
times = weighted(
    (20, valid_times),
    (1, st.just("2026-08-24T00:00:00Z")),  # exactly clock - 90 days: inside
    (1, pick(["yesterday", "2026-11-22 10:00:00Z", "2026-13-01T00:00:00Z", 12345, ABSENT])),
)
properties = weighted(
    (6, st.just(ABSENT)),
    (4, pick([{"a": 1}, {"nested": {"x": [1, 2]}}, {}, None])),
    (1, pick([{"$x": 1}, "str", {"": 2}])),
)
app_ids = weighted((8, st.just(ABSENT)), (4, st.just("app1")), (1, st.just(3)))


def mostly(valid: list[Any], invalid: list[Any]) -> st.SearchStrategy:
    return weighted((20, pick(valid)), (1, pick(invalid)))


@st.composite
def event_objects(draw: st.DrawFn) -> dict:
    obj: dict[str, Any] = dict(draw(identifiers))
    obj["_update_existing_only"] = draw(update_only)
    obj["name"] = draw(mostly(["open", "buy", "open"], ["", 5, ABSENT]))
    obj["time"] = draw(times)
    obj["app_id"] = draw(app_ids)
    obj["properties"] = draw(properties)
    return drop_absent(obj)


@st.composite
def purchase_objects(draw: st.DrawFn) -> dict:
    obj: dict[str, Any] = dict(draw(identifiers))
    obj["_update_existing_only"] = draw(update_only)
    obj["product_id"] = draw(mostly(["sku1", "sku2"], ["", ABSENT]))
    obj["currency"] = draw(mostly(["USD", "EUR"], ["usd", ABSENT]))
    obj["price"] = draw(mostly([9.99, 5, 0.1, 0, 12.5], ["5", True, ABSENT]))
    obj["quantity"] = draw(mostly([ABSENT, ABSENT, 1, 3, 100], [0, 101, 2.5]))
    obj["time"] = draw(times)
    obj["app_id"] = draw(app_ids)
    obj["properties"] = draw(properties)
    return drop_absent(obj)


# --- requests --------------------------------------------------------------------------------
@st.composite
def track_bodies(draw: st.DrawFn) -> dict:
    body: dict[str, Any] = {}
    arrays = draw(
        st.lists(
            st.sampled_from(["attributes", "events", "purchases"]),
            min_size=1,
            max_size=3,
            unique=True,
        )
    )
    for array in ["attributes", "events", "purchases"]:
        if array not in arrays:
            continue
        if array == "attributes":
            element = weighted((6, attributes_objects()), (1, push_import_objects()))
        elif array == "events":
            element = event_objects()
        else:
            element = purchase_objects()
        body[array] = draw(st.lists(element, max_size=4))
    return body


@st.composite
def fatal_track_bodies(draw: st.DrawFn) -> Any:
    kind = draw(st.integers(0, 6))
    if kind == 0:
        return {"attributes": [{"external_id": "u1", "n": {"inc": 1}}] * 76}
    if kind == 1:
        return {
            "events": [
                {"external_id": "u1", "name": "open", "time": "2026-11-21T00:00:00Z"},
                "not an object",
            ]
        }
    if kind == 2:
        return {"attributes": draw(pick(["x", None, {"external_id": "u1"}]))}
    if kind == 3:
        return draw(pick([{}, [], None, "null", {"attribute": []}]))
    # a blocked placeholder external_id somewhere in an otherwise valid request
    body = draw(track_bodies())
    array = draw(st.sampled_from(sorted(body)))
    body[array] = [*body[array], {"external_id": draw(pick(BLOCKED_IDS)), "nick": "x"}]
    return body


@st.composite
def export_bodies(draw: st.DrawFn) -> Any:
    body: dict[str, Any] = {}
    if draw(st.integers(0, 3)) > 0:
        body["external_ids"] = draw(
            st.lists(
                st.sampled_from([*EXTERNAL_IDS, *EXTERNAL_IDS, "nobody"]),
                min_size=1,
                max_size=4,
                unique=True,
            )
        )
    if draw(st.integers(0, 2)) == 0:
        extra = {"alias_name": "zz", "alias_label": "crm"}
        idx = draw(st.lists(st.integers(0, len(ALIASES)), min_size=1, max_size=2, unique=True))
        body["user_aliases"] = [copy.deepcopy([*ALIASES, extra][i]) for i in idx]
    if draw(st.integers(0, 3)) == 0:
        body["service_id"] = draw(pick(SERVICE_IDS))
    which = draw(st.integers(0, 5))
    if which == 0:
        body["device_id"] = draw(pick(["d1", "d2", "d3", "d9"]))
    elif which == 1:
        body["email_address"] = draw(pick([*EMAILS, BAD_EMAIL, "nobody@example.com"]))
    elif which == 2:
        body["phone"] = draw(pick([*PHONES, BAD_PHONE]))
    body["fields_to_export"] = draw(
        weighted(
            (10, st.lists(st.sampled_from(EXPORT_FIELDS), min_size=1, max_size=8, unique=True)),
            (10, st.just(list(EXPORT_FIELDS))),
            (1, pick([ABSENT, "email", ["email", "bogus", "nope"], None, []])),
        )
    )
    body = drop_absent(body)
    broken = draw(st.integers(0, 49))
    if broken == 0:
        body["external_ids"] = "u1"
    elif broken == 1:
        body["email_address"], body["phone"] = EMAILS[0], PHONES[0]
    elif broken == 2:
        body["service_id"] = 17
    elif broken == 3:
        body["user_aliases"] = [{"alias_name": "a1"}]
    elif broken == 4:
        return draw(pick([[], None, "x", "{}"]))
    return body


# --- identity requests -----------------------------------------------------------------------
NEW_IDS = ["u5", "u6"]  # rename targets nobody tracks: renames succeed often
ALL_IDS = [*EXTERNAL_IDS, *NEW_IDS]
ALIAS_NAMES = ["a1", "a2", "a3"]
ALIAS_LABELS = ["crm", "web"]
PRIORITIZATIONS = [
    ["identified", "most_recently_updated"],
    ["unidentified", "most_recently_updated"],
    ["most_recently_updated"],
    ["least_recently_updated"],
    ["identified", "least_recently_updated"],
    ["most_recently_updated", "identified"],
    ["identified"],  # ambiguous when two identified profiles share the address
    ["unidentified"],
]


def post(path: str) -> Any:
    return lambda body: {"method": "POST", "path": path, "body": body}


def lists(element: st.SearchStrategy, max_size: int = 3) -> st.SearchStrategy:
    return st.lists(element, min_size=1, max_size=max_size)


# -1: a valid request; 0 to 5: which defect (each branch of a body strategy is one defect).
# sampled_from rather than integers: Hypothesis favours small integers, not list positions.
DEFECT = st.sampled_from([-1] * 24 + list(range(6)))


def broken_at(draw: st.DrawFn, items: list, bad: Any) -> list:
    """The valid items with one broken item inserted at a random place."""
    at = draw(st.integers(0, len(items)))
    return [*items[:at], bad, *items[at:]]


merge_identifiers = weighted(
    (8, pick(ALL_IDS).map(lambda v: {"external_id": v})),
    (3, pick(ALIASES).map(lambda v: {"user_alias": v})),
    (2, pick(SERVICE_IDS).map(lambda v: {"service_id": v})),
    (
        4,
        st.tuples(pick(EMAILS), pick(PRIORITIZATIONS)).map(
            lambda t: {"email": t[0], "prioritization": t[1]}
        ),
    ),
    (
        2,
        st.tuples(pick(PHONES), pick(PRIORITIZATIONS)).map(
            lambda t: {"phone": t[0], "prioritization": t[1]}
        ),
    ),
    # prioritization beside a strong identifier is ignored, whatever it holds
    (1, pick(EXTERNAL_IDS).map(lambda v: {"external_id": v, "prioritization": "junk"})),
)
merge_updates = st.fixed_dictionaries(
    {"identifier_to_merge": merge_identifiers, "identifier_to_keep": merge_identifiers}
)
BAD_MERGE_SIDES: list[Any] = [
    {},
    {"external_id": "u1", "user_alias": ALIASES[0]},
    {"email": EMAILS[0], "phone": PHONES[0], "prioritization": ["identified"]},
    {"external_id": ""},
    {"external_id": 7},
    {"user_alias": {"alias_name": "a1"}},
    {"service_id": ""},
    {"email": BAD_EMAIL, "prioritization": ["identified"]},
    {"phone": BAD_PHONE, "prioritization": ["most_recently_updated"]},
    {"email": EMAILS[0]},
    {"email": EMAILS[0], "prioritization": []},
    {"phone": PHONES[0], "prioritization": ["newest"]},
    {"email": EMAILS[2], "prioritization": "identified"},
    {"email": EMAILS[2], "prioritization": ["identified", "unidentified"]},
]


@st.composite
def merge_bodies(draw: st.DrawFn) -> Any:
    updates = draw(lists(merge_updates, 4))
    broken = draw(DEFECT)
    if broken == 0:
        return draw(pick([[], None, "[1]", {}, {"merge_updates": []}, {"merge_updates": {}}]))
    if broken == 1:
        return {"merge_updates": [updates[0]] * 51}
    if broken == 2:
        bad = draw(
            pick(
                [
                    "x",
                    {"identifier_to_merge": {"external_id": "u1"}},
                    {"identifier_to_merge": {"external_id": "u1"}, "identifier_to_keep": "u2"},
                ]
            )
        )
        return {"merge_updates": broken_at(draw, updates, bad)}
    if broken == 3:
        side = draw(pick(BAD_MERGE_SIDES))
        good = draw(merge_identifiers)
        bad = draw(
            pick(
                [
                    {"identifier_to_merge": side, "identifier_to_keep": good},
                    {"identifier_to_merge": good, "identifier_to_keep": side},
                ]
            )
        )
        return {"merge_updates": broken_at(draw, updates, bad)}
    return {"merge_updates": updates}


alias_to_identify = st.fixed_dictionaries(
    {"external_id": pick(ALL_IDS), "user_alias": pick(ALIASES)}
)
email_to_identify = st.fixed_dictionaries(
    {"external_id": pick(ALL_IDS), "email": pick(EMAILS), "prioritization": pick(PRIORITIZATIONS)}
)
phone_to_identify = st.fixed_dictionaries(
    {"external_id": pick(ALL_IDS), "phone": pick(PHONES), "prioritization": pick(PRIORITIZATIONS)}
)
IDENTIFY_ELEMENTS = {
    "aliases_to_identify": alias_to_identify,
    "emails_to_identify": email_to_identify,
    "phone_numbers_to_identify": phone_to_identify,
}


@st.composite
def identify_bodies(draw: st.DrawFn) -> Any:
    arrays = draw(
        weighted(
            (4, st.just(["aliases_to_identify"])),
            (2, st.just(["emails_to_identify"])),
            (1, st.just(["phone_numbers_to_identify"])),
            (2, st.lists(st.sampled_from(sorted(IDENTIFY_ELEMENTS)), min_size=1, unique=True)),
        )
    )
    body: dict[str, Any] = {a: draw(lists(IDENTIFY_ELEMENTS[a])) for a in arrays}
    body["merge_behavior"] = draw(pick([ABSENT, "none", "merge", "merge"]))
    body = drop_absent(body)
    broken = draw(DEFECT)
    if broken == 0:
        return draw(pick([[], None, {}, {"merge_behavior": "merge"}]))
    first = sorted(arrays)[0]  # some array of the body
    if broken == 1:
        body[first] = draw(pick(["x", {"external_id": "u1"}]))
    elif broken == 2:
        body[first] = broken_at(draw, body[first], draw(pick([3, "x", ["u1"]])))
    elif broken == 3:
        body[first] = [body[first][0]] * 51
    elif broken == 4:
        body["merge_behavior"] = draw(pick(["all", "MERGE", ""]))
    elif broken == 5:
        item = draw(IDENTIFY_ELEMENTS[first])
        item["external_id"] = draw(pick(["", 17, ABSENT, " Guest ", "null", "N/A"]))
        body[first] = broken_at(draw, body[first], drop_absent(item))
    return body


rename_items = weighted(
    (
        12,
        st.fixed_dictionaries(
            {"current_external_id": pick(ALL_IDS), "new_external_id": pick(ALL_IDS)}
        ),
    ),
    (
        1,
        pick(
            [
                "u1",
                {"current_external_id": "u1"},
                {"current_external_id": "u1", "new_external_id": ""},
                {"current_external_id": 1, "new_external_id": "u5"},
                {"current_external_id": "u1", "new_external_id": "null"},
                {"current_external_id": "u2", "new_external_id": " Guest "},
            ]
        ),
    ),
)


@st.composite
def rename_bodies(draw: st.DrawFn) -> Any:
    broken = draw(DEFECT)
    if broken == 0:
        return draw(
            pick([[], None, {}, {"external_id_renames": []}, {"external_id_renames": "u1"}])
        )
    if broken == 1:
        item = {"current_external_id": "u1", "new_external_id": "u5"}
        return {"external_id_renames": [item] * 51}
    return {"external_id_renames": draw(lists(rename_items, 4))}


@st.composite
def remove_bodies(draw: st.DrawFn) -> Any:
    broken = draw(DEFECT)
    if broken == 0:
        return draw(pick([[], None, {}, {"external_ids": []}, {"external_ids": "u1"}]))
    if broken == 1:
        return {"external_ids": ["u1"] * 51}
    ids = weighted((12, pick(ALL_IDS)), (1, pick(["", 5, None, ["u1"]])))
    return {"external_ids": draw(lists(ids, 3))}


def alias_object(name: str, label: str, ext: Any) -> dict:
    return drop_absent({"alias_name": name, "alias_label": label, "external_id": ext})


alias_new_items = st.builds(
    alias_object,
    pick(ALIAS_NAMES),
    pick(ALIAS_LABELS),
    weighted((2, st.just(ABSENT)), (3, pick(ALL_IDS))),
)


@st.composite
def alias_new_bodies(draw: st.DrawFn) -> Any:
    items = draw(lists(alias_new_items))
    broken = draw(DEFECT)
    if broken == 0:
        return draw(pick([[], None, {}, {"user_aliases": []}, {"user_aliases": {}}]))
    if broken == 1:
        return {"user_aliases": [items[0]] * 51}
    if broken == 2:
        bad = draw(
            pick(
                [
                    "a1",
                    {"alias_name": "a1"},
                    {"alias_name": "", "alias_label": "crm"},
                    {"alias_name": "a1", "alias_label": 3},
                    {"alias_name": "a1", "alias_label": "crm", "external_id": ""},
                    {"alias_name": "a1", "alias_label": "crm", "external_id": 4},
                ]
            )
        )
        return {"user_aliases": broken_at(draw, items, bad)}
    return {"user_aliases": items}


alias_update_items = st.fixed_dictionaries(
    {
        "alias_label": pick(ALIAS_LABELS),
        "old_alias_name": pick(ALIAS_NAMES),
        "new_alias_name": pick(ALIAS_NAMES),
    }
)


@st.composite
def alias_update_bodies(draw: st.DrawFn) -> Any:
    items = draw(lists(alias_update_items))
    broken = draw(DEFECT)
    if broken == 0:
        return draw(pick([[], None, {}, {"alias_updates": []}, {"alias_updates": "x"}]))
    if broken == 1:
        return {"alias_updates": [items[0]] * 51}
    if broken == 2:
        bad = draw(
            pick(
                [
                    7,
                    {"alias_label": "crm", "old_alias_name": "a1"},
                    {"alias_label": "", "old_alias_name": "a1", "new_alias_name": "a2"},
                    {"alias_label": "crm", "old_alias_name": "a1", "new_alias_name": None},
                ]
            )
        )
        return {"alias_updates": broken_at(draw, items, bad)}
    return {"alias_updates": items}


@st.composite
def delete_bodies(draw: st.DrawFn) -> Any:
    keys = draw(
        st.lists(
            st.sampled_from(["external_ids", "user_aliases", "service_ids"]),
            min_size=1,
            unique=True,
        )
    )
    pools = {"external_ids": ALL_IDS, "user_aliases": ALIASES, "service_ids": SERVICE_IDS}
    body = {k: draw(st.lists(pick(pools[k]), min_size=1, max_size=2)) for k in keys}
    broken = draw(DEFECT)
    if broken == 0:
        return draw(pick([[], None, {}, {"user_alias": [ALIASES[0]]}]))
    if broken == 1:
        body["external_ids"] = draw(pick(["u1", [""], ["u1", 5], [None]]))
    elif broken == 2:
        body["service_ids"] = draw(pick([SERVICE_IDS[0], [""], [7]]))
    elif broken == 3:
        body["user_aliases"] = draw(pick([ALIASES[0], [{"alias_name": "a1"}], ["a1"]]))
    elif broken == 4:
        body = {"external_ids": ["u1"] * 30, "service_ids": [SERVICE_IDS[0]] * 21}
    return body


def subscription_users(draw: st.DrawFn, plural: bool) -> dict:
    """The users of one status/set entry: external IDs (deprecated, unknown and blocked ones
    among them), and emails or phones (in any spelling, invalid ones too)."""
    users: dict[str, Any] = {}
    name = "s" if plural else ""
    if draw(st.booleans()):
        ids = draw(lists(pick([*EXTERNAL_IDS, "nobody", BLOCKED_IDS[0]])))
        users[f"external_id{name}"] = ids if plural or len(ids) > 1 else draw(pick([ids, ids[0]]))
    kind = draw(pick(["email", "phone", None]))
    if kind is not None or not users:
        kind = kind or "email"
        values = draw(lists(pick([*(EMAILS if kind == "email" else PHONES), BAD_EMAIL if kind == "email" else BAD_PHONE])))
        users[f"{kind}{name}"] = values if plural or len(values) > 1 else draw(pick([values, values[0]]))
    return users


@st.composite
def subscription_entries(draw: st.DrawFn, plural: bool) -> Any:
    entry = {
        "subscription_group_id": draw(pick(["g1", "g2", "g3"])),
        "subscription_state": draw(pick(["subscribed", "unsubscribed"])),
        **subscription_users(draw, plural),
    }
    broken = draw(DEFECT)
    if broken == 0:
        entry["subscription_group_id"] = draw(pick(["", 7, None]))
    elif broken == 1:
        entry["subscription_state"] = draw(pick(["Subscribed", "opted_in", None]))
    elif broken == 2:
        entry["email" + ("s" if plural else "")] = EMAILS[:1]
        entry["phone" + ("s" if plural else "")] = PHONES[:1]
    elif broken == 3:
        entry = {k: v for k, v in entry.items() if k.startswith("subscription_")}
    elif broken == 4:
        entry["external_id" + ("s" if plural else "")] = draw(pick([[""], ["u1", 5], 5, [f"u{i}" for i in range(51)]]))
    elif broken == 5:
        entry["use_double_opt_in_logic"] = draw(pick([True, False, "yes"]))
    return entry


@st.composite
def subscription_set_v2_bodies(draw: st.DrawFn) -> Any:
    entries = draw(lists(subscription_entries(plural=True)))
    broken = draw(DEFECT)
    if broken == 0:
        return draw(pick([{}, {"subscription_groups": []}, {"subscription_groups": ["g1"]}, []]))
    return {"subscription_groups": entries}


OTHER_EMAILS = ["lone@example.com", "Lone@Example.com "]  # an address nobody holds


@st.composite
def email_write_bodies(draw: st.DrawFn, with_state: bool) -> Any:
    """`{"email": ...}` (and a state): held, unheld and invalid addresses, one or an array."""
    emails = draw(lists(pick([*EMAILS, *OTHER_EMAILS]), max_size=3))
    body: dict[str, Any] = {"email": draw(pick([emails, emails[0]]))}
    if with_state:
        body["subscription_state"] = draw(pick(["subscribed", "unsubscribed", "unsubscribed", "opted_in"]))
    broken = draw(DEFECT)
    if broken == 0:
        body["email"] = draw(pick([BAD_EMAIL, [EMAILS[0], 5], [], None, [f"u{i}@example.com" for i in range(51)]]))
    elif broken == 1 and with_state:
        body["subscription_state"] = draw(pick(["Subscribed", None]))
    elif broken == 2:
        return draw(pick([[EMAILS[0]], "ann@example.com"]))
    return body


@st.composite
def email_list_queries(draw: st.DrawFn) -> dict:
    """A list's query: the month of the clock, or one address, and paging; a defect at times."""
    query: dict[str, Any] = draw(pick([
        {"start_date": "2026-11-01", "end_date": "2026-12-01"},
        {"start_date": "2026-11-22", "end_date": "2026-11-22"},  # empty: the end day is left out
        {"email": draw(pick([*EMAILS, *OTHER_EMAILS]))},
    ]))
    if draw(st.booleans()):
        query["limit"] = draw(pick(["1", "2", 500]))
        query["offset"] = draw(pick(["0", "1", 3]))
    broken = draw(DEFECT)
    if broken == 0:
        query = {"end_date": "2026-12-01"}
    elif broken == 1:
        query["limit"] = draw(pick(["0", "501", "x"]))
    elif broken == 2:
        query = {"start_date": "2026-12-01", "end_date": "2026/12/02"}
    return query


def get(path: str) -> Any:
    return lambda query: {"method": "GET", "path": path, "body": None, "query": query}


requests = weighted(
    (12, track_bodies().map(post(TRACK_PATH))),
    (2, email_write_bodies(with_state=True).map(post(EMAIL_STATUS_PATH))),
    (1, email_write_bodies(with_state=False).map(post(EMAIL_BLOCKLIST_PATH))),
    (1, email_write_bodies(with_state=False).map(post(EMAIL_BOUNCE_REMOVE_PATH))),
    (1, email_write_bodies(with_state=False).map(post(EMAIL_SPAM_REMOVE_PATH))),
    (1, st.tuples(email_list_queries(), pick(["asc", "desc", None])).map(
        lambda t: get(EMAIL_UNSUBSCRIBES_PATH)({**t[0], **({"sort_direction": t[1]} if t[1] else {})}))),
    (1, email_list_queries().map(get(EMAIL_HARD_BOUNCES_PATH))),
    (3, subscription_entries(plural=False).map(post(SUBSCRIPTION_SET_PATH))),
    (2, subscription_set_v2_bodies().map(post(SUBSCRIPTION_SET_V2_PATH))),
    (1, fatal_track_bodies().map(post(TRACK_PATH))),
    (4, export_bodies().map(post(EXPORT_PATH))),
    (5, merge_bodies().map(post(MERGE_PATH))),
    (4, identify_bodies().map(post(IDENTIFY_PATH))),
    (3, rename_bodies().map(post(RENAME_PATH))),
    (2, remove_bodies().map(post(REMOVE_PATH))),
    (3, alias_new_bodies().map(post(ALIAS_NEW_PATH))),
    (2, alias_update_bodies().map(post(ALIAS_UPDATE_PATH))),
    (2, delete_bodies().map(post(DELETE_PATH))),
    (
        1,
        pick(
            [
                {"method": "GET", "path": TRACK_PATH, "body": None},
                {"method": "GET", "path": EXPORT_PATH, "body": None},
                {"method": "GET", "path": MERGE_PATH, "body": None},
                {"method": "PUT", "path": DELETE_PATH, "body": {"external_ids": ["u1"]}},
                {"method": "POST", "path": "/users/nope", "body": {}},
            ]
        ),
    ),
)


@st.composite
def population_objects(draw: st.DrawFn) -> dict:
    """An attributes object that creates (or fills) a profile of one of every kind."""
    kind = draw(st.sampled_from(["external_id", "external_id", "user_alias", "email", "phone"]))
    obj: dict[str, Any] = {}
    if kind == "external_id":
        obj["external_id"] = draw(pick(EXTERNAL_IDS))
        if draw(st.booleans()):
            obj["email"] = draw(pick(SHARED_EMAILS))
    elif kind == "user_alias":
        obj["user_alias"] = draw(pick(ALIASES))
        obj["_update_existing_only"] = False
    elif kind == "email":
        obj["email"] = draw(pick(EMAILS))
    else:
        obj["phone"] = draw(pick(PHONES))
    for field in draw(st.lists(st.sampled_from(sorted(FIELD_VALUES)), max_size=2, unique=True)):
        obj[field] = draw(pick(FIELD_VALUES[field][0]))
    for name in draw(st.lists(st.sampled_from(CUSTOM_NAMES), max_size=2, unique=True)):
        obj[name] = draw(pick(["gold", 3, ["a", "b"]]))
    if draw(st.integers(0, 2)) == 0:
        obj["push_tokens"] = draw(st.lists(pick(TOKENS), min_size=1, max_size=2))
    return obj


@st.composite
def population(draw: st.DrawFn) -> list[dict]:
    """A first track request that creates several profiles, so that identity requests find
    users to merge, identify, rename, alias and delete; often with some history."""
    objects = draw(st.lists(population_objects(), min_size=2, max_size=7))
    body: dict[str, Any] = {"attributes": objects}
    who = [
        {k: o[k] for k in ("external_id", "user_alias", "email", "phone") if k in o}
        for o in objects
    ]
    chosen = draw(st.lists(st.sampled_from(who), max_size=3))
    if chosen:
        body["events"] = [
            {**w, "name": draw(pick(["open", "buy"])), "time": draw(valid_times)} for w in chosen
        ]
        if draw(st.booleans()):
            body["purchases"] = [
                {
                    **w,
                    "product_id": "sku1",
                    "currency": "USD",
                    "price": 5,
                    "time": draw(valid_times),
                }
                for w in chosen[:1]
            ]
    return [{"method": "POST", "path": TRACK_PATH, "body": body}]


@st.composite
def chains(draw: st.DrawFn) -> list[dict]:
    """A few requests that meet on the same identifiers: the interactions of the issue (rename
    then rename back / remove / track the old ID; merge then track the merged ID, merge chains;
    identify then merge; alias new then update; delete then track). A first track request
    makes the participants exist (mostly: its objects may carry non-fatal errors)."""
    a, b, c = draw(st.permutations(EXTERNAL_IDS))[:3]
    new = draw(pick(NEW_IDS))
    alias = draw(pick(ALIASES))

    def profile(**ident: Any) -> dict:
        obj = {k: v for k, v in draw(attributes_objects()).items() if k not in STRONG_KEYS}
        obj.pop("push_token_import", None)
        return {**obj, **ident}

    def track(*objects: dict) -> dict:
        return post(TRACK_PATH)({"attributes": list(objects)})

    kind = draw(st.sampled_from(["rename", "merge", "identify", "alias", "delete"]))
    if kind == "rename":
        then = draw(
            pick(
                [
                    (RENAME_PATH, {"external_id_renames": [rename_item(new, a)]}),
                    (RENAME_PATH, {"external_id_renames": [rename_item(a, b)]}),
                    (REMOVE_PATH, {"external_ids": [a]}),
                    (REMOVE_PATH, {"external_ids": [new, a]}),
                ]
            )
        )
        after = draw(pick([track(profile(external_id=a)), post(MERGE_PATH)(merge_of(a, b))]))
        return [
            track(profile(external_id=a), profile(external_id=b)),
            post(RENAME_PATH)({"external_id_renames": [rename_item(a, new)]}),
            post(then[0])(then[1]),
            after,
        ]
    if kind == "merge":
        steps = [
            track(profile(external_id=a), profile(external_id=b), profile(external_id=c)),
            post(MERGE_PATH)(merge_of(a, b)),
            track(profile(external_id=a)),
        ]
        if draw(st.booleans()):
            steps.insert(2, post(MERGE_PATH)(merge_of(b, c)))
        return steps
    if kind == "identify":
        element = {"external_id": a, "user_alias": alias}
        body = drop_absent(
            {"aliases_to_identify": [element], "merge_behavior": draw(pick([ABSENT, "merge"]))}
        )
        keep = {"external_id": c}
        follow = draw(pick([merge_of(a, b), merge_update({"user_alias": alias}, keep)]))
        anonymous = profile(user_alias=alias, _update_existing_only=False)
        return [
            track(anonymous, profile(external_id=draw(pick([a, b])))),
            post(IDENTIFY_PATH)(body),
            post(MERGE_PATH)(follow),
        ]
    if kind == "alias":
        name = draw(pick(ALIAS_NAMES))
        item = drop_absent({**alias, "external_id": draw(pick([ABSENT, a]))})
        update = {"alias_label": alias["alias_label"], "old_alias_name": alias["alias_name"]}
        update["new_alias_name"] = name
        renamed = {"alias_name": name, "alias_label": alias["alias_label"]}
        return [
            track(profile(external_id=a)),
            post(ALIAS_NEW_PATH)({"user_aliases": [item]}),
            post(ALIAS_UPDATE_PATH)({"alias_updates": [update]}),
            draw(
                pick(
                    [
                        track({"user_alias": renamed, "nick": "renamed"}),
                        post(IDENTIFY_PATH)(
                            {"aliases_to_identify": [{"external_id": b, "user_alias": renamed}]}
                        ),
                    ]
                )
            ),
        ]
    delete = draw(pick([{"external_ids": [a]}, {"external_ids": [a], "user_aliases": [alias]}]))
    return [track(profile(external_id=a)), post(DELETE_PATH)(delete), track(profile(external_id=a))]


STRONG_KEYS = ("external_id", "user_alias", "service_id", "email", "phone")


def rename_item(current: str, new: str) -> dict:
    return {"current_external_id": current, "new_external_id": new}


def merge_update(source: dict, target: dict) -> dict:
    return {"merge_updates": [{"identifier_to_merge": source, "identifier_to_keep": target}]}


def merge_of(source: str, target: str) -> dict:
    return {
        "merge_updates": [
            {
                "identifier_to_merge": {"external_id": source},
                "identifier_to_keep": {"external_id": target},
            }
        ]
    }


steps = weighted((8, requests.map(lambda r: [r])), (2, chains()))
request_sequences = st.tuples(
    weighted((3, population()), (1, st.just([]))),
    st.lists(steps, min_size=1, max_size=7),
).map(lambda t: t[0] + [r for step in t[1] for r in step])


# --- comparison ------------------------------------------------------------------------------
def to_json(value: Any) -> str:
    """Type-strict canonical form: 1, 1.0 and true stay different."""
    return json.dumps(value, sort_keys=True, indent=1, ensure_ascii=False)


def assert_same(actual: Any, expected: Any, what: str) -> None:
    got, want = to_json(actual), to_json(expected)
    if got != want:
        diff = "\n".join(
            difflib.unified_diff(
                want.splitlines(),
                got.splitlines(),
                "model",
                "engine",
                lineterm="",
                n=2,
            )
        )
        raise AssertionError(f"{what}: engine differs from model\n{diff[:6000]}")


def assert_same_users(ws: Any, model: Model, what: str) -> None:
    """Every user as export shows it, and every subscription group state."""
    assert_same(ws.export_users(), model.export_users(), f"{what}: export_users()")
    states = ws.sql("SELECT service_id, group_id, state FROM subscriptions ORDER BY ALL").rows()
    assert_same([list(row) for row in states], [list(row) for row in model.subscription_states()],
                f"{what}: subscription group states")
    addresses = ws.sql("SELECT email, state, state_at, hard_bounced_at, spam_at FROM email_addresses ORDER BY email")
    assert_same([[str(v) for v in row] for row in addresses.rows()],
                [[str(v) for v in row] for row in model.email_address_rows()], f"{what}: email addresses")
    unsubscribed = ws.call("GET", EMAIL_UNSUBSCRIBES_PATH, query={"start_date": "2000-01-01", "end_date": "2100-01-01",
                                                                  "limit": 500})
    assert_same(unsubscribed.body, model.call("GET", EMAIL_UNSUBSCRIBES_PATH, query={
        "start_date": "2000-01-01", "end_date": "2100-01-01", "limit": 500})[1], f"{what}: unsubscribes")


def response_pair(response: Any) -> tuple[int, Any]:
    return response.status, response.body


def new_engine(tmp: str) -> Any:
    return Workspace.open(str(Path(tmp) / "store"), clock=clock, seed=SEED)


def close(ws: Any) -> None:
    closer = getattr(ws, "close", None)
    if callable(closer):
        closer()


def run_model(reqs: list[dict]) -> tuple[Model, list[tuple[int, Any]]]:
    model = Model(clock, SEED)
    responses = [model.call(r["method"], r["path"], copy.deepcopy(r["body"]), r.get("query")) for r in reqs]
    return model, responses


def describe(reqs: list[dict]) -> None:
    for i, r in enumerate(reqs):
        query = f" ?{json.dumps(r['query'])}" if r.get("query") else ""
        note(f"request {i}: {r['method']} {r['path']}{query} {json.dumps(r['body'])[:3000]}")


engine_only = pytest.mark.skipif(Workspace is None, reason="engagelake.Workspace not available")


def engine_settings(max_examples: int) -> settings:
    """Modest example counts (every example opens a store on disk); scale them with the
    ENGAGELAKE_PROPERTY_SCALE environment variable (e.g. 10 for a long run)."""
    scale = float(os.environ.get("ENGAGELAKE_PROPERTY_SCALE", "1"))
    return settings(
        max_examples=max(1, int(max_examples * scale)),
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.data_too_large,
        ],
    )


# --- fixed scenarios -----------------------------------------------------------------------
def track_request(**body: Any) -> dict:
    return {"method": "POST", "path": TRACK_PATH, "body": body}


def identity_request(path: str, **body: Any) -> dict:
    return {"method": "POST", "path": path, "body": body}


def merge_request(*pairs: tuple[dict, dict]) -> dict:
    updates = [{"identifier_to_merge": a, "identifier_to_keep": b} for a, b in pairs]
    return identity_request(MERGE_PATH, merge_updates=updates)


def ext(v: str) -> dict:
    return {"external_id": v}


T1 = "2026-11-20T00:00:00Z"
T2 = "2026-11-21T00:00:00Z"


def event(who: dict, name: str, time: str) -> dict:
    return {**who, "name": name, "time": time}


def purchase(who: dict, product: str, price: float, time: str) -> dict:
    return {**who, "product_id": product, "currency": "USD", "price": price, "time": time}


# Identity scenarios of the issue, run on every test run (call and one-apply mode).
IDENTITY_SEQUENCES: list[list[dict]] = [
    # chain A -> B then B -> C in one request: C ends with A's and B's data, fields taken from
    # the first profile in merge order that has them; tokens, events, purchases all move
    [
        track_request(
            attributes=[
                {
                    "external_id": "u1",
                    "first_name": "Ann",
                    "nick": "a",
                    "score": 1,
                    "push_tokens": [TOKENS[4]],
                    "language": "fr",
                    "email": "ann@example.com",
                },
                {"external_id": "u2", "last_name": "Lee", "nick": "b", "push_tokens": [TOKENS[0]]},
                {
                    "external_id": "u3",
                    "home_city": "Paris",
                    "push_tokens": [TOKENS[1]],
                    "email_subscribe": "opted_in",
                },
            ],
            events=[event(ext("u1"), "open", T1), event(ext("u2"), "open", T2)],
            purchases=[purchase(ext("u1"), "sku1", 9.99, T1), purchase(ext("u3"), "sku1", 5, T2)],
        ),
        merge_request((ext("u1"), ext("u2")), (ext("u2"), ext("u3")), (ext("u1"), ext("u3"))),
        track_request(attributes=[{"email": "ann@example.com", "hit": 1}]),
    ],
    # merge then track to the merged ID (a new profile, new service_id); the merged profile's
    # service_id and alias no longer resolve
    [
        track_request(
            attributes=[
                {"external_id": "u1", "first_name": "Al", "user_alias": None},
                {"user_alias": ALIASES[0], "_update_existing_only": False, "dob": "1990-02-28"},
                {"external_id": "u2", "first_name": "Bo"},
            ]
        ),
        merge_request(({"user_alias": ALIASES[0]}, ext("u1")), (ext("u1"), ext("u2"))),
        track_request(
            attributes=[
                {"external_id": "u1", "nick": "again"},
                {"service_id": SERVICE_IDS[0], "nick": "gone"},
                {"user_alias": ALIASES[0], "nick": "gone"},
            ]
        ),
        identity_request(
            EXPORT_PATH,
            external_ids=["u1", "u2"],
            user_aliases=[ALIASES[0]],
            service_id=SERVICE_IDS[1],
            fields_to_export=list(EXPORT_FIELDS),
        ),
    ],
    # rename then rename back: the old ID is deprecated, so the second fails; the deprecated ID
    # resolves in track, export, merge and delete until removed, then track creates anew
    [
        track_request(attributes=[{"external_id": "u1", "nick": "one"}, ext("u2")]),
        identity_request(
            RENAME_PATH,
            external_id_renames=[
                {"current_external_id": "u1", "new_external_id": "u5"},
                {"current_external_id": "u5", "new_external_id": "u1"},
                {"current_external_id": "u1", "new_external_id": "u6"},
                {"current_external_id": "u2", "new_external_id": "u5"},
            ],
        ),
        track_request(attributes=[{"external_id": "u1", "score": {"inc": 2}}]),
        identity_request(EXPORT_PATH, external_ids=["u1", "u5"], fields_to_export=["external_id"]),
        identity_request(REMOVE_PATH, external_ids=["u5", "u1", "u1", "u9", ""]),
        track_request(attributes=[{"external_id": "u1", "nick": "new"}]),
        merge_request((ext("u1"), ext("u5"))),
    ],
    # identify then merge: alias-only and email-only profiles identified into u2 (merge
    # behavior merge: email not copied), then merged away by email prioritization
    [
        track_request(
            attributes=[
                {"external_id": "u2", "email": "bob@example.com", "push_tokens": [TOKENS[2]]},
                {
                    "user_alias": ALIASES[1],
                    "_update_existing_only": False,
                    "first_name": "Web",
                    "email": "web@example.com",
                    "score": 3,
                    "push_tokens": [TOKENS[0]],
                },
                {"email": "ann@example.com", "phone": PHONES[0], "nick": "anon"},
                {"email": "cy@example.org", "nick": "cy"},
            ],
            events=[event({"email": "ann@example.com"}, "open", T1)],
        ),
        identity_request(
            IDENTIFY_PATH,
            aliases_to_identify=[{"external_id": "u2", "user_alias": ALIASES[1]}],
            emails_to_identify=[
                {
                    "external_id": "u2",
                    "email": " Ann@Example.COM ",
                    "prioritization": ["unidentified", "most_recently_updated"],
                },
                {"external_id": "u3", "email": "cy@example.org", "prioritization": ["identified"]},
            ],
            merge_behavior="merge",
        ),
        merge_request(
            (
                {"email": "CY@example.org", "prioritization": ["identified"]},
                {"email": "bob@example.com", "prioritization": ["most_recently_updated"]},
            ),
        ),
    ],
    # delete then track: a new profile with a new service_id; a deleted user's identifiers,
    # tokens and email resolve no more
    [
        track_request(
            attributes=[
                {"external_id": "u1", "email": "ann@example.com", "push_tokens": [TOKENS[0]]},
                {"user_alias": ALIASES[0], "_update_existing_only": False},
                {"external_id": "u2", "email": "ann@example.com"},
            ]
        ),
        identity_request(
            DELETE_PATH,
            external_ids=["u1", "u9"],
            user_aliases=[ALIASES[0], ALIASES[1]],
            service_ids=[SERVICE_IDS[0], SERVICE_IDS[2]],
        ),
        track_request(attributes=[{"external_id": "u1", "nick": "reborn"}]),
        track_request(attributes=[{"email": "ann@example.com", "hit": 1}]),
        identity_request(
            EXPORT_PATH, device_id="d1", service_id=SERVICE_IDS[0], fields_to_export=["service_id"]
        ),
    ],
    # aliases: new, label taken, update, identify with a taken label, identify with no merge
    [
        track_request(attributes=[ext("u1"), {"external_id": "u2", "nick": "two"}]),
        identity_request(
            ALIAS_NEW_PATH,
            user_aliases=[
                {"alias_name": "a1", "alias_label": "crm", "external_id": "u1"},
                {"alias_name": "a3", "alias_label": "crm", "external_id": "u1"},
                {"alias_name": "a1", "alias_label": "crm"},
                {"alias_name": "a3", "alias_label": "crm"},
                {"alias_name": "a2", "alias_label": "web", "external_id": "u9"},
                {"alias_name": "a2", "alias_label": "web"},
            ],
        ),
        identity_request(
            ALIAS_UPDATE_PATH,
            alias_updates=[
                {"alias_label": "crm", "old_alias_name": "a1", "new_alias_name": "a1"},
                {"alias_label": "crm", "old_alias_name": "a1", "new_alias_name": "a2"},
                {"alias_label": "crm", "old_alias_name": "a9", "new_alias_name": "a3"},
                {"alias_label": "web", "old_alias_name": "a2", "new_alias_name": "a3"},
            ],
        ),
        track_request(
            attributes=[
                {
                    "user_alias": ALIASES[2],
                    "_update_existing_only": False,
                    "nick": "anon",
                    "push_tokens": [TOKENS[1]],
                }
            ]
        ),
        identity_request(
            IDENTIFY_PATH,
            aliases_to_identify=[
                {"external_id": "u1", "user_alias": ALIASES[2]},  # u1 holds a crm alias
                {"external_id": "u2", "user_alias": ALIASES[2]},  # none: attributes dropped
                {"external_id": "u1", "user_alias": {"alias_name": "a3", "alias_label": "web"}},
                {"external_id": "u4", "user_alias": {"alias_name": "a3", "alias_label": "web"}},
            ],
        ),
    ],
]


# Scenarios that random generation reaches only rarely; they run on every test run.
TRICKY_SEQUENCES: list[list[dict]] = [
    # same-email propagation touches u1 and u3 with one object: a recency tie on
    # (updated_at, update_seq), broken by creation order (u3, created later, wins)
    [
        track_request(attributes=[{"external_id": "u1", "email": " Ann@Example.COM "}]),
        track_request(
            attributes=[
                {"external_id": "u3", "email": "ann@example.com", "email_subscribe": "opted_in"},
                {"email": "ANN@example.com", "hit": 1},
            ]
        ),
    ],
    # a profile losing a push token is touched by the object that takes it: tie again
    [
        track_request(
            attributes=[
                {"external_id": "u1", "email": "a@b.co", "push_tokens": [TOKENS[0]]},
                {"external_id": "u2", "email": "a@b.co"},
                {"external_id": "u2", "push_tokens": [TOKENS[0]]},
                {"email": "a@b.co", "hit": 1},
            ]
        ),
    ],
    # an object rejected by a state check leaves no trace for later type checks
    [
        track_request(attributes=[{"external_id": "u3", "nick": True}]),
        track_request(
            attributes=[{"external_id": "u3", "score": {"inc": 3}, "nick": {"add": ["b"]}}]
        ),
        track_request(attributes=[{"external_id": "u3", "score": {"add": [1]}}]),
    ],
    # user_alias without alias_label is an invalid identifier, checked before anything else
    [
        track_request(
            events=[
                {"user_alias": {"alias_name": "a1"}, "name": "x", "time": "2026-11-21T00:00:00Z"}
            ],
            attributes=[{"user_alias": {"alias_name": "a1"}, "$bad": 1}],
        ),
    ],
    # push tokens and devices keep the order received
    [
        track_request(
            attributes=[
                {"external_id": "u1", "push_tokens": [TOKENS[4], TOKENS[0]]},
                {"external_id": "u1", "push_tokens": [TOKENS[1]]},
            ]
        ),
    ],
]


def with_examples(sequences: list[list[dict]]) -> Any:
    """@example(reqs=...) for every fixed sequence."""

    def decorate(test: Any) -> Any:
        for reqs in reversed(sequences):
            test = example(reqs=reqs)(test)
        return test

    return decorate


# --- the properties --------------------------------------------------------------------------
@pytest.mark.slow
@engine_only
@engine_settings(12)
@given(reqs=request_sequences)
@with_examples(IDENTITY_SEQUENCES)
def test_call_mode_matches_model(reqs: list[dict]) -> None:
    describe(reqs)
    model = Model(clock, SEED)
    with tempfile.TemporaryDirectory() as tmp:
        ws = new_engine(tmp)
        try:
            for i, r in enumerate(reqs):
                want = model.call(r["method"], r["path"], copy.deepcopy(r["body"]), r.get("query"))
                got = ws.call(r["method"], r["path"], body=copy.deepcopy(r["body"]), query=r.get("query"))
                assert_same(response_pair(got), want, f"response to request {i}")
            assert_same_users(ws, model, "final")
        finally:
            close(ws)


@pytest.mark.slow
@engine_only
@engine_settings(24)
@given(reqs=request_sequences)
@with_examples(TRICKY_SEQUENCES + IDENTITY_SEQUENCES)
def test_apply_mode_matches_model(reqs: list[dict]) -> None:
    describe(reqs)
    model, want = run_model(reqs)
    with tempfile.TemporaryDirectory() as tmp:
        ws = new_engine(tmp)
        try:
            got = ws.apply(copy.deepcopy(reqs))
            assert len(got) == len(reqs)
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                assert_same(response_pair(g), w, f"response to request {i}")
            assert_same_users(ws, model, "final")
        finally:
            close(ws)


@pytest.mark.slow
@engine_only
@engine_settings(16)
@given(reqs=request_sequences)
@with_examples(TRICKY_SEQUENCES + IDENTITY_SEQUENCES)
def test_apply_with_staged_passes_matches_model(reqs: list[dict]) -> None:
    """As one apply, with every pass (of one request) staged to disk (`store/staging.py`), and
    the stored rows of the users the track requests name read ahead (`store/ahead.py`)."""
    describe(reqs)
    model, want = run_model(reqs)
    limits = batch_module.STAGE_ROWS, batch_module.TRACK_RUN_MAX, batch_module.READ_AHEAD_MIN_ROWS
    batch_module.STAGE_ROWS, batch_module.TRACK_RUN_MAX, batch_module.READ_AHEAD_MIN_ROWS = 1, 1, 0
    with tempfile.TemporaryDirectory() as tmp:
        ws = new_engine(tmp)
        try:
            got = ws.apply(copy.deepcopy(reqs))
            assert len(got) == len(reqs)
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                assert_same(response_pair(g), w, f"response to request {i}")
            assert_same_users(ws, model, "final")
        finally:
            batch_module.STAGE_ROWS, batch_module.TRACK_RUN_MAX, batch_module.READ_AHEAD_MIN_ROWS = limits
            close(ws)


@pytest.mark.slow
@engine_only
@engine_settings(16)
@given(reqs=request_sequences, data=st.data())
def test_apply_in_chunks_matches_model(reqs: list[dict], data: st.DataObject) -> None:
    describe(reqs)
    cuts = data.draw(st.lists(st.booleans(), min_size=len(reqs) - 1, max_size=len(reqs) - 1))
    chunks: list[list[dict]] = [[reqs[0]]]
    for cut, r in zip(cuts, reqs[1:], strict=True):
        if cut:
            chunks.append([r])
        else:
            chunks[-1].append(r)
    note(f"chunk sizes: {[len(c) for c in chunks]}")
    model, want = run_model(reqs)
    with tempfile.TemporaryDirectory() as tmp:
        ws = new_engine(tmp)
        try:
            got = [resp for chunk in chunks for resp in ws.apply(copy.deepcopy(chunk))]
            assert len(got) == len(reqs)
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                assert_same(response_pair(g), w, f"response to request {i}")
            assert_same_users(ws, model, "final")
        finally:
            close(ws)


@pytest.mark.slow
@engine_only
@engine_settings(16)
@given(reqs=request_sequences, data=st.data())
def test_layered_workspace_matches_model(reqs: list[dict], data: st.DataObject) -> None:
    """Through the in-memory layer (`store/layer.py`): `apply` in random chunks, the layer
    flushed at random points, and dropped at others as a killed process leaves it (its log
    replayed by the next open); every response, and the final export, as the model's."""
    describe(reqs)
    steps = data.draw(st.lists(st.sampled_from(["none", "none", "flush", "drop"]), min_size=len(reqs),
                               max_size=len(reqs)))
    # flushes due after every batch (each written in a thread of its own while the next batches
    # read over it), after a hundredth of a second (the flusher's), or never but where asked
    rows, seconds = data.draw(st.sampled_from([(10**9, 3600.0), (1, 3600.0), (10**9, 0.01)]))
    note(f"after each request: {steps}; flushed after {rows} rows or {seconds} s")
    model, want = run_model(reqs)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "store")

        def layered() -> Any:
            return Workspace.open(path, clock=clock, seed=SEED, layer=True, flush_seconds=seconds, flush_rows=rows)

        ws = layered()
        try:
            got = []
            for r, step in zip(reqs, steps, strict=True):
                got += ws.apply([copy.deepcopy(r)])
                if step == "flush":
                    ws.flush()
                elif step == "drop":  # the lock and the layer go as a killed process's do
                    ws.layer.drop()
                    ws = layered()
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                assert_same(response_pair(g), w, f"response to request {i}")
            assert_same_users(ws, model, "final, through the layer")
            ws.close()
            assert_same_users(new_engine(tmp), model, "final, flushed")
        finally:
            close(ws)
