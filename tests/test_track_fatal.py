"""/users/track fatal checks: status 400, `{"message": m, "errors": [m]}`, nothing applied."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from tests.helpers import (
    ALL_FIELDS,
    NOW,
    SEED,
    TRACK,
    alias,
    copy_of,
    event,
    exists,
    export,
    open_ws,
    purchase,
    service_id,
    track,
    track_ok,
)

from engagelake import Response, Workspace
from engagelake.rules.messages import (
    FATAL_BLOCKED_EXTERNAL_ID,
    FATAL_BODY_NOT_OBJECT,
    FATAL_ELEMENT_NOT_OBJECT,
    FATAL_NO_ARRAYS,
    FATAL_NOT_ARRAY,
    FATAL_TOO_MANY,
    FATAL_TOO_MANY_UPDATES,
)
from engagelake.workspace import MAU_UPDATES_PER_REQUEST

TABLES = (
    "profiles", "attributes", "events", "purchases", "aliases", "push_tokens", "subscriptions",
    "external_ids",
)


def fatal(message: str) -> Response:
    return Response(400, {"message": message, "errors": [message]})


def seeded(tmp_path):
    """A store holding the user "seed" with every kind of row (a copy of one built once)."""
    return copy_of(tmp_path, _seed)


def _seed(ws: Workspace) -> None:
    track_ok(
        ws,
        attributes=[
            {
                "external_id": "seed",
                "a": 1,
                "tags": ["x"],
                "first_name": "Seed",
                "email": "seed@example.com",
                "push_tokens": [{"app_id": "app", "token": "T0", "device_id": "d0"}],
                "subscription_groups": [
                    {"subscription_group_id": "g1", "subscription_state": "subscribed"}
                ],
            }
        ],
        events=[event("played", external_id="seed")],
        purchases=[purchase("sku", 3.0, external_id="seed")],
    )


def snapshot(ws) -> tuple[Any, dict[str, int]]:
    """Everything the API shows of the seeded user and of the would-be users, plus table sizes."""
    r = export(
        ws,
        ALL_FIELDS,
        external_ids=["seed", "new1", "new2", "new3"],
        user_aliases=[alias("al")],
    )
    assert r.status == 200
    by_device = export(ws, ALL_FIELDS, device_id="dX")
    by_email = export(ws, ALL_FIELDS, email_address="fresh@example.com")
    return (r.body, by_device.body, by_email.body), {t: ws.table(t).collect().height for t in TABLES}


def valid_body() -> dict[str, Any]:
    """A request that would change the seeded user and create users, were it applied."""
    return {
        "attributes": [
            {
                "external_id": "seed",
                "a": {"inc": 5},
                "tags": {"add": ["y"]},
                "first_name": "Changed",
                "push_tokens": [{"app_id": "app", "token": "T0", "device_id": "dX"}],
            },
            {"external_id": "new1", "b": 1},
            {"user_alias": alias("al"), "_update_existing_only": False, "c": 1},
            {"email": "fresh@example.com", "d": 1},
        ],
        "events": [event("played", external_id="seed"), event("opened", external_id="new2")],
        "purchases": [purchase("sku", 5.0, external_id="seed"), purchase(external_id="new3")],
    }


def with_(**changes: Any) -> dict[str, Any]:
    body = valid_body()
    body.update(copy.deepcopy(changes))
    return body


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> tuple[Workspace, Any]:
    """One seeded store for this module's fatal requests (a 400 writes nothing, so they can share
    it; each test checks that its request left the snapshot as it was) and its snapshot."""
    ws = seeded(tmp_path_factory.mktemp("fatal"))
    return ws, snapshot(ws)


def assert_fatal_changes_nothing(refused: tuple[Workspace, Any], body: Any, message: str) -> None:
    ws, before = refused
    assert ws.call("POST", TRACK, body=body) == fatal(message)
    assert snapshot(ws) == before


def test_the_valid_body_does_change_the_store(tmp_path):
    # guards the tests below: without the fatal flaw the same request is applied
    ws = seeded(tmp_path)
    before = snapshot(ws)
    r = track(ws, **valid_body())
    assert r.status == 201
    assert "errors" not in r.body
    assert snapshot(ws) != before
    assert all(exists(ws, x) for x in ("new1", "new2", "new3"))


@pytest.mark.parametrize("body", [None, [], [valid_body()], "null", 7, True])
def test_body_not_an_object(refused, body):
    assert_fatal_changes_nothing(refused, body, FATAL_BODY_NOT_OBJECT)


@pytest.mark.parametrize(
    "body",
    [{}, {"attribute": [{"external_id": "new1"}]}, {"users": [], "event": [], "purchase": []}],
)
def test_no_known_array(refused, body):
    assert_fatal_changes_nothing(refused, body, FATAL_NO_ARRAYS)


@pytest.mark.parametrize("array", ["attributes", "events", "purchases"])
@pytest.mark.parametrize("value", [None, {"external_id": "new1"}, "[]", 3, True])
def test_array_not_an_array(refused, array, value):
    assert_fatal_changes_nothing(
        refused, with_(**{array: value}), FATAL_NOT_ARRAY.format(array=array)
    )


def many(array: str, n: int) -> list[dict[str, Any]]:
    if array == "attributes":
        return [{"external_id": f"bulk{i}", "n": i} for i in range(n)]
    if array == "events":
        return [event(external_id=f"bulk{i}") for i in range(n)]
    return [purchase(external_id=f"bulk{i}") for i in range(n)]


@pytest.mark.parametrize("array", ["attributes", "events", "purchases"])
def test_more_than_75_objects(refused, tmp_path, array):
    assert_fatal_changes_nothing(
        refused, with_(**{array: many(array, 76)}), FATAL_TOO_MANY.format(array=array)
    )
    ws = open_ws(tmp_path, "other")
    assert track(ws, **{array: many(array, 76)}) == fatal(FATAL_TOO_MANY.format(array=array))
    assert ws.table("profiles").collect().height == 0


@pytest.mark.parametrize("array", ["attributes", "events", "purchases"])
def test_exactly_75_objects_is_accepted(tmp_path, array):
    ws = open_ws(tmp_path)
    r = track(ws, **{array: many(array, 75)})
    assert r == Response(201, {"message": "success", f"{array}_processed": 75})
    assert exists(ws, "bulk0") and exists(ws, "bulk74")


# --- monthly-active-user plans: at most 50 attributes, events and purchases together ---------------


def mau_ws(tmp_path, name: str = "mau"):
    return Workspace.open(tmp_path / name, clock=lambda: NOW, seed=SEED, monthly_active_user_plan=True)


def split(n: int) -> dict[str, list[dict[str, Any]]]:
    """`n` objects spread over the three arrays (attributes get the remainder)."""
    third = n // 3
    return {"attributes": many("attributes", n - 2 * third), "events": many("events", third),
            "purchases": many("purchases", third)}


def test_the_cap_is_off_by_default(tmp_path):
    ws = open_ws(tmp_path)
    r = track(ws, **split(75))
    assert r.status == 201 and r.body["attributes_processed"] == 25  # type: ignore[index]


def test_a_plan_accepts_50_updates_together(tmp_path):
    ws = mau_ws(tmp_path)
    assert MAU_UPDATES_PER_REQUEST == 50
    r = track(ws, **split(50))
    assert r == Response(201, {"message": "success", "attributes_processed": 18, "events_processed": 16,
                               "purchases_processed": 16})


@pytest.mark.parametrize("arrays", [["attributes"], ["events"], ["attributes", "events", "purchases"]])
def test_a_plan_refuses_51_updates_and_applies_nothing(tmp_path, arrays):
    ws = mau_ws(tmp_path)
    body = {a: v for a, v in split(51).items() if a in arrays} if len(arrays) > 1 else {arrays[0]: many(arrays[0], 51)}
    message = FATAL_TOO_MANY_UPDATES.format(limit=50)
    assert track(ws, **body) == fatal(message)
    assert ws.table("profiles").collect().height == 0
    # in a batch, only the refused request is refused
    ok = {"attributes": [{"external_id": "solo", "n": 1}]}
    out = ws.apply([{"method": "POST", "path": TRACK, "body": body}, {"method": "POST", "path": TRACK, "body": ok}])
    assert out == [fatal(message), Response(201, {"message": "success", "attributes_processed": 1})]
    assert exists(ws, "solo") and not exists(ws, "bulk0")


def test_an_array_over_75_still_names_the_array_on_a_plan(tmp_path):
    ws = mau_ws(tmp_path)
    assert track(ws, events=many("events", 76)) == fatal(FATAL_TOO_MANY.format(array="events"))


@pytest.mark.parametrize("array", ["attributes", "events", "purchases"])
@pytest.mark.parametrize("bad", [5, "x", None, [], [{"external_id": "new1"}]])
def test_element_not_an_object(refused, array, bad):
    body = valid_body()
    body[array] = [body[array][0], bad, body[array][1]]
    assert_fatal_changes_nothing(
        refused, body, FATAL_ELEMENT_NOT_OBJECT.format(array=array, index=1)
    )


def test_element_not_an_object_names_the_first_offending_index(refused):
    body = valid_body()
    body["events"] = [body["events"][0], body["events"][1], "x", 4, None]
    assert_fatal_changes_nothing(
        refused, body, FATAL_ELEMENT_NOT_OBJECT.format(array="events", index=2)
    )


@pytest.mark.parametrize(
    "blocked",
    [
        "", "null", "none", "nil", "undefined", "n/a", "na", "unknown", "0", "-1",
        "[object object]", "anonymous", "guest", "user", "test",
        " NULL ", "None", "N/A", "[object Object]", "\tGuest\n", "  ", "Test", "UNDEFINED",
    ],
)
def test_blocked_external_id_in_attributes(refused, blocked):
    body = valid_body()
    body["attributes"].append({"external_id": blocked, "a": 1})
    assert_fatal_changes_nothing(refused, body, FATAL_BLOCKED_EXTERNAL_ID)


@pytest.mark.parametrize("array", ["events", "purchases"])
@pytest.mark.parametrize("blocked", ["anonymous", " Unknown", "-1"])
def test_blocked_external_id_in_events_and_purchases(refused, array, blocked):
    body = valid_body()
    body[array][1]["external_id"] = blocked
    assert_fatal_changes_nothing(refused, body, FATAL_BLOCKED_EXTERNAL_ID)


def test_blocked_external_id_beside_another_identifier_is_still_fatal(refused):
    body = valid_body()
    body["attributes"].append({"external_id": "guest", "user_alias": alias("al")})
    assert_fatal_changes_nothing(refused, body, FATAL_BLOCKED_EXTERNAL_ID)


NEAR_MISSES = ["guest1", "testing", "null0", "0.0", "-10", "users", "n-a"]


def test_ids_that_only_resemble_blocked_ones_are_accepted(tmp_path):
    # one request per id, applied as one batch (one commit; a batch answers as its calls would)
    ws = open_ws(tmp_path)
    rs = ws.apply([{"method": "POST", "path": TRACK, "body": {"attributes": [{"external_id": near_miss, "a": 1}]}}
                   for near_miss in NEAR_MISSES])
    assert [r.status for r in rs] == [201] * len(NEAR_MISSES), rs
    assert [near_miss for near_miss in NEAR_MISSES if not exists(ws, near_miss)] == []


# --- order of the fatal checks ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # no array at all beats everything about other keys
        ({"attribute": 5}, FATAL_NO_ARRAYS),
        # arrays in the order attributes, events, purchases
        ({"purchases": "x", "events": "x", "attributes": "x"}, FATAL_NOT_ARRAY.format(array="attributes")),
        ({"purchases": "x", "events": "x", "attributes": []}, FATAL_NOT_ARRAY.format(array="events")),
        # each array fully checked (not array, too many, elements) before the next one
        (
            {"attributes": many("attributes", 76), "events": None},
            FATAL_TOO_MANY.format(array="attributes"),
        ),
        (
            {"attributes": [{"external_id": "a"}, 3], "events": 7},
            FATAL_ELEMENT_NOT_OBJECT.format(array="attributes", index=1),
        ),
        (
            {"events": [1] * 80, "purchases": 1},
            FATAL_TOO_MANY.format(array="events"),
        ),
        # shape of all arrays before blocked external IDs
        (
            {"attributes": [{"external_id": "null"}], "purchases": [purchase(external_id="p"), 5]},
            FATAL_ELEMENT_NOT_OBJECT.format(array="purchases", index=1),
        ),
        (
            {"attributes": [{"external_id": "guest"}], "purchases": many("purchases", 76)},
            FATAL_TOO_MANY.format(array="purchases"),
        ),
    ],
)
def test_fatal_check_order(refused, body, message):
    assert_fatal_changes_nothing(refused, body, message)


def test_fatal_request_in_a_batch_leaves_the_others_applied(tmp_path):
    ws = open_ws(tmp_path)
    rs = ws.apply(
        [
            {"method": "POST", "path": TRACK, "body": {"attributes": [{"external_id": "u1", "a": 1}]}},
            {
                "method": "POST",
                "path": TRACK,
                "body": {
                    "attributes": [{"external_id": "u1", "a": {"inc": 1}}, {"external_id": "u2"}],
                    "events": [event(external_id="u1"), event(external_id="undefined")],
                },
            },
            {"method": "POST", "path": TRACK, "body": {"attributes": [{"external_id": "u3", "b": 2}]}},
        ]
    )
    assert [r.status for r in rs] == [201, 400, 201]
    assert rs[1] == fatal(FATAL_BLOCKED_EXTERNAL_ID)
    users = export(ws, ["external_id", "custom_attributes", "custom_events", "service_id"],
                   external_ids=["u1", "u2", "u3"]).body
    assert users["users"] == [
        {"external_id": "u1", "custom_attributes": {"a": 1}, "service_id": service_id(0)},
        {"external_id": "u3", "custom_attributes": {"b": 2}, "service_id": service_id(1)},
    ]
    assert users["invalid_user_ids"] == ["u2"]
