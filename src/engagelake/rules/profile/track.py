"""`/users/track` over a whole batch: identity resolution, state-dependent checks, and the
changes to every table, exactly as if the objects were applied one by one.

Ordering inside a batch is `seq` (request, then attributes, events, purchases, then index).
Most of a batch is static: external IDs and aliases resolve by joins, and the first object that
may create a profile creates it. What depends on earlier objects — which profile an email or
phone picks (recency changes as objects apply), whether a service ID or push token exists yet,
whether an `inc` meets a number — is solved as a fixed point: each pass recomputes those
outcomes from the previous pass's outcomes, with every outcome at `seq` depending only on
outcomes before it, so the first difference moves forward every pass and the loop ends when a
pass changes nothing (two passes in the common case). Each pass is joins, as-of joins and
window functions over the batch.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import polars as pl

from engagelake.requests.models import TrackFatalResponse, TrackResponse, dump
from engagelake.rules import duck
from engagelake.rules.messages import ERR_UNKNOWN_SERVICE_ID
from engagelake.rules.profile.attributes import attribute_errors, fold_attributes
from engagelake.rules.profile.parse import ARRAYS
from engagelake.rules.profile.reading import TrackInput
from engagelake.rules.profile.validate import ValidTrack
from engagelake.rules.state import Changes, State
from engagelake.tables.partial import SET, mask_of
from engagelake.tables.schema import SCHEMAS, conform
from engagelake.tables.types import UTC_TS

SEP = "\x1f"  # joins alias label and name, app_id and token, into one key


@dataclass
class TrackOutcome:
    responses: dict[int, tuple[int, dict[str, Any]]]
    changes: Changes
    next_profile_n: int
    next_update_seq: int


TEMP_PREFIX = "~"  # a temporary ID names a profile a pass creates (no service ID starts so)


def _temp_id(seq: pl.Expr, pos: pl.Expr) -> pl.Expr:
    return pl.format(TEMP_PREFIX + "{}:{}", seq, pos)


def service_ids(seed: str, ordinals: pl.Series) -> pl.Series:
    """`sha256(f"{seed}:{n}")[:24]` for each ordinal, computed in DuckDB."""
    if ordinals.len() == 0:
        return pl.Series([], dtype=pl.String)
    with duck.connection() as con:
        con.register("ords", pl.DataFrame({"n": ordinals}).to_arrow())
        out = con.sql(
            "SELECT left(sha256($seed || ':' || n::VARCHAR), 24) AS sid FROM ords", params={"seed": seed}
        ).to_arrow_table()
    return pl.Series(out.column("sid")).cast(pl.String)  # no Python string per ID (10 ms for 80k)


def _asof(left: pl.DataFrame, timeline: pl.DataFrame, *, value: str, inclusive: bool) -> pl.DataFrame:
    """For each (sid, seq) row of `left`: the timeline's last `value` for that sid before `seq`
    (at or before when `inclusive`), in column `value`, and `found` telling whether one exists."""
    tl = timeline.select("sid", pl.col("seq").alias("tl_seq"), pl.col("seq"), value).sort("seq")
    return left.sort("seq").join_asof(
        tl, on="seq", by="sid", strategy="backward", allow_exact_matches=inclusive, check_sortedness=False
    ).with_columns(found=pl.col("tl_seq").is_not_null()).drop("tl_seq")


class _Batch:
    """Everything one track pass needs, kept together so each rule is a short method."""

    def __init__(self, state: State, valid: ValidTrack, clock: datetime, seed: str):
        self.state, self.valid, self.clock, self.seed = state, valid, clock, seed
        self.gbase = state.next_update_seq
        objs = valid.objects
        self.ok = objs.filter(pl.col("error").is_null())
        self.imports = self.ok.filter(pl.col("import_mode"))
        regular = self.ok.filter(~pl.col("import_mode"))
        self.kind_of = regular.select("seq", "kind")
        self._resolve_strong(regular)
        self.dynamic = regular.filter(pl.col("kind").is_in(["email", "phone", "sid"]))
        self.import_tokens = valid.tokens.join(self.imports.select("seq"), on="seq").with_columns(
            tkey=pl.col("app_id") + SEP + pl.col("token"))
        batch_tokens = valid.tokens.select(tkey=pl.col("app_id") + SEP + pl.col("token")).unique()
        self.state_tokens = (
            state.rows_where("push_tokens", "token", valid.tokens["token"])
            .select(tkey=pl.col("app_id") + SEP + pl.col("token"), sid=pl.col("service_id"))
            .filter(pl.col("tkey").is_in(batch_tokens["tkey"].implode()))
        )
        self.prof = self._relevant_profiles(regular)

    def _relevant_profiles(self, regular: pl.DataFrame) -> pl.DataFrame:
        """The state profiles this batch can read or touch: its static targets, holders of the
        emails and phones it names, service IDs it names, owners of its push tokens. Every later
        lookup joins against this small frame instead of the whole store."""
        fields = self.valid.fields
        strong_sids = self.strong_targets.filter(pl.col("target").is_not_null())["target"].unique()
        # same-email propagation reads the holders of its sources' stored emails; a source is an
        # external-ID object that writes email_subscribe or subscription groups
        propagating = pl.concat([
            fields.filter((pl.col("field") == "email_subscribe") & pl.col("value").is_not_null())["seq"],
            self.valid.groups["seq"],
        ]).unique()
        sources = (
            self.strong_targets.filter(pl.col("seq").is_in(propagating.implode()) & pl.col("target").is_not_null())
            .join(self.kind_of.filter(pl.col("kind") == "ext"), on="seq")["target"].unique()
        )
        target_emails = self.state.rows_where("profiles", "service_id", sources)["email"].drop_nulls()
        emails = pl.concat([
            regular.filter(pl.col("kind") == "email")["key"],
            fields.filter(pl.col("field") == "email")["value"].drop_nulls(),
            target_emails,
        ]).unique()
        phones = pl.concat([
            regular.filter(pl.col("kind") == "phone")["key"],
            fields.filter(pl.col("field") == "phone")["value"].drop_nulls(),
        ]).unique()
        # a profile's stored row matters to a strong target only where it competes for an email
        # or phone named by an email- or phone-identified object (its recency, its external ID,
        # its creation order), or as a propagation source: else the batch writes partial rows
        by_contact = regular.filter(pl.col("kind").is_in(["email", "phone"])).height > 0
        contact_writers = (
            self.strong_targets.join(fields.filter(pl.col("field").is_in(["email", "phone"])).select("seq"), on="seq")
            ["target"].drop_nulls() if by_contact else strong_sids.clear()
        )
        sids = pl.concat([
            sources,
            contact_writers,
            regular.filter(pl.col("kind") == "sid")["key"],
            self.state_tokens["sid"],
        ]).unique()
        prof = pl.concat([
            self.state.rows_where("profiles", "service_id", sids),
            self.state.rows_where("profiles", "email", emails),
            self.state.rows_where("profiles", "phone", phones),
        ]).unique("service_id", keep="first", maintain_order=True)
        return prof.select(
            pl.col("service_id").alias("sid"), "email", "phone", "updated_at", "update_seq",
            pl.col("external_id").is_not_null().alias("has_ext"), "created_seq",
        )

    # --- static part ---------------------------------------------------------------------------
    def _resolve_strong(self, regular: pl.DataFrame) -> None:
        strong = regular.filter(pl.col("kind").is_in(["ext", "alias"]))
        ext_keys = strong.filter(pl.col("kind") == "ext")["key"].unique().implode()
        alias_keys = strong.filter(pl.col("kind") == "alias")["key"].unique().implode()
        alias_names = alias_keys.explode().str.split_exact(SEP, 1).struct.field("field_1")
        idx = pl.concat([
            self.state.rows_where("external_ids", "external_id", ext_keys.explode()).select(
                pl.lit("ext").alias("kind"), pl.col("external_id").alias("key"), pl.col("service_id").alias("sid0")),
            self.state.rows_where("aliases", "alias_name", alias_names).select(pl.lit("alias").alias("kind"),
                                         (pl.col("alias_label") + SEP + pl.col("alias_name")).alias("key"),
                                         pl.col("service_id").alias("sid0")).filter(pl.col("key").is_in(alias_keys)),
        ])
        strong = strong.join(idx, on=["kind", "key"], how="left")
        creators = (
            strong.filter(pl.col("sid0").is_null() & pl.col("can_create"))
            .group_by("kind", "key").agg(pl.col("seq").min().alias("cseq"))
        )
        strong = strong.join(creators, on=["kind", "key"], how="left").with_columns(
            target=pl.coalesce("sid0", pl.when(pl.col("seq") >= pl.col("cseq")).then(_temp_id(pl.col("cseq"), pl.lit(0))))
        )
        self.strong_targets = strong.select("seq", "target")
        self.strong_creations = creators.select(
            temp=_temp_id(pl.col("cseq"), pl.lit(0)), seq="cseq", pos=pl.lit(0, pl.Int64), kind="kind", key="key")

    # --- one pass of the fixed point -----------------------------------------------------------
    def run(self) -> None:
        dyn_targets = pl.DataFrame(schema={"seq": pl.Int64, "target": pl.String})
        dyn_creations = self.strong_creations.clear()
        rejected = pl.DataFrame(schema={"seq": pl.Int64, "error": pl.String})
        # each pass fixes at least the earliest wrong outcome, so passes <= objects + 1
        for _ in range(self.ok.height + 2):
            self._timelines(dyn_targets, dyn_creations, rejected)
            new_targets, new_creations = self._resolve_dynamic()
            new_rejected = self._state_errors(new_targets, new_creations)
            same = (
                _same(new_targets, dyn_targets, ["seq"]) and _same(new_creations, dyn_creations, ["seq", "pos"])
                and _same(new_rejected, rejected, ["seq"])
            )
            # the timelines just drawn came from these very frames (rows in the same order):
            # drawing them again would give the same (most batches: nothing dynamic at all)
            drawn = same and new_targets.equals(dyn_targets) and new_creations.equals(dyn_creations) \
                and new_rejected.equals(rejected)
            dyn_targets, dyn_creations, rejected = new_targets, new_creations, new_rejected
            if same:
                break
        else:  # pragma: no cover - the loop bound is the proof's worst case
            raise RuntimeError("track fixed point did not converge")
        if not drawn:
            self._timelines(dyn_targets, dyn_creations, rejected)
        self.rejected = rejected

    def _timelines(self, dyn_targets: pl.DataFrame, dyn_creations: pl.DataFrame, rejected: pl.DataFrame) -> None:
        v = self.valid
        self.creations = pl.concat([self.strong_creations, dyn_creations]).sort("seq", "pos")
        self.targeted = pl.concat([self.strong_targets, dyn_targets]).filter(pl.col("target").is_not_null())
        self.rejected_prev = rejected
        self.accepted = self.targeted.join(rejected, on="seq", how="anti")
        acc = self.accepted
        self.acc_fields = v.fields.join(acc, on="seq")
        self.email_tl = pl.concat([
            self.acc_fields.filter(pl.col("field") == "email").select(sid="target", seq="seq", email="value"),
            self.creations.filter(pl.col("kind") == "email").select(sid="temp", seq="seq", email="key"),
        ])
        self.phone_tl = pl.concat([
            self.acc_fields.filter(pl.col("field") == "phone").select(sid="target", seq="seq", phone="value"),
            self.creations.filter(pl.col("kind") == "phone").select(sid="temp", seq="seq", phone="key"),
        ])
        created_tokens = self.creations.filter(pl.col("kind") == "import").join(
            self.import_tokens.select("seq", "pos", "device_id"), on=["seq", "pos"])
        self.owner_tl = pl.concat([
            v.tokens.join(acc, on="seq").select(
                tkey=pl.col("app_id") + SEP + pl.col("token"), seq="seq", pos="pos", sid="target",
                device_id="device_id"),
            created_tokens.select(tkey="key", seq="seq", pos="pos", sid="temp", device_id="device_id"),
        ]).sort("tkey", "seq", "pos")
        moved = pl.DataFrame(schema={"sid": pl.String, "seq": pl.Int64}) if self.owner_tl.height == 0 else (
            self.owner_tl.with_columns(prev=pl.col("sid").shift(1).over("tkey"))
            .join(self.state_tokens.rename({"sid": "state_owner"}), on="tkey", how="left")
            .with_columns(prev=pl.coalesce("prev", "state_owner"))
            .filter(pl.col("prev").is_not_null() & (pl.col("prev") != pl.col("sid")))
            .select(sid="prev", seq="seq")
        )
        self._propagation()
        self.upd_tl = pl.concat([
            acc.select(sid="target", seq="seq"),
            moved,
            self.prop_subscribe.select("sid", "seq"),
            self.prop_groups.select("sid", "seq"),
            self.creations.filter(pl.col("kind") == "import").select(sid="temp", seq="seq"),
        ]).unique()

    def _email_at(self, rows: pl.DataFrame, *, inclusive: bool) -> pl.DataFrame:
        """`rows` (sid, seq, ...) with `cur_email`: the profile's email at that moment."""
        r = _asof(rows, self.email_tl, value="email", inclusive=inclusive)
        r = r.join(self.prof.select("sid", pl.col("email").alias("state_email")), on="sid", how="left")
        return r.with_columns(
            cur_email=pl.when(pl.col("found")).then(pl.col("email")).otherwise(pl.col("state_email"))
        ).drop("email", "state_email", "found")

    def _propagation(self) -> None:
        """Same-email propagation of email_subscribe and subscription groups (external_id only)."""
        ext_acc = self.accepted.join(self.kind_of.filter(pl.col("kind") == "ext"), on="seq")
        subs = self.acc_fields.join(ext_acc.select("seq"), on="seq").filter(
            (pl.col("field") == "email_subscribe") & pl.col("value").is_not_null()
        ).select("seq", sid="target", value="value")
        groups = self.valid.groups.join(ext_acc, on="seq").select("seq", "pos", "group_id", "state", sid="target")
        if subs.height == 0 and groups.height == 0:  # nothing to propagate (most batches)
            self.prop_subscribe = subs.select("sid", "seq", "value")
            self.prop_groups = groups.select("sid", "seq", "pos", "group_id", "state")
            return
        sources = pl.concat([subs.select("seq", "sid"), groups.select("seq", "sid")]).unique()
        sources = self._email_at(sources, inclusive=True).filter(pl.col("cur_email").is_not_null())
        holders = pl.concat([
            self.prof.filter(pl.col("email").is_not_null()).select("sid", pl.col("email").alias("cur_email")),
            self.email_tl.filter(pl.col("email").is_not_null()).select("sid", pl.col("email").alias("cur_email")),
        ]).unique()
        pairs = (
            sources.rename({"sid": "source"}).join(holders, on="cur_email")
            .filter(pl.col("sid") != pl.col("source"))
            .select("sid", "seq", pl.col("cur_email").alias("want"))
        )
        pairs = self._email_at(pairs, inclusive=True).filter(pl.col("cur_email") == pl.col("want"))
        targets = pairs.select("sid", "seq").join(sources.select("seq", pl.col("sid").alias("source")), on="seq")
        self.prop_subscribe = targets.join(subs.select("seq", "value"), on="seq").select("sid", "seq", "value")
        self.prop_groups = targets.join(groups.drop("sid"), on="seq").select("sid", "seq", "pos", "group_id", "state")

    def _recency(self, pairs: pl.DataFrame) -> pl.DataFrame:
        """(sid, seq) → the profile's recency key (ts, useq) just before seq."""
        r = _asof(pairs, self.upd_tl.with_columns(u=pl.col("seq")), value="u", inclusive=False)
        r = r.join(self.prof.select("sid", "updated_at", "update_seq"), on="sid", how="left")
        return r.with_columns(
            ts=pl.when(pl.col("found")).then(pl.lit(self.clock).cast(UTC_TS)).otherwise(pl.col("updated_at")),
            useq=pl.when(pl.col("found")).then(pl.col("u") + self.gbase).otherwise(pl.col("update_seq")),
        ).drop("u", "found", "updated_at", "update_seq")

    def _resolve_by(self, kind: str) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Email- or phone-identified objects: (targets, creations)."""
        objs = self.dynamic.filter(pl.col("kind") == kind).select("seq", "key", "can_create")
        if objs.height == 0:  # no object of this kind: nothing resolves (most batches)
            return self._resolved(kind, objs.with_columns(target=pl.lit(None, pl.String)))
        tl = self.email_tl if kind == "email" else self.phone_tl
        holders = pl.concat([
            self.prof.filter(pl.col(kind).is_not_null()).select("sid", pl.col(kind).alias("key")),
            tl.filter(pl.col(kind).is_not_null()).select("sid", pl.col(kind).alias("key")),
        ]).unique()
        pairs = objs.join(holders, on="key")
        cur = _asof(pairs, tl, value=kind, inclusive=False).join(
            self.prof.select("sid", pl.col(kind).alias("state_value")), on="sid", how="left")
        cur = cur.with_columns(
            now=pl.when(pl.col("found")).then(pl.col(kind)).otherwise(pl.col("state_value"))
        ).filter(pl.col("now") == pl.col("key")).select("seq", "sid")
        # profiles created in this batch: newer than every stored one, in creation order
        created = self.creations.select(
            sid="temp", created_ext=pl.col("kind") == "ext",
            new_order=pl.lit(1 << 62) + pl.col("seq") * (1 << 20) + pl.col("pos"))
        ranked = (
            self._recency(cur)
            .join(self.prof.select("sid", "has_ext", "created_seq"), on="sid", how="left")
            .join(created, on="sid", how="left")
            .with_columns(has_ext=pl.col("has_ext").fill_null(False) | pl.col("created_ext").fill_null(False),
                          order=pl.coalesce("created_seq", "new_order"))
            # one object can touch several profiles (propagation, a moved token): equal recency
            # is broken by creation order, the later-created profile counting as more recent
            .sort(["seq", "has_ext", "ts", "useq", "order"], descending=[False, True, True, True, True],
                  nulls_last=True)
            .group_by("seq", maintain_order=True).agg(pl.col("sid").first().alias("target"))
        )
        return self._resolved(kind, objs.join(ranked, on="seq", how="left"))

    @staticmethod
    def _resolved(kind: str, resolved: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Objects with the profile they resolved to (`target`, null: none) → (targets,
        creations): an object that may create a profile and found none creates one."""
        new = resolved.filter(pl.col("target").is_null() & pl.col("can_create"))
        creations = new.select(temp=_temp_id(pl.col("seq"), pl.lit(0)), seq="seq", pos=pl.lit(0, pl.Int64),
                               kind=pl.lit(kind), key="key")
        targets = resolved.with_columns(
            target=pl.coalesce("target", pl.when(pl.col("can_create")).then(_temp_id(pl.col("seq"), pl.lit(0))))
        ).select("seq", "target")
        return targets, creations

    def _import_creations(self) -> pl.DataFrame:
        """Push-import tokens held by nobody at that moment create anonymous profiles."""
        t = self.import_tokens.select("seq", "pos", "tkey")
        if t.height == 0:
            return t.select(temp=pl.lit(None, pl.String), seq="seq", pos="pos", kind=pl.lit("import"), key="tkey")
        held_before = (
            t.join(self.owner_tl.select("tkey", pl.col("seq").alias("oseq"), pl.col("pos").alias("opos")), on="tkey")
            .filter((pl.col("oseq") < pl.col("seq")) | ((pl.col("oseq") == pl.col("seq")) & (pl.col("opos") < pl.col("pos"))))
            .select("seq", "pos").unique()
        )
        new = (
            t.join(self.state_tokens.select("tkey"), on="tkey", how="anti")
            .join(held_before, on=["seq", "pos"], how="anti")
        )
        return new.select(temp=_temp_id(pl.col("seq"), pl.col("pos")), seq="seq", pos="pos",
                          kind=pl.lit("import"), key="tkey")

    def real_ids(self, creations: pl.DataFrame) -> pl.DataFrame:
        """temp id → service_id, by creation order."""
        c = creations.sort("seq", "pos").with_row_index("rank")
        n = pl.Series(c["rank"].cast(pl.Int64) + self.state.next_profile_n)
        return c.with_columns(n=n, service_id=service_ids(self.seed, n))

    def _resolve_dynamic(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        et, ec = self._resolve_by("email")
        pt, pc = self._resolve_by("phone")
        ic = self._import_creations()
        creations = pl.concat([ec, pc, ic]).sort("seq", "pos")
        # service_id objects: existing profiles, or profiles created earlier in this batch
        sid_objs = self.dynamic.filter(pl.col("kind") == "sid").select("seq", "key")
        if sid_objs.height == 0:
            return pl.concat([et, pt]).sort("seq"), creations
        known = self.real_ids(pl.concat([self.strong_creations, creations])).select(
            pl.col("service_id").alias("key"), pl.col("temp").alias("new_target"), pl.col("seq").alias("cseq"))
        st = (
            sid_objs.join(self.prof.select(pl.col("sid").alias("key"), pl.col("sid").alias("old_target")),
                          on="key", how="left")
            .join(known, on="key", how="left")
            .with_columns(target=pl.coalesce("old_target", pl.when(pl.col("cseq") < pl.col("seq")).then("new_target")))
            .select("seq", "target")
        )
        targets = pl.concat([et, pt, st]).sort("seq")
        return targets, creations

    def _state_errors(self, targets: pl.DataFrame, creations: pl.DataFrame) -> pl.DataFrame:
        unknown = (
            targets.join(self.dynamic.filter(pl.col("kind") == "sid").select("seq"), on="seq")
            .filter(pl.col("target").is_null()).select("seq", error=pl.lit(ERR_UNKNOWN_SERVICE_ID))
        )
        ops = (
            self.valid.custom.join(self.targeted, on="seq").rename({"target": "service_id"})
            .join(self.rejected_prev.select("seq", applied=pl.lit(False)), on="seq", how="left")
            .with_columns(pl.col("applied").fill_null(True))
        )
        # a profile this pass creates (a temporary ID here) has no attributes yet: not looked up
        older = ops.filter(~pl.col("service_id").str.starts_with(TEMP_PREFIX))["service_id"]
        errs = attribute_errors(ops, self.state.rows_where("attributes", "service_id", older))
        return pl.concat([unknown, errs]).sort("seq")


def _same(a: pl.DataFrame, b: pl.DataFrame, key: list[str]) -> bool:
    return a.height == b.height and a.sort(key).equals(b.sort(key))


def apply_track(state: State, read: TrackInput, *, clock: datetime, seed: str) -> TrackOutcome:
    """Apply a run of track requests, read (`reading.py`), to `state`: responses per request and
    the table changes."""
    b = _Batch(state, read.valid, clock, seed)
    b.run()
    n_objects = read.objects  # seq runs 0..objects-1
    changes, next_n = _changes(b)
    return TrackOutcome(
        responses=_responses(read.requests, read.valid, b.rejected),
        changes=changes,
        next_profile_n=next_n,
        next_update_seq=state.next_update_seq + n_objects,
    )


def _changes(b: _Batch) -> tuple[Changes, int]:
    state, clock, gbase = b.state, b.clock, b.gbase
    ids = b.real_ids(b.creations)

    def real(col: str) -> pl.Expr:
        return pl.col(col).replace(ids["temp"], ids["service_id"]) if ids.height else pl.col(col)

    changes = Changes()
    now = pl.lit(clock).cast(UTC_TS)
    # new profiles and their identifiers
    new = ids.select(
        service_id="service_id",
        external_id=pl.when(pl.col("kind") == "ext").then("key"),
        email=pl.when(pl.col("kind") == "email").then("key"),
        phone=pl.when(pl.col("kind") == "phone").then("key"),
        created_at=now, created_seq="n",
        random_bucket=(pl.col("service_id").str.slice(0, 8).str.to_integer(base=16) % 10000).cast(pl.Int32),
        push_anonymous=pl.col("kind") == "import",
        language_explicit=pl.lit(False),
    )
    # A small pass pays about 150 us for each Polars query, empty frames' too
    # (benchmarks/query_overhead.py): what a pass has none of is skipped, and its upsert of
    # no rows would have changed nothing
    kinds = set(ids["kind"].unique().to_list()) if ids.height else set()
    if "ext" in kinds:
        changes.upsert("external_ids", ids.filter(pl.col("kind") == "ext").select(
            external_id="key", service_id="service_id", primary=pl.lit(True)))
    if "alias" in kinds:
        alias_parts = pl.col("key").str.split_exact(SEP, 1)
        changes.upsert("aliases", ids.filter(pl.col("kind") == "alias").select(
            alias_label=alias_parts.struct.field("field_0"), alias_name=alias_parts.struct.field("field_1"),
            service_id="service_id"))
    # profile fields: last write per (user, field), propagated email states and the states of
    # addresses users take included; an object's own write follows the address's (`order`)
    writes = pl.concat([
        _address_states(state, b).select(sid=real("sid"), seq="seq", field=pl.lit("email_subscribe"), value="value",
                                          order=pl.lit(0)),
        b.acc_fields.select(sid=real("target"), seq="seq", field="field", value="value", order=pl.lit(1)),
        b.prop_subscribe.select(sid=real("sid"), seq="seq", field=pl.lit("email_subscribe"), value="value",
                                order=pl.lit(1)),
    ]).sort("seq", "order", maintain_order=True).drop("order")
    fields = writes["field"].unique().sort().to_list()
    # one row per touched profile: its last update and, per field written, whether and what
    # it last wrote (one grouping by the 24-character ID, and one join below, instead of one
    # join per field)
    is_write = pl.col("field").is_not_null()
    touched = pl.concat([
        b.upd_tl.select(sid=real("sid"), seq="seq", field=pl.lit(None, pl.String), value=pl.lit(None, pl.String)),
        writes,
    ]).group_by("sid").agg(
        pl.col("seq").filter(~is_write).max(),
        *(expr for f in fields for expr in (
            (pl.col("field") == f).any().alias(f"_w_{f}"),
            pl.col("value").filter(pl.col("field") == f).last().alias(f"_v_{f}"))),
    ).rename({"sid": "service_id"})
    # existing profiles get partial rows (`tables/partial.py`): the fields written, unread;
    # new profiles whole rows
    existing = touched.select("service_id").join(ids.select("service_id"), on="service_id", how="anti")
    base = pl.concat([
        conform("profiles", existing).with_columns(pl.lit(mask_of("profiles", []), pl.Int64).alias(SET)),
        conform("profiles", new).with_columns(pl.lit(None, pl.Int64).alias(SET)),
    ]).join(touched, on="service_id", how="left")

    def write(field: str, when: pl.Expr, value: pl.Expr) -> pl.Expr:
        return pl.when(when).then(value).otherwise(pl.col(field)).alias(field)

    def bits(when: pl.Expr, *fields: str) -> pl.Expr:
        return pl.when(when).then(pl.lit(mask_of("profiles", list(fields)), pl.Int64)).otherwise(0)

    # push_opted_in_at and email_unsubscribed_at: the clock, when push_subscribe changed to
    # opted_in, or email_subscribe to unsubscribed (the fields whose rules read the stored row)
    stamps = {name: pl.lit(False) for name in ("_opt", "_unsub")}
    for field, value, flag in (("push_subscribe", "opted_in", "_opt"), ("email_subscribe", "unsubscribed", "_unsub")):
        if field not in fields:
            continue
        changed = _changed_to(state, ids, writes.filter(pl.col("field") == field), field, value)
        if changed.height:
            base = base.join(changed.with_columns(pl.lit(True).alias(flag)), on="service_id", how="left")
            stamps[flag] = pl.col(flag).fill_null(False)
    opted, unsubscribed = stamps["_opt"], stamps["_unsub"]
    touch = pl.col("seq").is_not_null()
    written = {f: pl.col(f"_w_{f}").fill_null(False) for f in fields}
    values = {f: pl.col(f"_v_{f}") for f in fields}
    if "last_coordinates" in values:
        values["last_coordinates"] = values["last_coordinates"].str.json_decode(pl.List(pl.Float64))
    if "language" in written:
        written["language_explicit"], values["language_explicit"] = written["language"], pl.col("_v_language").is_not_null()
    base = base.with_columns(
        *(write(f, written[f], values[f]) for f in written),
        write("push_opted_in_at", opted, now), write("email_unsubscribed_at", unsubscribed, now),
        write("updated_at", touch, now), write("update_seq", touch, pl.col("seq") + gbase),
        # a whole row's mask stays null
        functools.reduce(operator.or_, [pl.col(SET), *(bits(written[f], f) for f in written),
                                        bits(opted, "push_opted_in_at"), bits(unsubscribed, "email_unsubscribed_at"),
                                        bits(touch, "updated_at", "update_seq")]).alias(SET),
    ).select(*SCHEMAS["profiles"], SET)
    changes.upsert("profiles", base)
    # custom attributes
    if b.valid.custom.height:
        ops = b.valid.custom.join(b.accepted, on="seq").with_columns(service_id=real("target")).drop("target")
        # the profiles this pass creates have no attributes yet (their service IDs are new): a
        # batch of new users would otherwise search every run of the table for each of them
        older = ops.filter(~pl.col("service_id").is_in(ids["service_id"].implode()))["service_id"]
        current = state.rows_where("attributes", "service_id", older).join(
            ops.select("service_id", "name").unique(), on=["service_id", "name"], how="semi")
        ups, dels = fold_attributes(ops, current)
        changes.upsert("attributes", ups)
        changes.delete("attributes", dels)
    # subscription groups
    if b.valid.groups.height or b.prop_groups.height:
        groups = pl.concat([
            b.valid.groups.join(b.accepted, on="seq").select(sid=real("target"), seq="seq", pos="pos",
                                                              group_id="group_id", state="state"),
            b.prop_groups.select(sid=real("sid"), seq="seq", pos="pos", group_id="group_id", state="state"),
        ]).sort("seq", "pos")
        changes.upsert("subscriptions", groups.group_by("sid", "group_id").agg(pl.col("state").last()).select(
            service_id="sid", group_id="group_id", state="state"))
    # push tokens: the last owner of each token
    if b.owner_tl.height:
        tok_parts = pl.col("tkey").str.split_exact(SEP, 1)
        changes.upsert("push_tokens", b.owner_tl.sort("tkey", "seq", "pos").group_by("tkey").agg(
            pl.col("sid").last(), pl.col("device_id").last(), pl.col("seq").last(), pl.col("pos").last()
        ).select(app_id=tok_parts.struct.field("field_0"), token=tok_parts.struct.field("field_1"),
                 device_id="device_id", service_id=real("sid"), update_seq=pl.col("seq") + gbase, pos="pos"))
    # event and purchase logs
    for name, frame in (("events", b.valid.events), ("purchases", b.valid.purchases)):
        if frame.height:
            changes.upsert(name, frame.join(b.accepted, on="seq").sort("seq").with_columns(
                service_id=real("target"), update_seq=pl.col("seq") + gbase))
    return changes, state.next_profile_n + ids.height


def _address_states(state: State, b: _Batch) -> pl.DataFrame:
    """(sid, seq, value): the email state an address kept for itself (`email_addresses`, set by
    `POST /email/status` or the blocklist) for each object that gives a profile that address, a
    new profile's included (docs/semantics.md, "Email lists")."""
    taken = b.email_tl.filter(pl.col("email").is_not_null())
    if taken.height == 0:
        return pl.DataFrame(schema={"sid": pl.String, "seq": pl.Int64, "value": pl.String})
    kept = state.rows_where("email_addresses", "email", taken["email"].unique()).filter(pl.col("state").is_not_null())
    if kept.height == 0:  # no address with a state of its own (most passes)
        return pl.DataFrame(schema={"sid": pl.String, "seq": pl.Int64, "value": pl.String})
    changes = (
        b.email_tl.sort("seq", maintain_order=True)
        .join(b.prof.select("sid", pl.col("email").alias("stored")), on="sid", how="left")
        .with_columns(prev=pl.col("email").shift(1).over("sid"), first=pl.int_range(pl.len()).over("sid") == 0)
        .with_columns(prev=pl.when(pl.col("first")).then(pl.col("stored")).otherwise(pl.col("prev")))
        .filter(pl.col("email").is_not_null() & (pl.col("prev").is_null() | (pl.col("prev") != pl.col("email"))))
    )
    return changes.join(kept.select("email", value="state"), on="email").select("sid", "seq", "value")


def _changed_to(state: State, ids: pl.DataFrame, field_writes: pl.DataFrame, field: str, value: str) -> pl.DataFrame:
    """The profiles (`service_id`) whose `field` one of `field_writes` (sid, seq, value; in seq
    order) changed to `value`, from its stored value or an earlier write's."""
    stored = state.rows_where("profiles", "service_id", field_writes.join(
        ids, left_on="sid", right_on="service_id", how="anti")["sid"].unique())
    return (
        field_writes
        .join(stored.select(pl.col("service_id").alias("sid"), pl.col(field).alias("old")), on="sid", how="left")
        .with_columns(prev=pl.col("value").shift(1).over("sid"), first=pl.int_range(pl.len()).over("sid") == 0)
        .with_columns(prev=pl.when(pl.col("first")).then(pl.col("old")).otherwise(pl.col("prev")))
        .filter((pl.col("value") == value) & (pl.col("prev").is_null() | (pl.col("prev") != value)))
        .select(pl.col("sid").alias("service_id")).unique()
    )


def _responses(requests: pl.DataFrame, valid: ValidTrack, rejected: pl.DataFrame) -> dict[int, tuple[int, dict[str, Any]]]:
    out: dict[int, tuple[int, dict[str, Any]]] = {}
    for req, message in valid.fatal.iter_rows():  # one row per failed request, not per object
        out[req] = (400, dump(TrackFatalResponse, {"message": message, "errors": [message]}))
    objs = valid.objects.join(rejected.rename({"error": "dyn_error"}), on="seq", how="left").with_columns(
        error=pl.coalesce("error", "dyn_error"))
    counts = (
        objs.filter(pl.col("error").is_null()).group_by("req", "arr").agg(pl.len().alias("n"))
    )
    errors = objs.filter(pl.col("error").is_not_null()).sort("seq").group_by("req", maintain_order=True).agg(
        pl.struct(type="error", input_array=pl.col("arr").replace_strict(dict(enumerate(ARRAYS))), index="idx")
        .alias("errors"))
    count_map = {(r, a): n for r, a, n in counts.iter_rows()}  # one row per request and array: response shaping
    error_map = dict(errors.iter_rows())  # one row per request with errors: response shaping
    sent = requests.join(valid.fatal, on="req", how="anti")
    for row in sent.iter_rows(named=True):  # per request, to build its response body
        body: dict[str, Any] = {"message": "success"}
        for n, a in enumerate(ARRAYS):
            if row[f"{a}_type"] == "ARRAY":
                body[f"{a}_processed"] = count_map.get((row["req"], n), 0)
        if row["req"] in error_map:
            body["errors"] = error_map[row["req"]]
        out[row["req"]] = (201, dump(TrackResponse, body))
    return out
