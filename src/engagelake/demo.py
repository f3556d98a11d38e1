"""A realistic, reproducible `/users/track` workload for demos, benchmarks and tests.

`generate_workload(users, objects)` plans the whole workload with numpy (who does what, when,
in which request) and only builds the request dictionaries block by block, so a million objects
take a few seconds and little memory. The stream is shaped like a shop's traffic:

- users sign up in id order (`user-000000`, `user-000001`, ...); a user's first visit sends an
  attributes object with profile fields (email, first name, country, language, time zone) and
  custom attributes (`plan`, `visits: {"inc": 1}`, `favorite_categories: {"add": [...]}`);
- about 40% of the objects belong to first visits, about 60% to later visits of users created
  earlier; every visit starts with an attributes object (`visits` incremented) followed by
  events (`session_start`, `viewed_product`, `added_to_cart`) and purchases;
- times lie in the 60 days before `now`, increasing along the stream; a few products are much
  more popular than the rest; prices are in USD, or EUR for euro countries.

Requests hold consecutive slices of the stream, at most 75 objects of each kind.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import orjson

TRACK_PATH = "/users/track"
MAX_PER_ARRAY = 75
OBJECTS_PER_REQUEST = 100
NEW_USER_SHARE = 0.4
WINDOW = timedelta(days=60)
BLOCK_REQUESTS = 500

ATTRIBUTES, EVENTS, PURCHASES = 0, 1, 2
EVENT_SHARE_AFTER_FIRST = 0.8

FIRST_NAMES = (
    "Maria", "James", "Sofia", "Liam", "Emma", "Noah", "Olivia", "Lucas", "Mia", "Hugo",
    "Yuki", "Aarav", "Ana", "Mateo", "Lea", "Elias", "Chloe", "Jonas", "Ines", "Oscar",
    "Priya", "Kenji", "Zoe", "Leon", "Alice", "Omar", "Julia", "Felix", "Nora", "Diego",
)  # fmt: skip
EMAIL_DOMAINS = ("example.com", "example.org", "mail.example.net")
# country, language, time zone, currency, relative share of users
COUNTRIES = (
    ("US", "en", "America/New_York", "USD", 30),
    ("GB", "en", "Europe/London", "USD", 8),
    ("DE", "de", "Europe/Berlin", "EUR", 10),
    ("FR", "fr", "Europe/Paris", "EUR", 8),
    ("ES", "es", "Europe/Madrid", "EUR", 6),
    ("IT", "it", "Europe/Rome", "EUR", 5),
    ("NL", "nl", "Europe/Amsterdam", "EUR", 3),
    ("BR", "pt", "America/Sao_Paulo", "USD", 7),
    ("MX", "es", "America/Mexico_City", "USD", 5),
    ("CA", "en", "America/Toronto", "USD", 5),
    ("JP", "ja", "Asia/Tokyo", "USD", 5),
    ("IN", "hi", "Asia/Kolkata", "USD", 5),
    ("AU", "en", "Australia/Sydney", "USD", 3),
)
PLANS = ("free", "plus", "pro", "team")
PLAN_WEIGHTS = (0.6, 0.2, 0.15, 0.05)
EMAIL_STATES = ("subscribed", "opted_in", "unsubscribed")
EMAIL_STATE_WEIGHTS = (0.6, 0.3, 0.1)
CATEGORIES = ("shoes", "books", "electronics", "home", "toys", "beauty", "sports", "garden")
PLATFORMS = ("ios", "android", "web")
EVENT_NAMES = ("session_start", "viewed_product", "added_to_cart")
EVENT_WEIGHTS = (0.3, 0.5, 0.2)
PRODUCTS = 500
EUR_PER_USD = 0.92


def generate_workload(
    users: int, objects: int, seed: int = 7, *, now: datetime | None = None
) -> Iterator[dict[str, Any]]:
    """Yield `/users/track` requests `{"method", "path", "body"}` holding `objects` objects in all.

    At most `users` distinct external IDs are used (fewer when `objects` is small). The same
    `users`, `objects`, `seed` and `now` give the same requests. `now` defaults to the current
    time; event and purchase times lie in the 60 days before it.
    """
    if users < 1:
        msg = f"users must be at least 1, got {users}"
        raise ValueError(msg)
    if objects < 0:
        msg = f"objects must not be negative, got {objects}"
        raise ValueError(msg)
    if objects == 0:
        return
    now = now or datetime.now(UTC)
    rng = np.random.default_rng(seed)
    plan = _plan_stream(users, objects, rng, now)
    people = _plan_users(int(plan["user"].max()) + 1, rng)
    for start in range(0, plan["requests"], BLOCK_REQUESTS):
        stop = min(start + BLOCK_REQUESTS, plan["requests"])
        yield from _build_requests(plan, people, start, stop)


def count_objects(request: dict[str, Any]) -> int:
    """The number of attribute, event and purchase objects in one `/users/track` request."""
    body = request.get("body") or {}
    return sum(len(body.get(name) or ()) for name in ("attributes", "events", "purchases"))


def write_request_files(
    requests: Iterable[dict[str, Any]],
    folder: str | Path,
    per_file: int,
    *,
    prefix: str = "requests",
) -> list[Path]:
    """Write the requests as NDJSON files of `per_file` requests each; return their paths.

    Files are named `<prefix>-00000.ndjson`, `<prefix>-00001.ndjson`, ... so that sorted name
    order is request order, and each is written to a temporary name and then renamed, so a reader
    never sees half a file.
    """
    if per_file < 1:
        msg = f"per_file must be at least 1, got {per_file}"
        raise ValueError(msg)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    lines: list[bytes] = []
    for request in requests:
        lines.append(orjson.dumps(request))
        if len(lines) == per_file:
            paths.append(_write_lines(folder / f"{prefix}-{len(paths):05d}.ndjson", lines))
            lines = []
    if lines:
        paths.append(_write_lines(folder / f"{prefix}-{len(paths):05d}.ndjson", lines))
    return paths


def _write_lines(path: Path, lines: list[bytes]) -> Path:
    """Write NDJSON lines to `path` atomically (temporary file, then rename)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(b"\n".join(lines) + b"\n")
    os.replace(partial, path)
    return path


def _plan_stream(
    users: int, objects: int, rng: np.random.Generator, now: datetime
) -> dict[str, Any]:
    """Decide, for every object, its user, kind, request and time (numpy arrays)."""
    new_objects = max(1, round(NEW_USER_SHARE * objects))
    new_visits = min(users, new_objects)
    returning_objects = objects - new_objects
    visit_size = new_objects / new_visits
    returning_visits = min(returning_objects, int(np.ceil(returning_objects / visit_size)))

    # Visits: user u signs up at stream position u / new_visits; a returning visit at position t
    # belongs to a uniformly chosen user who signed up before t.
    new_t = np.arange(new_visits) / new_visits
    returning_t = rng.random(returning_visits)
    signed_up = np.maximum(1, np.ceil(returning_t * new_visits)).astype(np.int64)
    returning_user = (rng.random(returning_visits) * signed_up).astype(np.int64)
    visit_t = np.concatenate([new_t, returning_t])
    visit_user = np.concatenate([np.arange(new_visits), returning_user])
    visit_new = np.concatenate([np.ones(new_visits, bool), np.zeros(returning_visits, bool)])
    visit_objects = np.concatenate(
        [_split(new_objects, new_visits, rng), _split(returning_objects, returning_visits, rng)]
    )
    order = np.lexsort((~visit_new, visit_t))
    visit_t, visit_user = visit_t[order], visit_user[order]
    visit_new, visit_objects = visit_new[order], visit_objects[order]

    # Objects: the first of each visit is an attributes object, the rest events or purchases.
    visit_of = np.repeat(np.arange(visit_t.size), visit_objects)
    visit_start = np.cumsum(visit_objects) - visit_objects
    step = np.arange(objects) - visit_start[visit_of]
    kind = np.where(
        step == 0,
        ATTRIBUTES,
        np.where(rng.random(objects) < EVENT_SHARE_AFTER_FIRST, EVENTS, PURCHASES),
    )

    # Times: visits spread over the window in stream order; objects of a visit 5-120 s apart.
    window_ms = int(WINDOW.total_seconds() * 1000)
    now_ms = np.datetime64(now.astimezone(UTC).replace(tzinfo=None), "ms").astype(np.int64)
    gaps = np.where(step == 0, 0, rng.integers(5_000, 120_000, objects))
    offset = np.cumsum(gaps)
    offset = offset - offset[visit_start][visit_of]
    time_ms = now_ms - window_ms + (visit_t[visit_of] * window_ms).astype(np.int64) + offset
    time_ms = np.minimum(time_ms, now_ms - 1000)

    return {
        "user": visit_user[visit_of],
        "new": visit_new[visit_of],
        "kind": kind,
        "time_ms": time_ms,
        **_plan_requests(kind),
        "product": (PRODUCTS * rng.random(objects) ** 2.5).astype(np.int64),
        "pick": rng.random(objects),
        "quantity": rng.choice([1, 1, 1, 1, 2, 2, 3], objects),
    }


def _split(total: int, parts: int, rng: np.random.Generator) -> np.ndarray:
    """Split `total` objects into `parts` visits of at least one object each, at random."""
    if parts == 0:
        return np.zeros(0, np.int64)
    extra = np.bincount(rng.integers(0, parts, total - parts), minlength=parts)
    return (1 + extra).astype(np.int64)


def _plan_requests(kind: np.ndarray) -> dict[str, Any]:
    """Cut the stream into requests of `OBJECTS_PER_REQUEST` consecutive objects, then split
    any request with more than 75 objects of one kind; give each kind's objects and offsets."""
    objects = kind.size
    chunk = np.arange(objects) // OBJECTS_PER_REQUEST
    sub = np.zeros(objects, np.int64)
    for value in (ATTRIBUTES, EVENTS, PURCHASES):
        where = np.flatnonzero(kind == value)
        chunk_of = chunk[where]
        first = np.searchsorted(chunk_of, chunk_of, side="left")
        sub[where] = (np.arange(where.size) - first) // MAX_PER_ARRAY
    key = chunk * 4 + sub
    _, request = np.unique(key, return_inverse=True)
    requests = int(request.max()) + 1
    plan: dict[str, Any] = {"requests": requests}
    for value, name in ((ATTRIBUTES, "attributes"), (EVENTS, "events"), (PURCHASES, "purchases")):
        where = np.flatnonzero(kind == value)
        counts = np.bincount(request[where], minlength=requests)
        plan[name] = where
        plan[f"{name}_offsets"] = np.concatenate([[0], np.cumsum(counts)])
    return plan


def _plan_users(users: int, rng: np.random.Generator) -> dict[str, list[Any]]:
    """Profile values of each user (deterministic from the seed), as Python lists."""
    width = max(6, len(str(users - 1)))
    ids = [f"user-{u:0{width}d}" for u in range(users)]
    shares = np.array([row[4] for row in COUNTRIES], float)
    country = rng.choice(len(COUNTRIES), users, p=shares / shares.sum())
    first = rng.integers(0, len(FIRST_NAMES), users)
    domain = rng.integers(0, len(EMAIL_DOMAINS), users)
    names = [FIRST_NAMES[i] for i in first.tolist()]
    return {
        "external_id": ids,
        "first_name": names,
        "email": [
            f"{name.lower()}.{u}@{EMAIL_DOMAINS[d]}"
            for u, (name, d) in enumerate(zip(names, domain.tolist(), strict=True))
        ],
        "country": country.tolist(),
        "plan": rng.choice(len(PLANS), users, p=PLAN_WEIGHTS).tolist(),
        "email_subscribe": rng.choice(len(EMAIL_STATES), users, p=EMAIL_STATE_WEIGHTS).tolist(),
        "categories": _two_categories(users, rng),
    }


def _two_categories(users: int, rng: np.random.Generator) -> list[list[int]]:
    """Two different favorite categories per user."""
    first = rng.integers(0, len(CATEGORIES), users)
    second = (first + rng.integers(1, len(CATEGORIES), users)) % len(CATEGORIES)
    return np.stack([first, second], axis=1).tolist()


def _product_prices() -> list[float]:
    """A fixed price list in USD: most products cheap, a few expensive."""
    rng = np.random.default_rng(2024)
    return np.round(np.exp(rng.normal(3.3, 0.9, PRODUCTS)), 2).clip(0.99, 999.0).tolist()


PRICES = _product_prices()
PRODUCT_IDS = [f"sku-{p:05d}" for p in range(PRODUCTS)]
PRODUCT_CATEGORIES = [CATEGORIES[p % len(CATEGORIES)] for p in range(PRODUCTS)]


def _build_requests(
    plan: dict[str, Any], people: dict[str, list[Any]], start: int, stop: int
) -> Iterator[dict[str, Any]]:
    """Build the request dictionaries of requests `start` to `stop` (exclusive)."""
    arrays: dict[str, list[dict[str, Any]]] = {}
    offsets: dict[str, list[int]] = {}
    for name, build in (
        ("attributes", _attribute_objects),
        ("events", _event_objects),
        ("purchases", _purchase_objects),
    ):
        bounds = plan[f"{name}_offsets"]
        rows = plan[name][bounds[start] : bounds[stop]]
        arrays[name] = build(plan, people, rows)
        offsets[name] = (bounds[start : stop + 1] - bounds[start]).tolist()
    for i in range(stop - start):
        body: dict[str, Any] = {}
        for name, objects in arrays.items():
            lo, hi = offsets[name][i], offsets[name][i + 1]
            if hi > lo:
                body[name] = objects[lo:hi]
        yield {"method": "POST", "path": TRACK_PATH, "body": body}


def _times(plan: dict[str, Any], rows: np.ndarray) -> list[str]:
    """ISO 8601 UTC times with milliseconds, `2026-11-20T13:45:12.345Z`."""
    stamps = plan["time_ms"][rows].astype("datetime64[ms]")
    return np.datetime_as_string(stamps, unit="ms", timezone="UTC").tolist()


def _attribute_objects(
    plan: dict[str, Any], people: dict[str, list[Any]], rows: np.ndarray
) -> list[dict[str, Any]]:
    """Attributes objects: full profile on a user's first visit, `visits` increment later."""
    ids, first_names, emails = people["external_id"], people["first_name"], people["email"]
    countries, plans, states = people["country"], people["plan"], people["email_subscribe"]
    categories = people["categories"]
    objects: list[dict[str, Any]] = []
    for u, new, pick in zip(
        plan["user"][rows].tolist(),
        plan["new"][rows].tolist(),
        plan["pick"][rows].tolist(),
        strict=True,
    ):
        if new:
            country, language, time_zone, _, _ = COUNTRIES[countries[u]]
            first, second = categories[u]
            objects.append(
                {
                    "external_id": ids[u],
                    "email": emails[u],
                    "first_name": first_names[u],
                    "country": country,
                    "language": language,
                    "time_zone": time_zone,
                    "email_subscribe": EMAIL_STATES[states[u]],
                    "plan": PLANS[plans[u]],
                    "visits": {"inc": 1},
                    "favorite_categories": {"add": [CATEGORIES[first], CATEGORIES[second]]},
                }
            )
        elif pick < 0.05:
            upgraded = PLANS[min(plans[u] + 1, len(PLANS) - 1)]
            objects.append({"external_id": ids[u], "plan": upgraded, "visits": {"inc": 1}})
        elif pick < 0.25:
            category = CATEGORIES[int(pick * 1000) % len(CATEGORIES)]
            objects.append(
                {
                    "external_id": ids[u],
                    "visits": {"inc": 1},
                    "favorite_categories": {"add": [category]},
                }
            )
        else:
            objects.append({"external_id": ids[u], "visits": {"inc": 1}})
    return objects


def _event_objects(
    plan: dict[str, Any], people: dict[str, list[Any]], rows: np.ndarray
) -> list[dict[str, Any]]:
    """Custom events with properties: sessions, product views and cart additions."""
    ids = people["external_id"]
    pick = plan["pick"][rows]
    event = np.searchsorted(np.cumsum(EVENT_WEIGHTS), pick, side="right").clip(0, 2)
    objects: list[dict[str, Any]] = []
    for u, e, product, quantity, time, p in zip(
        plan["user"][rows].tolist(),
        event.tolist(),
        plan["product"][rows].tolist(),
        plan["quantity"][rows].tolist(),
        _times(plan, rows),
        pick.tolist(),
        strict=True,
    ):
        if e == 0:
            properties: dict[str, Any] = {"platform": PLATFORMS[int(p * 997) % 3]}
        elif e == 1:
            properties = {
                "product_id": PRODUCT_IDS[product],
                "category": PRODUCT_CATEGORIES[product],
                "price": PRICES[product],
            }
        else:
            properties = {"product_id": PRODUCT_IDS[product], "quantity": quantity}
        objects.append(
            {"external_id": ids[u], "name": EVENT_NAMES[e], "time": time, "properties": properties}
        )
    return objects


def _purchase_objects(
    plan: dict[str, Any], people: dict[str, list[Any]], rows: np.ndarray
) -> list[dict[str, Any]]:
    """Purchases of popular products, in USD or (euro countries) EUR."""
    ids, countries = people["external_id"], people["country"]
    objects: list[dict[str, Any]] = []
    for u, product, quantity, time in zip(
        plan["user"][rows].tolist(),
        plan["product"][rows].tolist(),
        plan["quantity"][rows].tolist(),
        _times(plan, rows),
        strict=True,
    ):
        currency = COUNTRIES[countries[u]][3]
        price = PRICES[product] if currency == "USD" else round(PRICES[product] * EUR_PER_USD, 2)
        objects.append(
            {
                "external_id": ids[u],
                "product_id": PRODUCT_IDS[product],
                "currency": currency,
                "price": price,
                "quantity": quantity,
                "time": time,
                "properties": {"category": PRODUCT_CATEGORIES[product]},
            }
        )
    return objects
