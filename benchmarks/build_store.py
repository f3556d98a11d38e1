"""Build a big store through the engine itself: N users, each with 3 custom attributes and
profile fields, about 2 events and 0.5 purchases, applied as `/users/track` batches.

    cd /work/main && uv run python benchmarks/build_store.py --users 10000000 --out /tmp/store10m

Every chunk of `--chunk` users is one `ws.apply` (one atomic commit). A chunk's requests are
generated 25,000 users at a time and kept as JSON lines, as a landing file holds them; `apply`
draws them from a generator that decodes one line at a time, so neither the chunk's dicts nor
the store stay in memory: the script prints the peak RSS as it goes. The build ends with a
compaction (`--no-compact` leaves the runs as the batches and their merges left them), as a
deployment's daily compaction would after a bulk load. The stores `bench_track.py --store` reuses are built
with it. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from rich.table import Table

from harness import console, errors_in, max_rss, mib, open_ws, vm_rss
from workload import (
    CATEGORIES,
    COUNTRIES,
    EVENT_NAMES,
    FIRST_NAMES,
    NOW,
    PLANS,
    PRICES,
    PRODUCT_IDS,
    WINDOW_MS,
    ext_ids,
    iso_times,
    pack,
)

GENERATED_USERS = 25_000  # users whose request dicts exist at once
EVENTS_PER_USER = 2.0
PURCHASES_PER_USER = 0.5


def chunk_requests(start: int, stop: int, rng: np.random.Generator) -> tuple[list[dict[str, Any]], int, int]:
    """Requests creating users `start`..`stop - 1` with their events and purchases, in user
    order (a user's attributes object comes first), and the counts of events and purchases."""
    n = stop - start
    ids = ext_ids(np.arange(start, stop))
    first = rng.integers(0, len(FIRST_NAMES), n).tolist()
    country = rng.integers(0, len(COUNTRIES), n).tolist()
    plan = rng.integers(0, len(PLANS), n).tolist()
    cat = rng.integers(0, len(CATEGORIES), n).tolist()
    attributes = [
        {"external_id": ids[i], "email": f"{ids[i]}@example.com", "first_name": FIRST_NAMES[first[i]],
         "country": COUNTRIES[country[i]][0], "language": COUNTRIES[country[i]][1],
         "plan": PLANS[plan[i]], "visits": 1, "favorite_categories": [CATEGORIES[cat[i]]]}
        for i in range(n)
    ]
    n_events = rng.poisson(EVENTS_PER_USER, n)
    n_purchases = rng.binomial(1, PURCHASES_PER_USER, n)
    now_ms = int(NOW.timestamp() * 1000)
    owner = np.repeat(np.arange(n), n_events)
    names = rng.integers(0, len(EVENT_NAMES), owner.size).tolist()
    times = iso_times(now_ms - rng.integers(0, WINDOW_MS, owner.size))
    events = [{"external_id": ids[u], "name": EVENT_NAMES[e], "time": t}
              for u, e, t in zip(owner.tolist(), names, times, strict=True)]
    buyer = np.flatnonzero(n_purchases)
    product = rng.integers(0, len(PRODUCT_IDS), buyer.size).tolist()
    ptimes = iso_times(now_ms - rng.integers(0, WINDOW_MS, buyer.size))
    purchases = [{"external_id": ids[u], "product_id": PRODUCT_IDS[p], "currency": "USD", "price": PRICES[p],
                  "quantity": 1, "time": t} for u, p, t in zip(buyer.tolist(), product, ptimes, strict=True)]
    # the stream: per user, the attributes object, then its events, then its purchase
    kinds = np.concatenate([np.zeros(n, np.int64), np.ones(owner.size, np.int64), np.full(buyer.size, 2)])
    user_of = np.concatenate([np.arange(n), owner, buyer])
    order = np.lexsort((kinds, user_of))
    return pack(kinds[order], [attributes, events, purchases]), owner.size, buyer.size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=10_000_000)
    ap.add_argument("--chunk", type=int, default=250_000, help="users per apply (one commit)")
    ap.add_argument("--out", type=Path, required=True, help="the store folder (must not exist)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--compact", action=argparse.BooleanOptionalAction, default=True,
                    help="end with `engagelake compact`, as a deployment's daily compaction would (default: on)")
    args = ap.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out} exists; give a new folder")
    rng = np.random.default_rng(args.seed)
    ws = open_ws(args.out)
    started = time.perf_counter()
    engine_s = 0.0
    events = purchases = bad = 0
    for start in range(0, args.users, args.chunk):
        stop = min(start + args.chunk, args.users)
        lines: list[bytes] = []
        for part in range(start, stop, GENERATED_USERS):
            requests, e, p = chunk_requests(part, min(part + GENERATED_USERS, stop), rng)
            lines += [orjson.dumps(r) for r in requests]
            events, purchases = events + e, purchases + p
        del requests
        t = time.perf_counter()
        responses = ws.apply(orjson.loads(line) for line in lines)
        engine_s += time.perf_counter() - t
        bad += errors_in(responses)
        del lines, responses
        console.print(f"  {stop:,}/{args.users:,} users, apply {time.perf_counter() - t:,.1f} s, "
                      f"engine {engine_s:,.0f} s, RSS {mib(vm_rss())} (peak {mib(max_rss())})")
    compact_s = 0.0
    if args.compact:
        t = time.perf_counter()
        ws.compact()
        compact_s = time.perf_counter() - t
        console.print(f"  compacted in {compact_s:,.0f} s, RSS {mib(vm_rss())} (peak {mib(max_rss())})")
    wall = time.perf_counter() - started
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    table = Table(title=f"build_store: {args.users:,} users")
    for col in ("users", "events", "purchases", "engine s", "users/s", "compact s", "wall s", "peak RSS",
                "store size", "bad"):
        table.add_column(col, justify="right")
    table.add_row(f"{args.users:,}", f"{events:,}", f"{purchases:,}", f"{engine_s:,.0f}",
                  f"{args.users / engine_s:,.0f}", f"{compact_s:,.0f}" if args.compact else "-", f"{wall:,.0f}",
                  mib(max_rss()), mib(size), str(bad))
    console.print(table)


if __name__ == "__main__":
    main()
