"""The monthly check of temporary anonymous profiles (`push_token_import`): those that hold no
push token any more are deleted, as `/users/delete` deletes, with a lineage row each.

A temporary profile is one `push_token_import` created (flag `push_anonymous`) that has gained
no identifier since: no external ID, alias, email or phone. One that gained one is a user's
profile now and is kept whether or not it holds a token (see `docs/decisions.md`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import polars as pl

from engagelake.rules.identity.profiles_merge import remove_profiles
from engagelake.rules.state import Changes, State

KIND = "cleanup"  # lineage `kind` of the cleanup's rows
RULE = "push_token_cleanup"  # lineage `rule`: why the profile went


@dataclass
class CleanupOutcome:
    deleted: pl.DataFrame  # service_id of each deleted profile
    changes: Changes = field(default_factory=Changes)
    next_update_seq: int = 0


def _anonymous() -> pl.Expr:
    """Rows of temporary anonymous profiles (still without any identifier but `service_id`)."""
    return (pl.col("push_anonymous").fill_null(False) & pl.col("external_id").is_null()
            & pl.col("email").is_null() & pl.col("phone").is_null())


def _stored(state: State, name: str, columns: list[str]) -> pl.LazyFrame:
    """`columns` of the stored current rows of `name`, lazily (projection pushed into the files)."""
    if state.source is None:  # an in-memory state: every table whole
        return state[name].lazy().select(columns)
    return state.source.scan(name).select(columns)


def tokenless_push_profiles(state: State) -> pl.DataFrame:
    """`service_id` of every temporary anonymous profile that holds no push token, sorted.

    Candidates come from one streaming anti-join over the stored tables (only the columns it
    needs); they are then checked against the batch's own view of their rows, by key, so rows
    the batch changed count as changed."""
    held = _stored(state, "push_tokens", ["service_id"])
    aliased = _stored(state, "aliases", ["service_id"])
    candidates = (
        _stored(state, "profiles", ["service_id", "push_anonymous", "external_id", "email", "phone"])
        .filter(_anonymous())
        .select("service_id")
        .join(held, on="service_id", how="anti")
        .join(aliased, on="service_id", how="anti")
        .collect()["service_id"]
    )
    if candidates.len() == 0:
        return pl.DataFrame({"service_id": []}, schema={"service_id": pl.String})
    rows = state.rows_where("profiles", "service_id", candidates).filter(_anonymous())
    rows = rows.join(state.rows_where("push_tokens", "service_id", candidates), on="service_id", how="anti")
    rows = rows.join(state.rows_where("aliases", "service_id", candidates), on="service_id", how="anti")
    return rows.select("service_id").sort("service_id")


def cleanup_push_profiles(state: State, *, clock: datetime, batch: str) -> CleanupOutcome:
    """Delete the temporary anonymous profiles without a push token (`tokenless_push_profiles`):
    every row keyed by them goes, their history with them (as `/users/delete`), and each gets a
    lineage row (`kind` cleanup, `rule` push_token_cleanup, the profile as `source`)."""
    gone = tokenless_push_profiles(state)
    out = CleanupOutcome(gone, next_update_seq=state.next_update_seq)
    if gone.height == 0:
        return out
    out.changes.extend(remove_profiles(
        state, gone.select(pl.col("service_id").alias("sid"), pl.lit(None, pl.String).alias("into")), clock))
    items = gone.with_row_index("item").with_columns(pl.col("item").cast(pl.Int64))
    out.changes.upsert("merges", items.select(
        pl.lit(batch).alias("batch"), pl.lit(None, pl.Int64).alias("request"), "item",
        (pl.col("item") + state.next_update_seq).alias("seq"), pl.lit(KIND).alias("kind"),
        pl.lit(RULE).alias("rule"), pl.lit("applied").alias("outcome"), pl.lit(None, pl.String).alias("reason"),
        pl.struct("service_id").struct.json_encode().alias("source"),  # named as a request names it
        pl.lit(None, pl.String).alias("target"), pl.col("service_id").alias("source_sid"),
        pl.lit(None, pl.String).alias("target_sid"), pl.lit(clock).alias("at")))
    out.next_update_seq = state.next_update_seq + gone.height
    return out
