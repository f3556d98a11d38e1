"""Merging profiles into others, and removing profiles: the effects shared by merge, identify
and delete, computed for a whole run of merges at once.

Merges form a forest: each merged profile points to the profile it went into, at the position
of its merge in the run. A field of a surviving profile is the first value found in merge order:
the profile itself, then each profile merged into it in the order merged, each with what it had
gathered by then. That order is a pre-order walk of the tree with children sorted by merge
position, so it is a sort by the path of positions from the root (pointer jumping builds the
paths in log(depth) joins).
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from engagelake.rules.state import Changes, State

MERGE_FIELDS = ("first_name", "last_name", "email", "gender", "dob", "phone", "time_zone", "home_city",
                "country", "language")
IDENTIFY_FIELDS = tuple(f for f in MERGE_FIELDS if f != "email")
_BLOCK = 10  # digits of one merge position in a path key


def merge_forest(edges: pl.DataFrame) -> pl.DataFrame:
    """(sid, root, key) for every profile of `edges` (src, tgt, j): the surviving profile it
    ends in and its path key (fixed-width positions from the root down; the root's is "")."""
    parent = edges.select(
        pl.col("src").alias("sid"), pl.col("tgt").alias("anc"),
        pl.col("j").cast(pl.String).str.zfill(_BLOCK).alias("acc"))
    cur = parent
    for _ in range(64):  # doubling: depth 2^64 is never reached
        step = cur.join(cur.rename({"sid": "anc", "anc": "anc2", "acc": "acc2"}), on="anc", how="left")
        if step["anc2"].null_count() == step.height:
            break
        cur = step.select(
            "sid", pl.coalesce("anc2", "anc").alias("anc"),
            pl.when(pl.col("anc2").is_not_null()).then(pl.col("acc2") + pl.col("acc")).otherwise("acc").alias("acc"))
    roots = edges.select(pl.col("tgt").alias("sid")).unique().join(parent.select("sid"), on="sid", how="anti")
    return pl.concat([
        cur.select("sid", pl.col("anc").alias("root"), pl.col("acc").alias("key")),
        roots.select("sid", pl.col("sid").alias("root"), pl.lit("").alias("key")),
    ]).sort("root", "key")


def consistent_edges(edges: pl.DataFrame) -> pl.DataFrame:
    """A guess of applied merges made acyclic: a profile is merged at most once (its first),
    and never into a profile already merged away before that position."""
    while True:
        first = edges.sort("j").unique("src", keep="first", maintain_order=True)
        dead = first.select(pl.col("src").alias("tgt"), pl.col("j").alias("dead_at"))
        kept = first.join(dead, on="tgt", how="left").filter(
            pl.col("dead_at").is_null() | (pl.col("dead_at") > pl.col("j"))).drop("dead_at")
        if kept.height == edges.height:
            return kept
        edges = kept


def subtree_first(forest: pl.DataFrame, values: pl.DataFrame, field: str) -> pl.DataFrame:
    """(sid, field): for every profile of the forest, the first non-null `field` in its own
    subtree in merge order (what it holds when it is merged away). `values`: (sid, field)."""
    f = forest.join(values.select("sid", field), on="sid", how="left", maintain_order="left").with_row_index("pos")
    combo = pl.col("root") + "/" + pl.col("key")
    f = f.with_columns(combo.alias("combo"))
    ends = f["combo"].search_sorted(f["combo"] + "~", side="left")
    f = f.with_columns(
        ends.alias("end"),
        pl.when(pl.col(field).is_not_null()).then(pl.col("pos")).backward_fill().alias("nn"))
    picked = f[field].gather(f["nn"].fill_null(0))
    return f.select("sid", pl.when(pl.col("nn") < pl.col("end")).then(picked).alias(field))


def merge_effects(state: State, edges: pl.DataFrame, fields: tuple[str, ...], clock: datetime) -> Changes:
    """Changes of applying merges `edges` (src, tgt, j, seq, fill): `fill` edges bring fields,
    custom attributes and history; every merged profile's push tokens move; merged profiles go."""
    changes = Changes()
    if edges.height == 0:
        return changes
    forest = merge_forest(edges)
    contributes = forest.join(edges.select(pl.col("src").alias("sid"), "fill"), on="sid", how="left").with_columns(
        pl.col("fill").fill_null(True))
    # a profile reached through a non-filling edge gives nothing, and neither does its subtree
    blocked = contributes.filter(~pl.col("fill")).select("root", pl.col("key").alias("bkey"))
    if blocked.height:
        hit = contributes.join(blocked, on="root").filter(pl.col("key").str.starts_with(pl.col("bkey")))
        contributes = contributes.join(hit.select("sid").unique(), on="sid", how="anti")
    prof = state.rows_where("profiles", "service_id", forest["sid"])
    rows = contributes.join(prof, left_on="sid", right_on="service_id", how="inner").sort("root", "key")
    last_seq = edges.group_by("tgt").agg(pl.col("seq").max().alias("last_seq"))
    # the explicit-language mark travels with the language it belongs to
    carried = [*fields, *(["language_explicit"] if "language" in fields else [])]
    filled = rows.group_by("root", maintain_order=True).agg(
        *[pl.col(f).drop_nulls().first().alias(f"{f}_m") for f in fields],
        *([pl.col("language_explicit").filter(pl.col("language").is_not_null()).first().alias("language_explicit_m")]
          if "language" in fields else []))
    roots = forest.filter(pl.col("sid") == pl.col("root")).select("root")
    root_rows = (prof.join(roots, left_on="service_id", right_on="root", how="semi")
                 .join(filled, left_on="service_id", right_on="root", how="left")
                 .join(last_seq, left_on="service_id", right_on="tgt", how="left")
                 .with_columns(*[pl.coalesce(f"{f}_m", f).alias(f) for f in carried],
                               pl.lit(clock).cast(prof.schema["updated_at"]).alias("updated_at"),
                               pl.coalesce("last_seq", "update_seq").alias("update_seq"))
                 .drop(*[f"{f}_m" for f in carried], "last_seq"))
    # custom attributes: the first holder of each name in merge order
    attrs = state.rows_where("attributes", "service_id", contributes["sid"]).join(contributes.select(pl.col("sid").alias("service_id"), "root", "key"),
                                     on="service_id").sort("root", "name", "key")
    gained = (attrs.unique(["root", "name"], keep="first", maintain_order=True)
              .filter(pl.col("service_id") != pl.col("root"))
              .select(pl.col("root").alias("service_id"), "name", "value"))
    merged = forest.filter(pl.col("sid") != pl.col("root"))
    into = merged.join(contributes.select("sid", pl.lit(True).alias("keeps")), on="sid", how="left").select(
        "sid", pl.when(pl.col("keeps")).then(pl.col("root")).alias("into"))
    changes.extend(remove_profiles(state, into, clock))
    changes.upsert("profiles", root_rows)
    changes.upsert("attributes", gained)
    tokens = state.rows_where("push_tokens", "service_id", merged["sid"]).join(merged.select(pl.col("sid").alias("service_id"), "root"), on="service_id")
    changes.upsert("push_tokens", tokens.with_columns(pl.col("root").alias("service_id")))
    return changes


def forget_addresses(state: State, gone: pl.Series) -> Changes:
    """Changes deleting the `email_addresses` rows (an address's own state and lists) of the
    addresses deleted profiles (`gone`) held that no other current user holds: erasure takes
    a deleted user off the email lists too."""
    changes = Changes()
    emails = state.rows_where("profiles", "service_id", gone)["email"].drop_nulls().unique()
    if emails.len():
        others = state.rows_where("profiles", "email", emails).filter(~pl.col("service_id").is_in(gone.implode()))
        alone = emails.filter(~emails.is_in(others["email"].implode()))
        changes.delete("email_addresses", state.rows_where("email_addresses", "email", alone))
    return changes


def remove_profiles(state: State, into: pl.DataFrame, clock: datetime) -> Changes:
    """Changes deleting profiles `into` (sid, into) with every row keyed by them; their event and
    purchase history follows `into` (null: it goes with them). Earlier redirects into them too."""
    changes = Changes()
    for name in ("profiles", "external_ids", "aliases", "attributes", "subscriptions", "push_tokens"):
        changes.delete(name, state.rows_where(name, "service_id", into["sid"]))
    earlier = state.rows_where("redirects", "into", into["sid"]).join(into.select(pl.col("sid").alias("into"), pl.col("into").alias("final")),
                                      on="into").select("service_id", pl.col("final").alias("into"))
    redirects = pl.concat([into.select(pl.col("sid").alias("service_id"), "into"), earlier])
    changes.upsert("redirects", redirects.with_columns(pl.lit(clock).alias("at")))
    return changes
