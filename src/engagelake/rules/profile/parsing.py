"""Which parse a track pass takes: DuckDB's (`parse.parse_duckdb`), or for a small pass the same
frames walked in Python (`parse_small.parse_small`), as DuckDB's fixed cost (25-30 ms of
planning) is more than a small pass's whole walk."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc

from engagelake.rules.profile.parse import ParsedTrack, parse_duckdb
from engagelake.rules.profile.parse_small import parse_small

SMALL_PARSE_ENV = "ENGAGELAKE_SMALL_PARSE_BYTES"  # overrides SMALL_PARSE_BYTES (tests: 0, or huge)
# a pass with less text than this is parsed in Python: below the crossover
# benchmarks/small_parse.py measures, 600-750 KB (80-100 requests of 75 objects; at 64, 500 KB,
# Python's CPU 0.7-0.9 of DuckDB's, at 1 request 0.1)
SMALL_PARSE_BYTES = 512 << 10


def parse_track(bodies: pa.Table) -> ParsedTrack:
    """Flatten track request bodies (`req` int64, `body` JSON text) into operation tables:
    in Python below `SMALL_PARSE_BYTES` of text (`$ENGAGELAKE_SMALL_PARSE_BYTES`, read at each
    call, when set), else in DuckDB. The frames are the same (`tests/test_parse_small.py`)."""
    limit = os.environ.get(SMALL_PARSE_ENV)
    size = pc.sum(pc.binary_length(bodies["body"])).as_py() or 0
    if size < (SMALL_PARSE_BYTES if limit is None else int(limit)):
        return parse_small(bodies)
    return parse_duckdb(bodies)
