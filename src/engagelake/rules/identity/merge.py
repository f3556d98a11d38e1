"""A run of `/users/merge` updates, resolved as one fixed point.

Whether update j applies depends only on updates before it: a merged profile dies with its
identifiers, a target's "most recently updated" moves, and a target lacking an email or phone
gains the merged profile's. So: guess the applied set, compute every update's view of the store
from the guess (as-of joins on positions), re-decide every update at once, and repeat until the
guess reproduces itself. After k rounds the first k decisions are final, so it ends; the fixed
point is exactly the sequential answer. Usually two or three rounds.
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from engagelake.rules import messages as M
from engagelake.rules.identity.profiles_merge import consistent_edges, merge_forest, subtree_first
from engagelake.rules.identity.requests import ALIAS_SEP
from engagelake.rules.state import State

SIDES = ("src", "tgt")
SIDE_NAMES = {"src": "identifier_to_merge", "tgt": "identifier_to_keep"}


def strong_owners(state: State, sides: pl.DataFrame) -> pl.DataFrame:
    """`sides` (kind, key, ...) with `sid0`: the owner of an external ID (primary or deprecated),
    alias or service_id at the start of the run; null for email/phone sides and unknown IDs."""
    def keys(kind: str) -> pl.Series:
        return sides.filter(pl.col("kind") == kind)["key"]

    alias_key = pl.col("alias_label") + ALIAS_SEP + pl.col("alias_name")
    names = keys("user_alias").str.split(ALIAS_SEP).list.last()
    owners = pl.concat([
        state.rows_where("external_ids", "external_id", keys("external_id")).select(
            pl.lit("external_id").alias("kind"), pl.col("external_id").alias("key"), pl.col("service_id").alias("sid0")),
        state.rows_where("aliases", "alias_name", names).select(
            pl.lit("user_alias").alias("kind"), alias_key.alias("key"), pl.col("service_id").alias("sid0")),
        state.rows_where("profiles", "service_id", keys("service_id")).select(
            pl.lit("service_id").alias("kind"), pl.col("service_id").alias("key"), pl.col("service_id").alias("sid0")),
    ])
    return sides.join(owners, on=["kind", "key"], how="left", maintain_order="left")


def contact_candidates(state: State, sides: pl.DataFrame) -> pl.DataFrame:
    """(j, side, sid) for email/phone sides: the profiles holding that value at the run start."""
    parts = []
    for kind in ("email", "phone"):
        s = sides.filter(pl.col("kind") == kind)
        if s.height:
            holders = state.rows_where("profiles", kind, s["key"]).select(pl.col(kind).alias("key"), pl.col("service_id").alias("sid"))
            parts.append(s.join(holders, on="key").select("j", "side", "sid"))
    return pl.concat(parts) if parts else pl.DataFrame(schema={"j": pl.Int64, "side": pl.String, "sid": pl.String})


def prioritize(cands: pl.DataFrame, prio: pl.DataFrame) -> pl.DataFrame:
    """Apply each side's prioritization to its candidates: (j, side, sid, n) with n the number of
    candidates left (1: resolved). Candidates carry has_ext and a global recency rank `rk`."""
    group = ["j", "side"]
    c = cands.join(prio, on=group)
    for k in range(len(M.PRIORITIZATION_VALUES)):
        rule = pl.col("prio").list.get(k, null_on_oob=True)
        any_ext = pl.col("has_ext").any().over(group)
        all_ext = pl.col("has_ext").all().over(group)
        keep = (
            pl.when(rule == "identified").then(pl.col("has_ext") | ~any_ext)
            .when(rule == "unidentified").then(~pl.col("has_ext") | all_ext)
            .when(rule == "most_recently_updated").then(pl.col("rk") == pl.col("rk").max().over(group))
            .when(rule == "least_recently_updated").then(pl.col("rk") == pl.col("rk").min().over(group))
            .otherwise(True)
        )
        c = c.filter(keep)
    return c.with_columns(pl.len().over(group).alias("n")).select(*group, "sid", "n")


class MergeRun:
    """The updates of one run: `items` (j, seq, src_kind, src_key, src_prio, tgt_...)."""

    def __init__(self, state: State, items: pl.DataFrame, clock: datetime):
        self.state, self.items, self.clock = state, items, clock
        sides = pl.concat([
            items.select("j", pl.lit(s).alias("side"), pl.col(f"{s}_kind").alias("kind"),
                         pl.col(f"{s}_key").alias("key"), pl.col(f"{s}_prio").alias("prio"))
            for s in SIDES
        ])
        self.sides = strong_owners(state, sides)
        contact = self.sides.filter(pl.col("kind").is_in(["email", "phone"]))
        self.contact = contact.select("j", "side", "kind", "key", "prio")
        self.static_cands = contact_candidates(state, contact)
        # every profile the run can meet: the sides' owners and the email/phone holders (a
        # target that gains an email in the run is one of them)
        involved = pl.concat([self.sides["sid0"], self.static_cands["sid"]])
        self.prof = state.rows_where("profiles", "service_id", involved).select(
            pl.col("service_id").alias("sid"), pl.col("external_id").is_not_null().alias("has_ext"),
            "updated_at", "update_seq", "created_seq", "email", "phone")

    def solve(self) -> pl.DataFrame:
        """Per update: j, src_sid, tgt_sid, applied, reason (null when applied)."""
        guess = self._decide(self._resolve(self._edges(None)))
        for _ in range(self.items.height + 2):
            nxt = self._decide(self._resolve(self._edges(guess)))
            if nxt.equals(guess):
                return guess
            guess = nxt
        raise AssertionError("merge run did not reach its fixed point")  # unreachable: see module doc

    def _edges(self, decided: pl.DataFrame | None) -> pl.DataFrame:
        if decided is None:
            return pl.DataFrame(schema={"src": pl.String, "tgt": pl.String, "j": pl.Int64})
        edges = decided.filter("applied").select(pl.col("src_sid").alias("src"), pl.col("tgt_sid").alias("tgt"), "j")
        return consistent_edges(edges)

    def _resolve(self, edges: pl.DataFrame) -> pl.DataFrame:
        """(j, side, sid, status) for every side, as the store looks just before update j."""
        dead = edges.group_by("src").agg(pl.col("j").min().alias("dead_at"))
        alive = pl.col("dead_at").is_null() | (pl.col("dead_at") >= pl.col("j"))
        strong = (self.sides.filter(~pl.col("kind").is_in(["email", "phone"]))
                  .join(dead, left_on="sid0", right_on="src", how="left", maintain_order="left")
                  .select("j", "side", pl.when(alive).then(pl.col("sid0")).alias("sid"),
                          pl.when(pl.col("sid0").is_not_null() & alive).then(pl.lit("ok"))
                          .otherwise(pl.lit("unresolvable")).alias("status")))
        if self.contact.height == 0:
            return strong
        cands = pl.concat([self.static_cands, self._acquired(edges)]).unique()
        cands = cands.join(dead, left_on="sid", right_on="src", how="left").filter(alive).drop("dead_at")
        picked = prioritize(self._recency(cands, edges), self.contact.select("j", "side", "prio"))
        contact = self.contact.select("j", "side").join(picked, on=["j", "side"], how="left").select(
            "j", "side", pl.when(pl.col("n") == 1).then(pl.col("sid")).alias("sid"),
            pl.when(pl.col("n") == 1).then(pl.lit("ok")).when(pl.col("n") > 1).then(pl.lit("ambiguous"))
            .otherwise(pl.lit("unresolvable")).alias("status")).unique(["j", "side"])
        return pl.concat([strong, contact])

    def _acquired(self, edges: pl.DataFrame) -> pl.DataFrame:
        """(j, side, sid): targets that gained the side's email/phone from a merge before j."""
        empty = pl.DataFrame(schema={"j": pl.Int64, "side": pl.String, "sid": pl.String})
        if edges.height == 0:
            return empty
        forest = merge_forest(edges)
        parts = []
        for kind in ("email", "phone"):
            wanted = self.contact.filter(pl.col("kind") == kind)
            if wanted.height == 0:
                continue
            carried = subtree_first(forest, self.prof.select("sid", kind), kind)
            # a target without its own value takes the first merged profile's that has one
            gains = (edges.join(carried, left_on="src", right_on="sid").filter(pl.col(kind).is_not_null())
                     .join(self.prof.filter(pl.col(kind).is_null()).select("sid"), left_on="tgt", right_on="sid",
                           how="semi")
                     .sort("j").unique("tgt", keep="first")
                     .select(pl.col("tgt").alias("sid"), pl.col(kind).alias("key"), pl.col("j").alias("at")))
            parts.append(wanted.join(gains, on="key").filter(pl.col("at") < pl.col("j")).select("j", "side", "sid"))
        return pl.concat(parts) if parts else empty

    def _recency(self, cands: pl.DataFrame, edges: pl.DataFrame) -> pl.DataFrame:
        """Candidates with has_ext and `rk`: their recency rank as of their update's position
        (a merge target counts as updated at the clock, with that merge's sequence number)."""
        touches = edges.join(self.items.select("j", "seq"), on="j").select(
            pl.col("tgt").alias("sid"), pl.col("j").alias("tj"), "seq").sort("tj")
        c = cands.sort("j").join_asof(touches, left_on="j", right_on="tj", by="sid", strategy="backward",
                                      allow_exact_matches=False, check_sortedness=False)
        c = c.join(self.prof, on="sid", how="left").with_columns(
            pl.when(pl.col("tj").is_not_null()).then(pl.lit(self.clock).cast(self.prof.schema["updated_at"]))
            .otherwise("updated_at").alias("rec_at"),
            pl.coalesce("seq", "update_seq").alias("rec_seq"))
        return c.sort("rec_at", "rec_seq", "created_seq", nulls_last=False).with_row_index("rk").select(
            "j", "side", "sid", "has_ext", "rk")

    def _decide(self, res: pl.DataFrame) -> pl.DataFrame:
        wide = self.items.select("j")
        for s in SIDES:
            wide = wide.join(res.filter(pl.col("side") == s).select(
                "j", pl.col("sid").alias(f"{s}_sid"), pl.col("status").alias(f"{s}_status")), on="j", how="left")
        reason = (
            pl.when(pl.col("src_status") != "ok")
            .then(pl.col("src_status") + pl.lit(": " + SIDE_NAMES["src"]))
            .when(pl.col("tgt_status") != "ok")
            .then(pl.col("tgt_status") + pl.lit(": " + SIDE_NAMES["tgt"]))
            .when(pl.col("src_sid") == pl.col("tgt_sid")).then(pl.lit(M.SKIP_SAME_USER))
        )
        return wide.with_columns(reason.alias("reason")).with_columns(
            pl.col("reason").is_null().alias("applied")).sort("j").select(
            "j", pl.col("src_sid"), pl.col("tgt_sid"), "applied", "reason")

