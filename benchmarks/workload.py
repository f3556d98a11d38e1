"""The workload the benchmarks share: the generated `/users/track` requests and their constants.

`load_requests` creates users with attribute-only requests (the base store of `bench_track.py`,
`bench_identity.py`); `mixed_requests` draws P1's mixed track objects (attributes with `{"inc":
n}`, `{"add": [...]}` and plain sets; events; purchases) for existing and new users, packed into
requests of at most 100 objects and 75 of a kind; `BODY_SCHEMA` is the shape of their bodies
(the I/O floor's and `baseline.py`'s reader). Pure data: nothing here opens a store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import polars as pl

NOW = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)
TRACK = "/users/track"
EXPORT = "/users/export/ids"
MAX_PER_ARRAY = 75
OBJECTS_PER_REQUEST = 100
EXISTING_SHARE = 0.6
OBJECTS_PER_NEW_USER = 2  # new users in a batch get about this many objects each
KIND_WEIGHTS = (0.35, 0.50, 0.15)  # attributes, events, purchases
ATTRIBUTES, EVENTS, PURCHASES = 0, 1, 2
KIND_NAMES = ("attributes", "events", "purchases")
ID_WIDTH = 9

FIRST_NAMES = ("Maria", "James", "Sofia", "Liam", "Emma", "Noah", "Olivia", "Lucas", "Mia", "Hugo")
COUNTRIES = (("US", "en"), ("DE", "de"), ("FR", "fr"), ("ES", "es"), ("JP", "ja"), ("BR", "pt"))
PLANS = ("free", "plus", "pro", "team")
CATEGORIES = ("shoes", "books", "electronics", "home", "toys", "beauty", "sports", "garden")
EVENT_NAMES = ("session_start", "viewed_product", "added_to_cart")
PLATFORMS = ("ios", "android", "web")
PRODUCTS = 500
PRODUCT_IDS = [f"sku-{p:05d}" for p in range(PRODUCTS)]
PRICES = np.round(np.exp(np.random.default_rng(2024).normal(3.3, 0.9, PRODUCTS)), 2).clip(0.99, 999.0).tolist()
WINDOW_MS = 30 * 24 * 3600 * 1000


def ext_ids(numbers: np.ndarray) -> list[str]:
    return [f"user-{n:0{ID_WIDTH}d}" for n in numbers.tolist()]


def iso_times(ms: np.ndarray) -> list[str]:
    return np.datetime_as_string(ms.astype("datetime64[ms]"), unit="ms", timezone="UTC").tolist()


def pack(kind: np.ndarray, objects: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Cut a stream of objects (kind per position; `objects[k]` the stream's objects of kind k,
    in order) into requests of `OBJECTS_PER_REQUEST` consecutive objects, splitting any request
    holding more than 75 objects of one kind."""
    n = kind.size
    chunk = np.arange(n) // OBJECTS_PER_REQUEST
    sub = np.zeros(n, np.int64)
    for k in range(3):
        where = np.flatnonzero(kind == k)
        chunk_of = chunk[where]
        first = np.searchsorted(chunk_of, chunk_of, side="left")
        sub[where] = (np.arange(where.size) - first) // MAX_PER_ARRAY
    _, request = np.unique(chunk * 4 + sub, return_inverse=True)
    count = int(request.max()) + 1 if n else 0
    bodies: list[dict[str, Any]] = [{} for _ in range(count)]
    for k in range(3):
        counts = np.bincount(request[kind == k], minlength=count).tolist()
        objs, pos, name = objects[k], 0, KIND_NAMES[k]
        for body, c in zip(bodies, counts, strict=True):
            if c:
                body[name] = objs[pos : pos + c]
                pos += c
    return [{"method": "POST", "path": TRACK, "body": b} for b in bodies]


def load_requests(start: int, stop: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """Attribute-only requests creating users `start`..`stop - 1` (plain sets only)."""
    n = stop - start
    ids = ext_ids(np.arange(start, stop))
    first = rng.integers(0, len(FIRST_NAMES), n).tolist()
    country = rng.integers(0, len(COUNTRIES), n).tolist()
    plan = rng.integers(0, len(PLANS), n).tolist()
    cat1 = rng.integers(0, len(CATEGORIES), n)
    cat2 = ((cat1 + rng.integers(1, len(CATEGORIES), n)) % len(CATEGORIES)).tolist()
    objs = [
        {
            "external_id": ids[i],
            "email": f"{ids[i]}@example.com",
            "first_name": FIRST_NAMES[first[i]],
            "country": COUNTRIES[country[i]][0],
            "language": COUNTRIES[country[i]][1],
            "plan": PLANS[plan[i]],
            "visits": 0,
            "favorite_categories": [CATEGORIES[c1], CATEGORIES[cat2[i]]],
        }
        for i, c1 in enumerate(cat1.tolist())
    ]
    return pack(np.zeros(n, np.int64), [objs, [], []])


@dataclass
class IdSpace:
    """External IDs in use: `existing` users exist in the big store; new ones come after."""

    existing: int
    next_new: int = field(init=False)

    def __post_init__(self) -> None:
        self.next_new = self.existing


def mixed_requests(n: int, ids: IdSpace, rng: np.random.Generator) -> list[dict[str, Any]]:
    """`n` mixed track objects, `EXISTING_SHARE` of them for existing users, the rest for new
    users (about `OBJECTS_PER_NEW_USER` objects each), packed into requests."""
    kind = rng.choice(3, n, p=KIND_WEIGHTS)
    existing = rng.random(n) < EXISTING_SHARE if ids.existing else np.zeros(n, bool)
    n_new = max(1, int((~existing).sum()) // OBJECTS_PER_NEW_USER)
    user = np.where(
        existing,
        rng.integers(0, max(ids.existing, 1), n),
        ids.next_new + rng.integers(0, n_new, n),
    )
    ids.next_new += n_new
    pick = rng.random(n)
    product = (PRODUCTS * rng.random(n) ** 2.5).astype(np.int64)
    quantity = rng.choice([1, 1, 1, 2, 2, 3], n)
    inc = rng.integers(1, 4, n)
    time_ms = (
        np.datetime64(NOW.replace(tzinfo=None), "ms").astype(np.int64)
        - rng.integers(60_000, WINDOW_MS, n)
    )

    objects: list[list[dict[str, Any]]] = []
    for k, build in ((ATTRIBUTES, _attributes), (EVENTS, _events), (PURCHASES, _purchases)):
        rows = np.flatnonzero(kind == k)
        objects.append(build(ext_ids(user[rows]), pick[rows], product[rows], quantity[rows],
                             inc[rows], time_ms[rows]))
    return pack(kind, objects)


def _attributes(ids: list[str], pick: np.ndarray, product: np.ndarray, quantity: np.ndarray,
                inc: np.ndarray, time_ms: np.ndarray) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for eid, p, q, i in zip(ids, pick.tolist(), product.tolist(), inc.tolist(), strict=True):
        obj: dict[str, Any] = {"external_id": eid, "visits": {"inc": i}}
        if p < 0.5:  # array add
            obj["favorite_categories"] = {"add": [CATEGORIES[q % len(CATEGORIES)]]}
        if p >= 0.3:  # plain sets: a custom attribute and a profile field
            obj["plan"] = PLANS[q % len(PLANS)]
            obj["last_product"] = PRODUCT_IDS[q]
        if p >= 0.8:
            obj["first_name"] = FIRST_NAMES[q % len(FIRST_NAMES)]
            obj["tags"] = ["bench", CATEGORIES[q % len(CATEGORIES)]]
        out.append(obj)
    return out


def _events(ids: list[str], pick: np.ndarray, product: np.ndarray, quantity: np.ndarray,
            inc: np.ndarray, time_ms: np.ndarray) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for eid, p, q, n, t in zip(ids, pick.tolist(), product.tolist(), quantity.tolist(),
                               iso_times(time_ms), strict=True):
        e = 0 if p < 0.3 else 1 if p < 0.8 else 2
        if e == 0:
            props: dict[str, Any] = {"platform": PLATFORMS[q % 3]}
        elif e == 1:
            props = {"product_id": PRODUCT_IDS[q], "price": PRICES[q]}
        else:
            props = {"product_id": PRODUCT_IDS[q], "quantity": n}
        out.append({"external_id": eid, "name": EVENT_NAMES[e], "time": t, "properties": props})
    return out


def _purchases(ids: list[str], pick: np.ndarray, product: np.ndarray, quantity: np.ndarray,
               inc: np.ndarray, time_ms: np.ndarray) -> list[dict[str, Any]]:
    return [
        {
            "external_id": eid, "product_id": PRODUCT_IDS[q], "currency": "USD",
            "price": PRICES[q], "quantity": n, "time": t,
            "properties": {"category": CATEGORIES[q % len(CATEGORIES)]},
        }
        for eid, q, n, t in zip(ids, product.tolist(), quantity.tolist(), iso_times(time_ms),
                                strict=True)
    ]


_PROPS = {"product_id": pl.String, "price": pl.Float64, "quantity": pl.Int64, "platform": pl.String}
BODY_SCHEMA = pl.Schema({
    "attributes": pl.List(pl.Struct({
        "external_id": pl.String, "visits": pl.Struct({"inc": pl.Int64}),
        "favorite_categories": pl.Struct({"add": pl.List(pl.String)}), "plan": pl.String,
        "last_product": pl.String, "first_name": pl.String, "tags": pl.List(pl.String),
    })),
    "events": pl.List(pl.Struct({
        "external_id": pl.String, "name": pl.String, "time": pl.String, "properties": pl.Struct(_PROPS),
    })),
    "purchases": pl.List(pl.Struct({
        "external_id": pl.String, "product_id": pl.String, "currency": pl.String,
        "price": pl.Float64, "quantity": pl.Int64, "time": pl.String,
        "properties": pl.Struct({"category": pl.String}),
    })),
})  # the shape `mixed_requests` generates; the floor's reader knows it

