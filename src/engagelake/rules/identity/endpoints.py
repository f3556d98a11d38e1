"""Identity endpoints: merge, identify, external ID rename/remove, aliases, delete.

The workspace hands over runs of consecutive requests of one endpoint. The requests are checked
and flattened into item rows (`bulk_requests` for merge and identify, `identity_requests` for
the small endpoints); the items of the whole run are then resolved and applied together, equal
to applying them one by one. Every item writes a lineage row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
import polars as pl

from engagelake.rules import messages as M
from engagelake.rules.identity import requests as R
from engagelake.rules.identity.bulk_requests import parse_identifies, parse_merges
from engagelake.rules.identity.merge import MergeRun, contact_candidates, prioritize, strong_owners
from engagelake.rules.identity.profiles_merge import (
    IDENTIFY_FIELDS,
    MERGE_FIELDS,
    forget_addresses,
    merge_effects,
    remove_profiles,
)
from engagelake.rules.profile.track import service_ids
from engagelake.rules.state import Changes, State, apply_changes
from engagelake.tables.types import UTC_TS

IDENTITY_PATHS: dict[str, str] = {
    "merge": "/users/merge",
    "identify": "/users/identify",
    "rename": "/users/external_ids/rename",
    "remove": "/users/external_ids/remove",
    "alias_new": "/users/alias/new",
    "alias_update": "/users/alias/update",
    "delete": "/users/delete",
}


@dataclass
class IdentityOutcome:
    responses: dict[int, tuple[int, Any]] = field(default_factory=dict)
    changes: Changes = field(default_factory=Changes)
    next_update_seq: int = 0
    next_profile_n: int = 0


@dataclass
class Run:
    """One run's context: the store before it, the batch clock, the lineage ids."""

    state: State
    clock: datetime
    seed: str
    batch: str
    kind: str

    def lineage(self, items: pl.DataFrame, **columns: Any) -> pl.DataFrame:
        """Lineage rows for `items` (req, item, seq); `columns` are expressions or literals."""
        exprs = [(v if isinstance(v, pl.Expr) else pl.lit(v)).alias(k) for k, v in columns.items()]
        return items.select(
            pl.lit(self.batch).alias("batch"), pl.col("req").alias("request"), "item", "seq",
            pl.lit(self.kind).alias("kind"), *exprs, pl.lit(self.clock).alias("at"))


def _parse(kind: str, body: Any) -> list[dict[str, Any]]:
    """Item rows of one request, or raise R.Invalid."""
    parsers: dict[str, Callable[[Any], list[dict[str, Any]]]] = {
        "rename": R.rename_items, "remove": R.remove_items,
        "alias_new": R.alias_new_items, "alias_update": R.alias_update_items, "delete": R.delete_items,
    }
    return parsers[kind](body)


def apply_identity(state: State, kind: str, pending: list[tuple[int, str]], *, clock: datetime, seed: str,
                   batch: str) -> IdentityOutcome:
    """Apply a run of requests of one identity endpoint; `pending` is (batch index, body JSON)."""
    out = IdentityOutcome(next_update_seq=state.next_update_seq, next_profile_n=state.next_profile_n)
    if kind in ("merge", "identify"):  # the bulk endpoints: checked and flattened for the whole run at once
        answered, frame = (parse_merges if kind == "merge" else parse_identifies)(pending)
        for req, message in answered.items():
            out.responses[req] = (400, {"message": message})
        valid = [req for req, _ in pending if req not in answered]
    else:
        valid, rows = [], []
        for req, text in pending:
            try:
                parsed = _parse(kind, orjson.loads(text))
            except R.Invalid as bad:
                out.responses[req] = (400, {"message": str(bad)})
                continue
            valid.append(req)
            rows += [{**row, "req": req} for row in parsed]
        frame = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()
    if not valid:
        return out
    if frame.height == 0:  # valid requests with empty arrays (identify, delete) change nothing
        for req in valid:
            out.responses[req] = (200, {"aliases_processed": 0, "message": "success"} if kind == "identify"
                                  else {"deleted": 0, "message": "success"})
        return out
    base = state.next_update_seq
    items = frame.with_row_index("j").with_columns(
        pl.col("j").cast(pl.Int64), (pl.col("j").cast(pl.Int64) + base).alias("seq"))
    # columns that may be all-null in a run still need their types for the joins
    items = items.with_columns(
        [pl.col(c).cast(pl.List(pl.String) if c.endswith("_prio") else pl.String)
         for c in items.columns if items.schema[c] == pl.Null])
    out.next_update_seq = base + items.height
    run = Run(state, clock, seed, batch, kind)
    handlers: dict[str, Callable[[Run, pl.DataFrame, list[int], IdentityOutcome], None]] = {
        "merge": _merge, "delete": _delete, "rename": _rename, "remove": _remove,
        "alias_new": _alias_new, "alias_update": _alias_update, "identify": _identify,
    }
    handlers[kind](run, items, valid, out)
    return out


def _merge(run: Run, items: pl.DataFrame, valid: list[int], out: IdentityOutcome) -> None:
    decided = MergeRun(run.state, items, run.clock).solve().join(items, on="j")
    edges = decided.filter("applied").select(
        pl.col("src_sid").alias("src"), pl.col("tgt_sid").alias("tgt"), "j", "seq", pl.lit(True).alias("fill"))
    out.changes.extend(merge_effects(run.state, edges, MERGE_FIELDS, run.clock))
    out.changes.upsert("merges", run.lineage(
        decided, rule="merge", outcome=_outcome(),
        reason=pl.col("reason"), source=pl.col("source"), target=pl.col("target"),
        source_sid=pl.col("src_sid"), target_sid=pl.col("tgt_sid")))
    for req in valid:
        out.responses[req] = (202, {"message": "success"})


def _delete(run: Run, items: pl.DataFrame, valid: list[int], out: IdentityOutcome) -> None:
    items = strong_owners(run.state, items.rename({"src_kind": "kind", "src_key": "key"}))
    # deleting only removes, so an identifier resolves before item j as at the run start, unless
    # an earlier item already deleted its user
    first = items.filter(pl.col("sid0").is_not_null()).group_by("sid0").agg(pl.col("j").min().alias("first"))
    items = items.join(first, on="sid0", how="left").with_columns(
        (pl.col("j") == pl.col("first")).fill_null(False).alias("applied"))
    gone = items.filter("applied").select(pl.col("sid0").alias("sid"), pl.lit(None, pl.String).alias("into"))
    out.changes.extend(forget_addresses(run.state, gone["sid"]))
    out.changes.extend(remove_profiles(run.state, gone, run.clock))
    out.changes.upsert("merges", run.lineage(
        items, rule="delete", outcome=_outcome(),
        reason=pl.when("applied").then(None).otherwise(pl.lit(M.SKIP_NO_USER)), source=pl.col("source"),
        source_sid=pl.col("sid0")))
    counts = dict(items.group_by("req").agg(pl.col("applied").sum()).iter_rows())  # one row per request: response shaping
    for req in valid:
        out.responses[req] = (200, {"deleted": int(counts.get(req, 0)), "message": "success"})


def _ext_json(col: pl.Expr) -> pl.Expr:
    """`{"external_id": <col>}` as JSON text (lineage rows name identifiers as requests do)."""
    return pl.struct(col.alias("external_id")).struct.json_encode()


def _outcome(applied: str = "applied") -> pl.Expr:
    return pl.when(pl.col(applied)).then(pl.lit("applied")).otherwise(pl.lit("skipped"))


def _fixed_point(decide: Callable[[pl.DataFrame], pl.DataFrame], n: int, start: pl.DataFrame) -> pl.DataFrame:
    """Iterate `decide` (a guess of every item's outcome -> the outcomes that guess implies) to
    its fixed point. An item's outcome depends only on earlier items, so round k fixes item k
    and the fixed point is the sequential answer."""
    guess = start
    for _ in range(n + 2):
        nxt = decide(guess)
        if nxt.equals(guess):
            return guess
        guess = nxt
    raise AssertionError("identity run did not reach its fixed point")


def _touch_profiles(state: State, last: pl.DataFrame, clock: datetime, **columns: pl.Expr) -> pl.DataFrame:
    """Profile rows of `last` (sid, seq) with updated_at = clock, update_seq = seq, plus `columns`."""
    prof = state.rows_where("profiles", "service_id", last["sid"])
    return (prof.join(last, left_on="service_id", right_on="sid", how="inner")
            .with_columns(pl.lit(clock).cast(prof.schema["updated_at"]).alias("updated_at"),
                          pl.col("seq").alias("update_seq"), **columns).drop("seq"))


def _rename(run: Run, items: pl.DataFrame, valid: list[int], out: IdentityOutcome) -> None:
    ext = run.state.rows_where("external_ids", "external_id", pl.concat([items["current"], items["new"]]))
    items = (items.join(ext.select(pl.col("external_id").alias("current"), pl.col("service_id").alias("cur_sid"),
                                   pl.col("primary").alias("cur_primary")), on="current", how="left")
             .join(ext.select(pl.col("external_id").alias("new"), pl.lit(True).alias("new_used")), on="new", how="left")
             .with_columns(pl.col("new_used").fill_null(False)))

    def decide(guess: pl.DataFrame) -> pl.DataFrame:
        done = guess.filter("applied")
        away = done.group_by("current").agg(pl.col("j").min().alias("away_at"))
        became = done.group_by("new").agg(pl.col("j").min().alias("became_at"), pl.col("sid").first().alias("via"))
        c = (items.join(away, on="current", how="left")
             .join(became.rename({"new": "current"}), on="current", how="left")
             .join(became.select(pl.col("new").alias("new_"), pl.col("became_at").alias("used_at")),
                   left_on="new", right_on="new_", how="left"))
        gone = pl.col("away_at").is_not_null() & (pl.col("away_at") < pl.col("j"))
        made = pl.col("became_at").is_not_null() & (pl.col("became_at") < pl.col("j"))
        primary = ((pl.col("cur_primary").fill_null(False) | made) & ~gone)
        deprecated = (pl.col("cur_primary") == False) | gone  # noqa: E712 (null: unknown ID)
        used = pl.col("new_used") | (pl.col("used_at").is_not_null() & (pl.col("used_at") < pl.col("j")))
        error = (pl.when(pl.col("static_error").is_not_null()).then(pl.col("static_error"))
                 .when(~primary & deprecated.fill_null(False)).then(pl.lit(M.RENAME_DEPRECATED))
                 .when(~primary).then(pl.lit(M.RENAME_UNKNOWN))
                 .when(used).then(pl.lit(M.RENAME_IN_USE)))
        return c.select("j", "current", "new", pl.when(made).then("via").otherwise("cur_sid").alias("sid"),
                        error.alias("error"), error.is_null().alias("applied")).sort("j")

    start = items.select("j", "current", "new", pl.lit(None, pl.String).alias("sid"),
                         pl.lit(None, pl.String).alias("error"), pl.lit(False).alias("applied"))
    decided = _fixed_point(decide, items.height, start).join(items.select("j", "req", "item", "seq"), on="j")
    done = decided.filter("applied")
    out.changes.upsert("external_ids", pl.concat([
        done.select(pl.col("new").alias("external_id"), pl.col("sid").alias("service_id"), pl.lit(True).alias("primary")),
        done.select(pl.col("current").alias("external_id"), pl.col("sid").alias("service_id"),
                    pl.lit(False).alias("primary")),
    ]))  # a key renamed to and later away from ends deprecated: the current rows come last
    last = done.sort("j").unique("sid", keep="last").select("sid", "seq", pl.col("new").alias("final"))
    out.changes.upsert("profiles", _touch_profiles(run.state, last, run.clock, external_id=pl.col("final")).drop("final"))
    out.changes.upsert("merges", run.lineage(
        decided, rule="rename", outcome=_outcome(), reason=pl.col("error"),
        source=_ext_json(pl.col("current")), target=_ext_json(pl.col("new")), source_sid=pl.col("sid"), target_sid=pl.col("sid")))
    _answer_lists(decided, valid, out, ok_field="external_ids", error_field="rename_errors")


def _answer_lists(decided: pl.DataFrame, valid: list[int], out: IdentityOutcome, *, ok_field: str,
                  error_field: str) -> None:
    """Responses listing each request's successes and its [message, index] errors."""
    per_req = decided.sort("j").group_by("req", maintain_order=True).agg(
        pl.col("current").filter("applied").alias("ok"),
        pl.concat_list(pl.col("error"), pl.col("item").cast(pl.String)).filter(~pl.col("applied")).alias("errors"))
    lists = {r: (ok, errs) for r, ok, errs in per_req.iter_rows()}  # one row per request (<= 50 items): response shaping
    for req in valid:
        ok, errs = lists.get(req, ([], []))
        out.responses[req] = (200, {"message": "success", ok_field: ok,
                                    error_field: [[msg, int(i)] for msg, i in errs]})


def _remove(run: Run, items: pl.DataFrame, valid: list[int], out: IdentityOutcome) -> None:
    ext = run.state.rows_where("external_ids", "external_id", items["current"]).select(
        pl.col("external_id").alias("current"), "service_id", "primary")
    items = items.join(ext, on="current", how="left")
    # removing only removes: the first valid removal of a deprecated ID applies, later ones find nothing
    first = items.filter(pl.col("primary") == False).group_by("current").agg(  # noqa: E712
        pl.col("j").min().alias("first"))
    items = items.join(first, on="current", how="left")
    error = (pl.when(pl.col("static_error").is_not_null()).then(pl.col("static_error"))
             .when(pl.col("primary") == True).then(pl.lit(M.REMOVE_PRIMARY))  # noqa: E712
             .when(pl.col("first") != pl.col("j")).then(pl.lit(M.REMOVE_UNKNOWN))
             .when(pl.col("first").is_null()).then(pl.lit(M.REMOVE_UNKNOWN)))
    decided = items.with_columns(error.alias("error")).with_columns(pl.col("error").is_null().alias("applied"))
    out.changes.delete("external_ids", decided.filter("applied").select(pl.col("current").alias("external_id")))
    out.changes.upsert("merges", run.lineage(
        decided, rule="remove", outcome=_outcome(), reason=pl.col("error"), source=_ext_json(pl.col("current")),
        source_sid=pl.col("service_id")))
    _answer_lists(decided, valid, out, ok_field="removed_ids", error_field="removal_errors")


def _alias_frame(keys: pl.Expr, sid: pl.Expr) -> list[pl.Expr]:
    parts = keys.str.split_exact(R.ALIAS_SEP, 1)
    return [parts.struct.field("field_0").alias("alias_label"), parts.struct.field("field_1").alias("alias_name"),
            sid.alias("service_id")]


def _alias_keys(state: State, aliases: pl.Series | None = None, owners: pl.Series | None = None) -> pl.DataFrame:
    """Aliases as (alias, label, service_id): those named in `aliases` (label SEP name) and those
    of the profiles `owners`, read by key; every alias when neither is given."""
    if aliases is None and owners is None:
        a = state["aliases"]
    else:
        parts = []
        if aliases is not None:
            names = aliases.str.split_exact(R.ALIAS_SEP, 1).struct.field("field_1")
            parts.append(state.rows_where("aliases", "alias_name", names))
        if owners is not None:
            parts.append(state.rows_where("aliases", "service_id", owners))
        a = pl.concat(parts).unique(maintain_order=True)
    return a.select((pl.col("alias_label") + R.ALIAS_SEP + pl.col("alias_name")).alias("alias"),
                    pl.col("alias_label").alias("label"), "service_id")


def _alias_new(run: Run, items: pl.DataFrame, valid: list[int], out: IdentityOutcome) -> None:
    state = run.state
    if "external_id" not in items.columns:
        items = items.with_columns(pl.lit(None, pl.String).alias("external_id"))
    owners = state.rows_where("external_ids", "external_id", items["external_id"]).select(
        "external_id", pl.col("service_id").alias("owner"))
    aliases = _alias_keys(state, items["alias"], owners["owner"])
    items = (items.join(aliases.select("alias", pl.lit(True).alias("exists0")), on="alias", how="left")
             .join(owners, on="external_id", how="left")
             .join(aliases.select(pl.col("service_id").alias("owner"), "label", pl.lit(True).alias("taken0")).unique(),
                   on=["owner", "label"], how="left")
             .with_columns(pl.col("exists0").fill_null(False), pl.col("taken0").fill_null(False)))

    def decide(guess: pl.DataFrame) -> pl.DataFrame:
        done = guess.filter("applied")
        a_first = done.group_by("alias").agg(pl.col("j").min().alias("a_first"))
        l_first = done.filter(pl.col("owner").is_not_null()).group_by("owner", "label").agg(
            pl.col("j").min().alias("l_first"))
        c = items.join(a_first, on="alias", how="left").join(l_first, on=["owner", "label"], how="left")
        error = (pl.when(pl.col("exists0") | (pl.col("a_first") < pl.col("j")).fill_null(False))
                 .then(pl.lit(M.SKIP_ALIAS_EXISTS))
                 .when(pl.col("external_id").is_not_null() & pl.col("owner").is_null()).then(pl.lit(M.SKIP_NO_USER))
                 .when(pl.col("taken0") | (pl.col("l_first") < pl.col("j")).fill_null(False))
                 .then(pl.lit(M.SKIP_LABEL_TAKEN)))
        return c.select("j", "alias", "label", "owner", error.alias("error"),
                        error.is_null().alias("applied")).sort("j")

    start = items.select("j", "alias", "label", "owner", pl.lit(None, pl.String).alias("error"),
                         pl.lit(False).alias("applied"))
    decided = _fixed_point(decide, items.height, start).join(
        items.select("j", "req", "item", "seq", "external_id", "source", "target"), on="j")
    done = decided.filter("applied")
    created = done.filter(pl.col("external_id").is_null()).sort("j").with_row_index("k").with_columns(
        (pl.col("k").cast(pl.Int64) + state.next_profile_n).alias("n"))
    created = created.with_columns(service_ids(run.seed, created["n"]).alias("owner"))
    out.next_profile_n = state.next_profile_n + created.height
    now = pl.lit(run.clock).cast(UTC_TS)
    out.changes.upsert("profiles", created.select(
        pl.col("owner").alias("service_id"), now.alias("created_at"), pl.col("n").alias("created_seq"),
        now.alias("updated_at"), pl.col("seq").alias("update_seq"),
        (pl.col("owner").str.slice(0, 8).str.to_integer(base=16) % 10000).cast(pl.Int32).alias("random_bucket"),
        pl.lit(False).alias("language_explicit"), pl.lit(False).alias("push_anonymous")))
    added = done.filter(pl.col("external_id").is_not_null())
    out.changes.upsert("profiles", _touch_profiles(
        state, added.sort("j").unique("owner", keep="last").select(pl.col("owner").alias("sid"), "seq"), run.clock))
    out.changes.upsert("aliases", pl.concat([added, created.drop("k", "n")], how="diagonal_relaxed").select(
        _alias_frame(pl.col("alias"), pl.col("owner"))))
    decided = decided.join(created.select("j", pl.col("owner").alias("new_sid")), on="j", how="left")
    out.changes.upsert("merges", run.lineage(
        decided, rule=pl.when(pl.col("external_id").is_null()).then(pl.lit("alias_new:create"))
        .otherwise(pl.lit("alias_new:add")), outcome=_outcome(), reason=pl.col("error"),
        source=pl.col("source"), target=pl.col("target"), target_sid=pl.coalesce("owner", "new_sid")))
    counts = dict(items.group_by("req").len().iter_rows())  # one row per request: response shaping
    for req in valid:
        out.responses[req] = (200, {"aliases_processed": int(counts.get(req, 0)), "message": "success"})


def _alias_update(run: Run, items: pl.DataFrame, valid: list[int], out: IdentityOutcome) -> None:
    aliases = _alias_keys(run.state, pl.concat([items["old"], items["new"]])).select("alias", "service_id")
    items = (items.join(aliases.select(pl.col("alias").alias("old"), pl.col("service_id").alias("old_owner0")),
                        on="old", how="left")
             .join(aliases.select(pl.col("alias").alias("new"), pl.lit(True).alias("new_exists0")), on="new", how="left")
             .with_columns(pl.col("new_exists0").fill_null(False)))

    def events(guess: pl.DataFrame) -> pl.DataFrame:
        done = guess.filter("applied")
        return pl.concat([
            done.select(pl.col("old").alias("alias"), pl.col("j").alias("at"), pl.lit(False).alias("present"),
                        pl.lit(None, pl.String).alias("owner")),
            done.select(pl.col("new").alias("alias"), pl.col("j").alias("at"), pl.lit(True).alias("present"),
                        pl.col("sid").alias("owner")),
        ]).sort("at")

    def decide(guess: pl.DataFrame) -> pl.DataFrame:
        ev = events(guess)
        c = items.sort("j")
        for side in ("old", "new"):  # the last change of each alias before item j, if any
            c = c.join_asof(ev.rename({"alias": side, "at": f"{side}_at", "present": f"{side}_present",
                                       "owner": f"{side}_owner"}),
                            left_on="j", right_on=f"{side}_at", by=side, strategy="backward",
                            allow_exact_matches=False, check_sortedness=False)
        old_there = pl.when(pl.col("old_at").is_not_null()).then(pl.col("old_present")).otherwise(
            pl.col("old_owner0").is_not_null())
        new_there = pl.when(pl.col("new_at").is_not_null()).then(pl.col("new_present")).otherwise(pl.col("new_exists0"))
        error = (pl.when(~old_there).then(pl.lit(M.SKIP_NO_USER))
                 .when(new_there).then(pl.lit(M.SKIP_ALIAS_EXISTS)))
        sid = pl.when(pl.col("old_at").is_not_null()).then(pl.col("old_owner")).otherwise(pl.col("old_owner0"))
        return c.select("j", "old", "new", pl.when(error.is_null()).then(sid).alias("sid"), error.alias("error"),
                        error.is_null().alias("applied"))

    start = items.select("j", "old", "new", pl.lit(None, pl.String).alias("sid"), pl.lit(None, pl.String).alias("error"),
                         pl.lit(False).alias("applied"))
    decided = _fixed_point(decide, items.height, start).join(
        items.select("j", "req", "item", "seq", "source", "target"), on="j")
    final = events(decided).unique("alias", keep="last", maintain_order=True)
    out.changes.delete("aliases", final.filter(~pl.col("present")).select(_alias_frame(pl.col("alias"), pl.col("owner"))))
    out.changes.upsert("aliases", final.filter("present").select(_alias_frame(pl.col("alias"), pl.col("owner"))))
    done = decided.filter("applied")
    out.changes.upsert("profiles", _touch_profiles(
        run.state, done.sort("j").unique("sid", keep="last").select("sid", "seq"), run.clock))
    out.changes.upsert("merges", run.lineage(
        decided, rule="alias_update", outcome=_outcome(), reason=pl.col("error"), source=pl.col("source"),
        target=pl.col("target"), source_sid=pl.col("sid"), target_sid=pl.col("sid")))
    for req in valid:
        out.responses[req] = (200, {"message": "success"})


def _identify(run: Run, items: pl.DataFrame, valid: list[int], out: IdentityOutcome) -> None:
    state, clock = run.state, run.clock
    items = strong_owners(state, items.with_columns(pl.col("src_kind").alias("kind"), pl.col("src_key").alias("key")))
    holders = state.rows_where("external_ids", "external_id", items["external_id"]).select(
        "external_id", pl.col("service_id").alias("holder0"))
    items = items.with_columns(
        pl.when(pl.col("kind") == "user_alias").then(pl.col("key").str.split(R.ALIAS_SEP).list.first()).alias("label"),
        pl.lit("src").alias("side"), pl.col("src_prio").alias("prio"),
    ).join(holders, on="external_id", how="left")
    contact = items.filter(pl.col("kind") != "user_alias")
    static_cands = contact_candidates(state, contact.select("j", "side", "kind", "key"))
    # every stored profile the run can meet: anonymous profiles by alias, email or phone, and
    # the holders of the external IDs (profiles created in the run are not stored yet)
    involved = pl.concat([items["sid0"], static_cands["sid"], holders["holder0"]]).drop_nulls().unique()
    prof = state.rows_where("profiles", "service_id", involved).select(
        pl.col("service_id").alias("sid"), pl.col("external_id").is_not_null().alias("has_ext0"),
        "updated_at", "update_seq", "created_seq", "phone")
    labels0 = _alias_keys(state, owners=involved).select(pl.col("service_id").alias("U"), "label").unique()

    def decide(guess: pl.DataFrame) -> pl.DataFrame:
        assigned = guess.filter(pl.col("action") == "assign")
        merged = guess.filter(pl.col("action") == "merge")
        dead = merged.group_by("P").agg(pl.col("j").min().alias("dead_at"))
        ext_at = assigned.group_by("P").agg(pl.col("j").min().alias("ext_at"))
        holder = assigned.group_by("external_id").agg(pl.col("j").min().alias("held_at"),
                                                      pl.col("P").first().alias("held_by"))
        moved = merged.filter(pl.col("kind") == "user_alias").select("key", pl.col("j").alias("moved_at"),
                                                                     pl.col("U").alias("moved_to"))
        alive = pl.col("dead_at").is_null() | (pl.col("dead_at") >= pl.col("j"))
        # the anonymous profile P of alias elements: the alias's owner as of j
        by_alias = (items.filter(pl.col("kind") == "user_alias").select("j", "key", "sid0")
                    .join(moved, on="key", how="left")
                    .with_columns(pl.when(pl.col("moved_at") < pl.col("j")).then("moved_to").otherwise("sid0").alias("sid"))
                    .join(dead, left_on="sid", right_on="P", how="left")
                    .select("j", pl.when(alive).then("sid").alias("P"),
                            pl.when(pl.col("sid").is_not_null() & alive).then(pl.lit(1)).otherwise(pl.lit(0)).alias("n")))
        # ... and of email/phone elements: the prioritized candidate as of j
        parts = [by_alias]
        if contact.height:
            gains = (merged.filter(pl.col("merge_behavior") == "merge")
                     .join(prof.select(pl.col("sid").alias("P"), pl.col("phone").alias("p_phone")), on="P")
                     .join(prof.filter(pl.col("phone").is_null()).select(pl.col("sid").alias("U")), on="U", how="semi")
                     .filter(pl.col("p_phone").is_not_null()).sort("j").unique("U", keep="first")
                     .select(pl.col("U").alias("sid"), pl.col("p_phone").alias("key"), pl.col("j").alias("at")))
            acquired = (contact.filter(pl.col("kind") == "phone").select("j", "side", "key").join(gains, on="key")
                        .filter(pl.col("at") < pl.col("j")).select("j", "side", "sid"))
            cands = (pl.concat([static_cands, acquired]).unique()
                     .join(dead, left_on="sid", right_on="P", how="left").filter(alive).drop("dead_at"))
            touches = pl.concat([assigned.select(pl.col("P").alias("sid"), "j", "seq"),
                                 merged.select(pl.col("U").alias("sid"), "j", "seq")]).rename({"j": "tj"}).sort("tj")
            c = (cands.sort("j").join_asof(touches, left_on="j", right_on="tj", by="sid", strategy="backward",
                                           allow_exact_matches=False, check_sortedness=False)
                 .join(prof, on="sid", how="left").join(ext_at, left_on="sid", right_on="P", how="left")
                 .with_columns(
                     (pl.col("has_ext0") | (pl.col("ext_at") < pl.col("j")).fill_null(False)).alias("has_ext"),
                     pl.when(pl.col("tj").is_not_null()).then(pl.lit(clock).cast(prof.schema["updated_at"]))
                     .otherwise("updated_at").alias("rec_at"),
                     pl.coalesce("seq", "update_seq").alias("rec_seq")))
            c = c.sort("rec_at", "rec_seq", "created_seq").with_row_index("rk").select("j", "side", "sid", "has_ext", "rk")
            picked = prioritize(c, contact.select("j", "side", "prio"))
            parts.append(contact.select("j").join(picked.select("j", pl.col("sid").alias("P"), "n"), on="j", how="left")
                         .unique("j").with_columns(pl.col("n").fill_null(0)))
        p = pl.concat(parts, how="vertical_relaxed")
        c = (items.select("j", "kind", "key", "label", "external_id", "holder0", "merge_behavior", "seq")
             .join(p, on="j", how="left")
             .join(ext_at, on="P", how="left")
             .join(holder, on="external_id", how="left")
             .with_columns(pl.coalesce("holder0", pl.when(pl.col("held_at") < pl.col("j")).then("held_by")).alias("U")))
        moved_labels = merged.filter(pl.col("kind") == "user_alias").select(
            "U", pl.col("label").alias("mlabel"), pl.col("j").alias("mj"))
        taken = (c.select("j", "U", "label").join(moved_labels, on="U").filter(
            (pl.col("mlabel") == pl.col("label")) & (pl.col("mj") < pl.col("j"))).select("j").unique()
            .with_columns(pl.lit(True).alias("taken_dyn")))
        c = (c.join(labels0.with_columns(pl.lit(True).alias("taken0")), on=["U", "label"], how="left")
             .join(taken, on="j", how="left"))
        has_ext = (prof.select(pl.col("sid").alias("P"), "has_ext0"))
        c = c.join(has_ext, on="P", how="left").with_columns(
            (pl.col("has_ext0").fill_null(False) | (pl.col("ext_at") < pl.col("j")).fill_null(False)).alias("p_ext"))
        reason = (pl.when(pl.col("n") == 0).then(pl.lit(M.SKIP_UNRESOLVABLE.format(side="user")))
                  .when(pl.col("n") > 1).then(pl.lit(M.SKIP_AMBIGUOUS.format(side="user")))
                  .when(pl.col("p_ext")).then(pl.lit(M.SKIP_IDENTIFIED))
                  .when(pl.col("U").is_not_null() & (pl.col("taken0").fill_null(False)
                                                     | pl.col("taken_dyn").fill_null(False)))
                  .then(pl.lit(M.SKIP_LABEL_TAKEN)))
        action = (pl.when(reason.is_not_null()).then(pl.lit("skip"))
                  .when(pl.col("U").is_null()).then(pl.lit("assign")).otherwise(pl.lit("merge")))
        return c.select("j", "kind", "key", "label", "external_id", "merge_behavior", "seq",
                        pl.when(pl.col("n") == 1).then("P").alias("P"),
                        pl.when(action == "merge").then("U").alias("U"), action.alias("action"),
                        reason.alias("reason")).sort("j")

    start = items.select("j", "kind", "key", "label", "external_id", "merge_behavior", "seq",
                         pl.lit(None, pl.String).alias("P"), pl.lit(None, pl.String).alias("U"),
                         pl.lit("skip").alias("action"), pl.lit(None, pl.String).alias("reason"))
    decided = _fixed_point(decide, items.height, start).join(
        items.select("j", "req", "item", "source", "target"), on="j")
    # assignments first: a profile identified in this run can then receive merges
    assigned = decided.filter(pl.col("action") == "assign")
    assign = Changes()
    assign.upsert("external_ids", assigned.select("external_id", pl.col("P").alias("service_id"),
                                                  pl.lit(True).alias("primary")))
    assign.upsert("profiles", _touch_profiles(state, assigned.select(pl.col("P").alias("sid"), "seq", "external_id")
                                              .rename({"external_id": "new_ext"}), clock,
                                              external_id=pl.col("new_ext")).drop("new_ext"))
    out.changes.extend(assign)
    after = apply_changes(state, assign, next_profile_n=state.next_profile_n, next_update_seq=state.next_update_seq)
    merged = decided.filter(pl.col("action") == "merge")
    edges = merged.select(pl.col("P").alias("src"), pl.col("U").alias("tgt"), "j", "seq",
                          (pl.col("merge_behavior") == "merge").alias("fill"))
    out.changes.extend(merge_effects(after, edges, IDENTIFY_FIELDS, clock))
    out.changes.upsert("aliases", merged.filter(pl.col("kind") == "user_alias").select(
        _alias_frame(pl.col("key"), pl.col("U"))))
    rule = pl.concat_str(pl.lit("identify:"), pl.when(pl.col("action") == "assign").then(pl.lit("assign"))
                         .otherwise(pl.col("merge_behavior")))
    out.changes.upsert("merges", run.lineage(
        decided, rule=rule, outcome=pl.when(pl.col("action") != "skip").then(pl.lit("applied"))
        .otherwise(pl.lit("skipped")), reason=pl.col("reason"), source=pl.col("source"), target=pl.col("target"),
        source_sid=pl.col("P"), target_sid=pl.coalesce("U", pl.when(pl.col("action") == "assign").then("P"))))
    counts = dict(items.group_by("req").len().iter_rows())  # one row per request: response shaping
    for req in valid:
        out.responses[req] = (200, {"aliases_processed": int(counts.get(req, 0)), "message": "success"})
