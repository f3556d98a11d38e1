"""Lineage: a user's history in the `merges` table (merges, identifies, renames, aliases, deletes)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import polars as pl

from engagelake.rules.state import State

KINDS = ("external_id", "user_alias", "service_id", "email", "phone")


def lineage_rows(state: State, identifier: str, *, kind: str = "external_id") -> pl.DataFrame:
    """Rows of `merges` about the profiles `identifier` names or named (as sent in any request,
    or as the current owner), grown to every profile connected to them by a merge, in order.
    `user_alias` identifiers are written `label:name`."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    merges = state["merges"]
    # the identifier as a request named it (sources and targets are the identifiers as sent, JSON)
    named = merges.filter(pl.any_horizontal(_names(pl.col(c), kind, identifier) for c in ("source", "target")))
    sids = set(named["source_sid"].drop_nulls()) | set(named["target_sid"].drop_nulls())
    sids |= set(_current_owners(state, kind, identifier))
    edges = merges.filter(pl.col("outcome") == "applied").select("source_sid", "target_sid").drop_nulls()
    while True:  # connected profiles: grow until nothing new (lineage graphs are small)
        linked = edges.filter(pl.col("source_sid").is_in(list(sids)) | pl.col("target_sid").is_in(list(sids)))
        grown = sids | set(linked["source_sid"]) | set(linked["target_sid"])
        if grown == sids:
            break
        sids = grown
    rows = merges.filter(pl.col("source_sid").is_in(list(sids)) | pl.col("target_sid").is_in(list(sids)))
    return pl.concat([rows, named]).unique(maintain_order=True).sort("at", "seq")


def _names(col: pl.Expr, kind: str, identifier: str) -> pl.Expr:
    if kind == "user_alias":
        label, _, name = identifier.partition(":")
        return ((col.str.json_path_match("$.user_alias.alias_label") == label)
                & (col.str.json_path_match("$.user_alias.alias_name") == name)).fill_null(False)
    return (col.str.json_path_match(f"$.{kind}") == identifier).fill_null(False)


def _current_owners(state: State, kind: str, identifier: str) -> list[str]:
    """The profiles holding the identifier now (read by key, not by loading the tables)."""
    if kind == "external_id":
        return state.rows_where("external_ids", "external_id", [identifier])["service_id"].to_list()
    if kind == "user_alias":
        label, _, name = identifier.partition(":")
        rows = state.rows_where("aliases", "alias_name", [name])
        return rows.filter(pl.col("alias_label") == label)["service_id"].to_list()
    if kind == "service_id":
        return [identifier]
    return state.rows_where("profiles", kind, [identifier])["service_id"].to_list()


def _identifier_text(col: str) -> pl.Expr:
    """`{"external_id": "u1"}` -> `u1`; aliases as `label:name`; email/phone/service_id with
    their kind; anything else as sent."""
    c = pl.col(col)
    alias = c.str.json_path_match("$.user_alias.alias_label") + ":" + c.str.json_path_match("$.user_alias.alias_name")
    bare_alias = c.str.json_path_match("$.alias_label") + ":" + c.str.json_path_match("$.alias_name")  # alias rows
    return pl.coalesce(
        c.str.json_path_match("$.external_id"), alias, bare_alias,
        *[pl.lit(f"{k} ") + c.str.json_path_match(f"$.{k}") for k in ("email", "phone", "service_id")], c)


def describe(rows: pl.DataFrame) -> pl.DataFrame:
    """Lineage rows shaped for people: identifiers as text, service IDs shortened."""
    return rows.select(
        "kind", "outcome", _identifier_text("source").alias("from"), _identifier_text("target").alias("to"),
        pl.col("reason").fill_null(""), pl.col("source_sid").str.slice(0, 8).alias("from_sid"),
        pl.col("target_sid").str.slice(0, 8).alias("to_sid"))


DELETING = ("delete", "cleanup")  # kinds whose applied rows delete their source profile


@dataclass(frozen=True)
class LineageStep:
    """One lineage row, for people: identifiers as text; `merged` is the profile an applied
    merge or identify folded into this one, with its own earlier history."""

    at: datetime
    kind: str
    outcome: str
    source: str | None
    target: str | None
    reason: str | None
    merged: ProfileHistory | None = None


@dataclass(frozen=True)
class ProfileHistory:
    """A profile's lineage steps in order; `deleted` when one of them deleted it."""

    service_id: str
    steps: list[LineageStep]
    deleted: bool


def lineage_tree(rows: pl.DataFrame) -> tuple[list[ProfileHistory], list[LineageStep]]:
    """Lineage rows as a forest: each profile that was not merged away, its steps, and under
    each applied merge (or identify) the merged profile's own history. Rows that name no
    profile (both sides unresolvable) come second, as loose steps. Lineage is small: rows are
    walked in Python."""
    shown = rows.select(
        "at", "kind", "outcome", "source_sid", "target_sid", _identifier_text("source").alias("from"),
        _identifier_text("target").alias("to"), "reason")
    steps: dict[str, list[tuple[LineageStep, str | None]]] = {}  # owner -> (step, merged profile)
    loose: list[LineageStep] = []
    merged_away: set[str] = set()
    for r in shown.iter_rows(named=True):  # not hot: one user's lineage rows, drawn for a person (CLI)
        step = LineageStep(r["at"], r["kind"], r["outcome"], r["from"], r["to"], r["reason"])
        source, target = r["source_sid"], r["target_sid"]
        folds = r["outcome"] == "applied" and source is not None and target is not None and source != target
        owner = target if folds or (target is not None and source is None) else source or target
        if owner is None:
            loose.append(step)
            continue
        steps.setdefault(owner, []).append((step, source if folds else None))
        if folds:
            merged_away.add(source)
            steps.setdefault(source, [])
    built: set[str] = set()

    def build(sid: str) -> ProfileHistory:
        built.add(sid)
        own = [LineageStep(s.at, s.kind, s.outcome, s.source, s.target, s.reason,
                           build(m) if m is not None and m not in built else None) for s, m in steps[sid]]
        deleted = any(s.kind in DELETING and s.outcome == "applied" for s, m in steps[sid] if m is None)
        return ProfileHistory(sid, own, deleted)

    roots = [build(sid) for sid in steps if sid not in merged_away]
    roots += [build(sid) for sid in steps if sid not in built]  # a cycle, which merges cannot make
    return roots, loose
