"""/users/track events and purchases: appended without dedupe, validated, counted."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from tests.helpers import (
    NOW,
    custom_attributes,
    err,
    errors,
    event,
    exists,
    export_one,
    field,
    iso,
    only_error,
    purchase,
    track,
    track_ok,
    ts,
)

from engagelake.rules.messages import (
    ERR_APP_ID,
    ERR_ATTRIBUTE_NAME,
    ERR_CURRENCY,
    ERR_EVENT_NAME,
    ERR_PRICE,
    ERR_PRODUCT_ID,
    ERR_PROPERTIES,
    ERR_PROPERTIES_SIZE,
    ERR_PROPERTY_NAME,
    ERR_QUANTITY,
    ERR_TIME,
)

YESTERDAY = NOW - timedelta(days=1)



def summary(name: str, first, last, count: int) -> dict[str, Any]:
    return {"name": name, "first": ts(first), "last": ts(last), "count": count}


DROP = object()  # a field value meaning "leave this key out"


def ev(**fields: Any) -> dict[str, Any]:
    """An event for u1; keyword arguments override or add fields (DROP removes the key)."""
    obj = {"external_id": "u1", **event("played"), **fields}
    return {k: v for k, v in obj.items() if v is not DROP}


def pu(**fields: Any) -> dict[str, Any]:
    obj = {"external_id": "u1", **purchase("sku", 10.0), **fields}
    return {k: v for k, v in obj.items() if v is not DROP}


def events_of(ws, external_id: str = "u1") -> list[dict[str, Any]] | None:
    return field(ws, external_id, "custom_events")


def refuse_each(ws, array: str, objects: list[dict[str, Any]], message: str) -> None:
    """Send the cases of a rule as the objects of one request's `array` (instead of a store and a
    request each); assert that each object, and only it, is refused with `message`."""
    r = track(ws, **{array: objects})
    assert errors(r) == [err(message, array, i) for i in range(len(objects))], r.body
    assert r.body[f"{array}_processed"] == 0


# --- appended, never deduplicated -------------------------------------------------------------------


def test_identical_events_are_all_kept(ws):
    r = track(ws, events=[ev(), ev()])
    assert r.body == {"message": "success", "events_processed": 2}
    assert events_of(ws) == [summary("played", NOW, NOW, 2)]
    track_ok(ws, events=[ev()])
    assert events_of(ws) == [summary("played", NOW, NOW, 3)]
    assert ws.table("events").collect().height == 3


def test_identical_purchases_are_all_kept(ws):
    r = track(ws, purchases=[pu(), pu()])
    assert r.body == {"message": "success", "purchases_processed": 2}
    assert export_one(ws, "u1", ["purchases", "total_revenue"]) == {
        "purchases": [summary("sku", NOW, NOW, 2)],
        "total_revenue": 20.0,
    }
    assert ws.table("purchases").collect().height == 2


def test_event_summaries_per_name(ws):
    track_ok(
        ws,
        events=[
            ev(name="b", time=iso(YESTERDAY)),
            ev(name="a"),
            ev(name="b", time=iso(NOW - timedelta(days=3))),
            ev(name="b"),
        ],
    )
    assert events_of(ws) == [
        summary("a", NOW, NOW, 1),
        summary("b", NOW - timedelta(days=3), NOW, 3),
    ]


def test_event_properties_are_not_kept_on_the_profile(ws):
    track_ok(ws, events=[ev(properties={"plan": "pro", "seats": 3})])
    assert custom_attributes(ws, "u1") == {}
    assert ws.table("events").collect().height == 1


def test_events_never_change_profile_fields(ws):
    track_ok(ws, events=[ev(first_name="Ev", email="ev@example.com", tier="gold")])
    assert export_one(ws, "u1", ["first_name", "email", "custom_attributes"]) == {}


# --- event validation -------------------------------------------------------------------------------


def test_invalid_event_name(ws):
    refuse_each(ws, "events", [ev(name=name) for name in ("", 5, None, DROP, ["played"], "n" * 256)], ERR_EVENT_NAME)
    assert not exists(ws, "u1")


def test_event_name_of_255_characters(ws):
    track_ok(ws, events=[ev(name="n" * 255)])
    assert [s["name"] for s in events_of(ws)] == ["n" * 255]


TIMES = [
        ("2026-11-20T10:00:00Z", "2026-11-20T10:00:00.000Z"),
        ("2026-11-20T10:00:00.123Z", "2026-11-20T10:00:00.123Z"),
        ("2026-11-20T10:00:00.5+00:00", "2026-11-20T10:00:00.500Z"),
        ("2026-11-20T10:00:00+02:00", "2026-11-20T08:00:00.000Z"),
        ("2026-11-20T10:00:00-0530", "2026-11-20T15:30:00.000Z"),
        ("2026-11-21T23:30:00-02:00", "2026-11-22T01:30:00.000Z"),
        ("2026-11-20T10:00:00:250Z", "2026-11-20T10:00:00.250Z"),
        ("2026-11-20T10:00:00:000-0500", "2026-11-20T15:00:00.000Z"),
        ("2026-11-20T10:00:00:999+01:00", "2026-11-20T09:00:00.999Z"),
]


def test_accepted_time_formats_are_stored_in_utc(ws):
    # one request: each time on a user of its own
    track_ok(ws, events=[ev(external_id=f"e{i}", time=given) for i, (given, _) in enumerate(TIMES)],
             purchases=[pu(external_id=f"e{i}", time=given) for i, (given, _) in enumerate(TIMES)])
    for i, (given, stored) in enumerate(TIMES):
        expected = {"name": "played", "first": stored, "last": stored, "count": 1}
        assert events_of(ws, f"e{i}") == [expected], given
        assert field(ws, f"e{i}", "purchases") == [{**expected, "name": "sku"}], given


BAD_TIMES = [
        "2026-11-20T10:00:00",
        "2026-11-20T10:00:00.123",
        "2026-11-20T10:00:00:000",
        "2026-11-20",
        "2026-11-20T10:00Z",
        "20-11-2026T10:00:00Z",
        "2026-02-30T10:00:00Z",
        "2026-11-20T25:00:00Z",
        "2026-11-20T10:00:00+25:00",
        "yesterday",
        "",
        1763632800,
        None,
        DROP,
]


def test_invalid_time(ws):
    refuse_each(ws, "events", [ev(time=time) for time in BAD_TIMES], ERR_TIME)
    refuse_each(ws, "purchases", [pu(time=time) for time in BAD_TIMES], ERR_TIME)
    assert not exists(ws, "u1")


def test_invalid_app_id(ws):
    app_ids = [5, ["ios"], {"id": "ios"}, True]
    refuse_each(ws, "events", [ev(app_id=app_id) for app_id in app_ids], ERR_APP_ID)
    refuse_each(ws, "purchases", [pu(app_id=app_id) for app_id in app_ids], ERR_APP_ID)


def test_app_id_string_is_accepted(ws):
    track_ok(ws, events=[ev(app_id="ios-app")], purchases=[pu(app_id="ios-app")])
    assert ws.table("events").collect()["app_id"].to_list() == ["ios-app"]


# --- properties --------------------------------------------------------------------------------------


def test_properties_must_be_an_object(ws):
    not_objects = [[], ["a"], "plan=pro", 5, True]
    refuse_each(ws, "events", [ev(properties=props) for props in not_objects], ERR_PROPERTIES)
    refuse_each(ws, "purchases", [pu(properties=props) for props in not_objects], ERR_PROPERTIES)


def test_null_properties_are_absent(ws):
    track_ok(ws, events=[ev(properties=None)], purchases=[pu(properties=None)])
    assert events_of(ws)[0]["count"] == 1


def test_invalid_property_names(ws):
    props = [{"ok": 1, name: "x"} for name in ("$plan", "$", "", "p" * 255, "q" * 300)]
    refuse_each(ws, "events", [ev(properties=p) for p in props], ERR_PROPERTY_NAME)
    refuse_each(ws, "purchases", [pu(properties=p) for p in props], ERR_PROPERTY_NAME)
    assert not exists(ws, "u1")


def test_property_names_up_to_254_characters(ws):
    track_ok(
        ws,
        events=[ev(properties={"p" * 254: 1, "a$b": 2, "nested": {"k": [1, 2]}})],
        purchases=[pu(properties={"p" * 254: 1})],
    )
    assert ws.table("events").collect().height == 1
    assert ws.table("purchases").collect().height == 1


def flat_props(size: int) -> dict[str, str]:
    """Properties without arrays or objects whose compact JSON is exactly `size` bytes."""
    props = {"s": "x" * (size - 8)}
    assert len(b'{"s":""}') == 8
    return props


def nested_props(size: int) -> dict[str, list[str]]:
    """Properties holding an array whose compact JSON is exactly `size` bytes."""
    return {"a": ["x" * (size - 10)]}


@pytest.mark.parametrize(
    "props",
    [flat_props(49_000), nested_props(60_000), nested_props(99_000)],
    ids=["flat-49000", "nested-60000", "nested-99000"],
)
def test_properties_within_size_limits(ws, props):
    track_ok(ws, events=[ev(properties=props)], purchases=[pu(properties=props)])
    assert ws.table("events").collect().height == 1


@pytest.mark.parametrize(
    "props",
    [flat_props(52_000), flat_props(99_000), nested_props(103_000)],
    ids=["flat-52000", "flat-99000", "nested-103000"],
)
def test_properties_beyond_size_limits(ws, props):
    only_error(track(ws, events=[ev(properties=props)]), ERR_PROPERTIES_SIZE, "events")
    only_error(track(ws, purchases=[pu(properties=props)]), ERR_PROPERTIES_SIZE, "purchases")
    assert not exists(ws, "u1")


def test_event_fields_are_checked_in_order(ws):
    only_error(track(ws, events=[ev(name="", time="bad")]), ERR_EVENT_NAME, "events")
    only_error(track(ws, events=[ev(time="bad", app_id=5)]), ERR_TIME, "events")
    only_error(track(ws, events=[ev(app_id=5, properties=[])]), ERR_APP_ID, "events")
    only_error(track(ws, events=[ev(properties={"$a": 1})]), ERR_PROPERTY_NAME, "events")


# --- purchases -----------------------------------------------------------------------------------------


def test_invalid_product_id(ws):
    refuse_each(ws, "purchases", [pu(product_id=product_id) for product_id in ("", 5, None, DROP, "p" * 256, ["sku"])],
                ERR_PRODUCT_ID)
    assert not exists(ws, "u1")


def test_product_id_of_255_characters(ws):
    track_ok(ws, purchases=[pu(product_id="p" * 255)])
    assert [s["name"] for s in field(ws, "u1", "purchases")] == ["p" * 255]


def test_invalid_currency(ws):
    refuse_each(ws, "purchases", [pu(currency=currency) for currency in
                                  ("usd", "Usd", "US", "USDD", "U5D", "", 840, None, DROP)], ERR_CURRENCY)
    assert not exists(ws, "u1")


def test_valid_currency(ws):
    currencies = ["USD", "EUR", "JPY"]
    track_ok(ws, purchases=[pu(external_id=f"e{i}", currency=currency) for i, currency in enumerate(currencies)])
    rows = ws.sql("select external_id, currency from purchases join profiles using (service_id)").rows()
    assert sorted(rows) == [(f"e{i}", currency) for i, currency in enumerate(currencies)]


def test_invalid_price(ws):
    refuse_each(ws, "purchases", [pu(price=price) for price in ("9.99", True, False, None, DROP, [1], {"amount": 1})],
                ERR_PRICE)
    assert not exists(ws, "u1")


def test_valid_price(ws):
    prices = [(9.99, 9.99), (10, 10.0), (0, 0.0), (-2.5, -2.5)]
    track_ok(ws, purchases=[pu(external_id=f"e{i}", price=price) for i, (price, _) in enumerate(prices)])
    assert [field(ws, f"e{i}", "total_revenue") for i in range(len(prices))] == [revenue for _, revenue in prices]


def test_quantity_defaults_to_one(ws):
    track_ok(ws, purchases=[pu(price=4.5)])
    assert ws.table("purchases").collect()["quantity"].to_list() == [1]
    assert field(ws, "u1", "total_revenue") == 4.5


def test_quantity_in_range(ws):
    quantities = [1, 2, 100]
    track_ok(ws, purchases=[pu(external_id=f"e{i}", price=2.0, quantity=q) for i, q in enumerate(quantities)])
    assert [field(ws, f"e{i}", "total_revenue") for i in range(len(quantities))] == [2.0 * q for q in quantities]


def test_quantity_out_of_range_or_not_an_integer(ws):
    refuse_each(ws, "purchases", [pu(quantity=q) for q in (0, 101, -1, 1.5, 2.0, "2", True, [1])], ERR_QUANTITY)
    assert not exists(ws, "u1")


def test_purchase_summary_counts_objects_not_quantities(ws):
    track_ok(ws, purchases=[pu(quantity=3, price=1.5), pu(quantity=5, price=2.0)])
    assert export_one(ws, "u1", ["purchases", "total_revenue"]) == {
        "purchases": [summary("sku", NOW, NOW, 2)],
        "total_revenue": 14.5,
    }


def test_purchase_fields_are_checked_in_order(ws):
    def first_error(**fields):
        return errors(track(ws, purchases=[pu(**fields)]))[0]["type"]

    assert first_error(product_id="", currency="x", price="x") == ERR_PRODUCT_ID
    assert first_error(currency="x", price="x", quantity=0) == ERR_CURRENCY
    assert first_error(price="x", quantity=0, time="x") == ERR_PRICE
    assert first_error(quantity=0, time="x", app_id=1) == ERR_QUANTITY
    assert first_error(time="x", app_id=1, properties=[]) == ERR_TIME
    assert first_error(app_id=1, properties=[]) == ERR_APP_ID


# --- processed counts and the errors list --------------------------------------------------------------


@pytest.mark.parametrize(
    "arrays",
    [
        ("attributes",), ("events",), ("purchases",), ("attributes", "events"),
        ("events", "purchases"), ("attributes", "purchases"), ("attributes", "events", "purchases"),
    ],
)
def test_processed_counts_appear_only_for_arrays_sent(ws, arrays):
    objects = {"attributes": [{"external_id": "u1", "a": 1}], "events": [ev()], "purchases": [pu()]}
    r = track(ws, **{a: objects[a] for a in arrays})
    assert r.status == 201
    assert r.body == {"message": "success", **{f"{a}_processed": 1 for a in arrays}}


def test_empty_arrays_are_counted_as_zero(ws):
    r = track(ws, attributes=[], events=[], purchases=[])
    assert r.status == 201
    assert r.body == {
        "message": "success", "attributes_processed": 0, "events_processed": 0,
        "purchases_processed": 0,
    }


def test_processed_counts_exclude_rejected_objects(ws):
    r = track(ws, events=[ev(), ev(name=""), ev(), ev(time="x")], purchases=[pu(price="x")])
    assert r.body["events_processed"] == 2
    assert r.body["purchases_processed"] == 0
    assert events_of(ws) == [summary("played", NOW, NOW, 2)]


def test_errors_list_shape_and_order(ws):
    r = track(
        ws,
        purchases=[pu(currency="usd"), pu()],
        events=[ev(name=""), ev(), ev(time="2026-11-20T10:00:00")],
        attributes=[{"external_id": "u1"}, {"external_id": "u1", "$x": 1}],
    )
    assert r.status == 201
    assert r.body == {
        "message": "success",
        "attributes_processed": 1,
        "events_processed": 1,
        "purchases_processed": 1,
        "errors": [
            err(ERR_ATTRIBUTE_NAME, "attributes", 1),
            err(ERR_EVENT_NAME, "events", 0),
            err(ERR_TIME, "events", 2),
            err(ERR_CURRENCY, "purchases", 0),
        ],
    }
    for e in r.body["errors"]:
        assert set(e) == {"type", "input_array", "index"}
        assert type(e["index"]) is int
