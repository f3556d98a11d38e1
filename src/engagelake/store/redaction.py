"""Erasure at compaction: every identifier a deleted profile held, the lineage rows redacted
of them, and the ledger rewritten without the responses nobody may read again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import polars as pl

from engagelake.store import appends, merging, objects
from engagelake.store.layout import LEDGER, Place, files_source
from engagelake.store.ledger import (
    DUCK_TYPES,
    ECHO_ROWS,
    LEDGER_ARROW,
    LEDGER_PROPERTIES,
    LEDGER_SCHEMA,
    LEDGER_WRITER,
    ledger_files,
)
from engagelake.store.snapshot import Snapshot

# how lineage rows name an identifier (as requests do), as (JSON path, kind)
_LINEAGE_PATHS = (("$.external_id", "external_id"), ("$.email", "email"), ("$.phone", "phone"))
_ALIAS_PATHS = (("$.user_alias.alias_label", "$.user_alias.alias_name"), ("$.alias_label", "$.alias_name"))


def identifiers_of(snap: Snapshot, gone: pl.Series) -> pl.DataFrame:
    """(kind, value) of every identifier a deleted profile (`gone`) ever held: external IDs
    (renamed ones too), aliases ("label\x1fname"), emails and phones, from every stored row,
    tombstoned ones included (a compaction reads each table whole anyway), and from the
    lineage's sides that resolved to one: a run merge into the bottom run keeps only a key's
    newest row, so an external ID merged away (its row a tombstone since) may be left in the
    lineage alone, as a skipped request names it."""
    lineage = snap.stored("merges")
    parts = [] if lineage is None else [_lineage_identifiers(lineage.filter(~pl.col("_deleted")), gone)]
    for table, kind, value in (("external_ids", "external_id", pl.col("external_id")),
                               ("aliases", "alias", pl.concat_str("alias_label", pl.lit("\x1f"), "alias_name")),
                               ("profiles", "email", pl.col("email")), ("profiles", "phone", pl.col("phone"))):
        stored = snap.stored(table)
        if stored is not None:
            parts.append(stored.filter(pl.col("service_id").is_in(gone.implode()))
                         .select(pl.lit(kind).alias("kind"), value.alias("value")))
    if not parts:
        return pl.DataFrame(schema={"kind": pl.String, "value": pl.String})
    return pl.concat(parts).drop_nulls().unique().collect()


def _lineage_identifiers(lineage: pl.LazyFrame, gone: pl.Series) -> pl.LazyFrame:
    """(kind, value) of the identifiers lineage rows name on a side that resolved to a
    profile of `gone`."""
    parts = []
    for side in ("source", "target"):
        mine = lineage.filter(pl.col(f"{side}_sid").is_in(gone.implode()))
        text = pl.col(side)
        parts += [mine.select(pl.lit(kind).alias("kind"), text.str.json_path_match(path).alias("value"))
                  for path, kind in _LINEAGE_PATHS]
        parts += [mine.select(pl.lit("alias").alias("kind"), pl.concat_str(
            text.str.json_path_match(label), pl.lit("\x1f"), text.str.json_path_match(alias)).alias("value"))
                  for label, alias in _ALIAS_PATHS]
    return pl.concat(parts)


def redacted_lineage(rows: pl.DataFrame, gone: pl.Series, identifiers: pl.DataFrame) -> pl.DataFrame:
    """Lineage rows without a deleted profile's identifiers: both identifiers of a row that
    touched a deleted profile, and the identifier of a side that resolved to no profile (a
    skipped request, such as a delete retried) when a deleted profile held it."""
    touched = pl.col("source_sid").is_in(gone.implode()) | pl.col("target_sid").is_in(gone.implode())
    redact = {}
    for side in ("source", "target"):
        text = pl.col(side)
        named = [text.str.json_path_match(path).is_in(identifiers.filter(pl.col("kind") == kind)["value"].implode())
                 for path, kind in _LINEAGE_PATHS]
        aliases = identifiers.filter(pl.col("kind") == "alias")["value"].implode()
        named += [pl.concat_str(text.str.json_path_match(label), pl.lit("\x1f"), text.str.json_path_match(alias))
                  .is_in(aliases) for label, alias in _ALIAS_PATHS]
        unresolved = pl.col(f"{side}_sid").is_null() & pl.any_horizontal(named).fill_null(False)
        redact[side] = pl.when(touched | unresolved).then(None).otherwise(text)
    return rows.with_columns(**redact)


def compact_ledger(place: Place, memory_limit: str | None, retention: timedelta, gone: pl.Series,
                   identifiers: pl.DataFrame) -> None:
    """Rewrite the ledger without the responses nobody may read again: those of batches
    that concerned a deleted profile (`gone`), or that name, as a JSON string, an
    identifier one held (`identifiers`: an export of an ID that named no one yet echoes
    it), whatever their age; those older than the retention window; those of unkeyed
    batches (older stores stored them). Each keyed batch keeps its key, digest and commit
    time, so a replay is refused, never applied twice. The old files (and log entries,
    with their statistics) go with the tables'.

    The ledger holds a row per batch ever committed (a server commits a few a second), so
    it is streamed through DuckDB within the memory limit, never held whole; only the
    numbers of the batches whose responses go are."""
    table = objects.delta_table(place.path(LEDGER))
    files, in_order = ledger_files(table)
    cutoff = datetime.now(UTC) - retention
    with merging.connection(memory_limit) as con:
        # by name: older files lack later columns
        source = files_source(con, LEDGER, files, LEDGER_ARROW, partial=True, local=place.local)
        present = set(con.sql(f"DESCRIBE SELECT * FROM {source}").pl()["column_name"].to_list())
        # a column no file has yet (a store older than it) reads as a null, as it does everywhere
        con.sql(f"""CREATE TEMP VIEW ledger AS SELECT {", ".join(
            f'"{c}"' if c in present else f'NULL::{DUCK_TYPES[c]} AS "{c}"' for c in LEDGER_SCHEMA)}
            FROM {source}""")
        con.register("gone", pl.DataFrame({"service_id": gone}).to_arrow())
        concerned = con.sql("""SELECT DISTINCT batch_no FROM (
            SELECT batch_no, unnest(subjects) AS subject FROM ledger
            WHERE responses IS NOT NULL AND subjects IS NOT NULL) JOIN gone ON subject = service_id""").pl()
        names = identifiers["value"].str.split("\x1f").list.last().unique().to_list()  # an alias by its name
        if names:  # as JSON strings: quoted, escaped as the responses hold them
            quoted = [orjson.dumps(name).decode() for name in names]
            held = con.sql("SELECT batch_no, responses FROM ledger WHERE responses IS NOT NULL")
            for batch in held.to_arrow_reader(ECHO_ROWS):  # a batch's responses can be big
                rows = pl.DataFrame(pl.from_arrow(batch))
                concerned = pl.concat([concerned, rows.filter(pl.col("responses").str.contains_any(quoted))
                                       .select("batch_no")])
        con.register("concerned", concerned.unique().to_arrow())
        sql = f"""
            WITH marked AS (
              SELECT *, CASE WHEN held AND batch_key IS NULL THEN NULL
                             WHEN held AND batch_no IN (SELECT batch_no FROM concerned) THEN 'erased'
                             WHEN held AND committed_at < '{cutoff.isoformat()}'::TIMESTAMPTZ THEN 'expired'
                             ELSE responses_dropped END AS dropped
              FROM (SELECT *, responses IS NOT NULL AS held FROM ledger))
            SELECT {", ".join(
                f'CASE WHEN held AND (batch_key IS NULL OR dropped IS NOT NULL) THEN NULL ELSE "{c}" END AS "{c}"'
                if c in ("responses", "subjects") else "dropped AS responses_dropped" if c == "responses_dropped"
                else f'"{c}"' for c in LEDGER_SCHEMA)}
            FROM marked{"" if in_order else " ORDER BY batch_no"}"""  # sorting spilled, and took 300 MB more
        table.alter.set_table_properties({**LEDGER_PROPERTIES, "delta.logRetentionDuration": "interval 0 days"})
        objects.write_delta(table, merging.stream(con, sql, LEDGER_ARROW), mode="overwrite",
                            schema_mode="overwrite", writer_properties=LEDGER_WRITER)
        appends.sync_version(place.path(LEDGER), table.version())  # before the vacuum deletes the old files
