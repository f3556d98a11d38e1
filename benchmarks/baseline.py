"""The bar a data engineer could set without engagelake: the same track batch, hand-written as a
DuckDB `MERGE` and as a delta-rs merge, with none of the specification's rules.

`bench_track.py --baseline` runs both on P1's input in the same run as the engine. Each starts
from a table of the base store's users (external ID, email, first name, country, language,
plan, visits, favorite categories; written fresh per run, not timed) and, timed:

1. reads the request bodies (NDJSON) with the generator's known schema;
2. folds the batch's attribute objects per external ID as a naive pipeline would: the last
   plain value wins, `inc` amounts add up, `add` lists are concatenated and made distinct;
3. upserts them into the users table by external ID (insert when new) and appends the events
   and purchases, with their time parsed, to their own tables;
4. commits: DuckDB checkpoints its database file; delta-rs writes its new table versions.

What it leaves out is what the engine does beside: identity resolution by email, phone, alias
and device; validation and per-object errors; the order of objects within the batch (a user's
later `inc` after a set); subscriptions, push tokens, custom attributes as their own rows,
lineage, idempotency, exports that see the batch. So the engine should be within a small
factor of it, and faster is the mission's bar.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import orjson
import polars as pl
from deltalake import DeltaTable, write_deltalake

from workload import BODY_SCHEMA, CATEGORIES, COUNTRIES, FIRST_NAMES, PLANS, ext_ids


def base_users(users: int, seed: int = 1) -> pl.DataFrame:
    """The base store's users as a plain table (values drawn like `load_requests` draws them)."""
    rng = np.random.default_rng(seed)
    ids = ext_ids(np.arange(users))
    country = rng.integers(0, len(COUNTRIES), users)
    cat1 = rng.integers(0, len(CATEGORIES), users)
    cat2 = (cat1 + rng.integers(1, len(CATEGORIES), users)) % len(CATEGORIES)
    cats = np.array(CATEGORIES)
    return pl.DataFrame({
        "external_id": ids,
        "email": [f"{i}@example.com" for i in ids],
        "first_name": np.array(FIRST_NAMES)[rng.integers(0, len(FIRST_NAMES), users)],
        "country": np.array([c for c, _ in COUNTRIES])[country],
        "language": np.array([lang for _, lang in COUNTRIES])[country],
        "plan": np.array(PLANS)[rng.integers(0, len(PLANS), users)],
        "visits": np.zeros(users, np.int64),
        "favorite_categories": np.stack([cats[cat1], cats[cat2]], axis=1).tolist(),
        "last_product": pl.Series([None] * users, dtype=pl.String),
        "tags": pl.Series([None] * users, dtype=pl.List(pl.String)),
    })


def _batch(path: Path) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The batch's attribute objects folded per external ID, its events and its purchases."""
    bodies = pl.read_ndjson(path, schema=BODY_SCHEMA)
    parts = {name: bodies.select(pl.col(name).explode()).drop_nulls().unnest(name)
             for name in ("attributes", "events", "purchases")}
    attributes = parts["attributes"].group_by("external_id").agg(
        pl.col("first_name").drop_nulls().last(), pl.col("plan").drop_nulls().last(),
        pl.col("last_product").drop_nulls().last(), pl.col("tags").drop_nulls().last(),
        pl.col("visits").struct.field("inc").sum().alias("visits_inc"),
        pl.col("favorite_categories").struct.field("add").list.explode(keep_nulls=False, empty_as_null=False)
        .drop_nulls().unique().alias("categories_add"),
    )
    when = pl.col("time").str.to_datetime(time_zone="UTC")
    events = parts["events"].with_columns(when, pl.col("properties").struct.json_encode())
    purchases = parts["purchases"].with_columns(when, pl.col("properties").struct.json_encode())
    return attributes, events, purchases


def duckdb_merge(bodies: Path, base: pl.DataFrame, folder: Path) -> float:
    """Seconds for the batch as DuckDB SQL into a database file: MERGE INTO users, INSERT the
    events and purchases, CHECKPOINT."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    con = duckdb.connect(str(folder / "users.duckdb"))
    con.register("base", base.to_arrow())
    con.execute("CREATE TABLE users AS SELECT * FROM base; CHECKPOINT")
    con.unregister("base")
    started = time.perf_counter()
    attributes, events, purchases = _batch(bodies)
    con.register("s", attributes.to_arrow())
    con.execute("""
        MERGE INTO users AS t USING s ON t.external_id = s.external_id
        WHEN MATCHED THEN UPDATE SET
            first_name = coalesce(s.first_name, t.first_name), plan = coalesce(s.plan, t.plan),
            last_product = coalesce(s.last_product, t.last_product), tags = coalesce(s.tags, t.tags),
            visits = coalesce(t.visits, 0) + coalesce(s.visits_inc, 0),
            favorite_categories = list_distinct(list_concat(t.favorite_categories, s.categories_add))
        WHEN NOT MATCHED THEN INSERT (external_id, first_name, plan, last_product, tags, visits,
            favorite_categories)
            VALUES (s.external_id, s.first_name, s.plan, s.last_product, s.tags, coalesce(s.visits_inc, 0),
                    s.categories_add)
    """)
    for name, rows in (("events", events), ("purchases", purchases)):
        con.register("rows", rows.to_arrow())
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM rows")
        con.unregister("rows")
    con.execute("CHECKPOINT")
    seconds = time.perf_counter() - started
    con.close()
    return seconds


def delta_merge(bodies: Path, base: pl.DataFrame, folder: Path) -> float:
    """Seconds for the batch as a delta-rs merge into a Delta table of users, then appends of the
    events and purchases to Delta tables."""
    shutil.rmtree(folder, ignore_errors=True)
    write_deltalake(str(folder / "users"), base.to_arrow())
    started = time.perf_counter()
    attributes, events, purchases = _batch(bodies)
    (
        DeltaTable(str(folder / "users"))
        .merge(attributes.to_arrow(), "t.external_id = s.external_id", source_alias="s", target_alias="t")
        .when_matched_update({
            "first_name": "coalesce(s.first_name, t.first_name)", "plan": "coalesce(s.plan, t.plan)",
            "last_product": "coalesce(s.last_product, t.last_product)", "tags": "coalesce(s.tags, t.tags)",
            "visits": "coalesce(t.visits, 0) + coalesce(s.visits_inc, 0)",
            "favorite_categories": "array_distinct(array_concat(t.favorite_categories, s.categories_add))",
        })
        .when_not_matched_insert({
            "external_id": "s.external_id", "first_name": "s.first_name", "plan": "s.plan",
            "last_product": "s.last_product", "tags": "s.tags", "visits": "coalesce(s.visits_inc, 0)",
            "favorite_categories": "s.categories_add",
        })
        .execute()
    )
    for name, rows in (("events", events), ("purchases", purchases)):
        write_deltalake(str(folder / name), rows.to_arrow(), mode="append")
    return time.perf_counter() - started


def hand_written(requests: list[dict[str, Any]], users: int, folder: Path) -> dict[str, float]:
    """Both baselines on `requests` (the P1 batch) against `users` base users."""
    folder.mkdir(parents=True, exist_ok=True)
    bodies = folder / "bodies.ndjson"
    with open(bodies, "wb") as f:
        f.write(b"\n".join(orjson.dumps(r["body"]) for r in requests))
        f.write(b"\n")
    base = base_users(users)
    return {"duckdb_merge_s": duckdb_merge(bodies, base, folder / "duckdb"),
            "delta_merge_s": delta_merge(bodies, base, folder / "delta")}
