"""A track pass's requests read: parsed and statically checked, ready for the rules.

Reading is a pure function of each request's text, so a pass's requests may be read in shares,
in any process (a flow's workers: `flows/track_batch.py`), and joined: `joined` of `read_track`
over consecutive shares, each given the number of its first request, equals `read_track` over
them all, `seq` numbering included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from engagelake.rules.profile.parse import without_requests
from engagelake.rules.profile.parsing import parse_track
from engagelake.rules.profile.validate import ValidTrack, validate_track


@dataclass(frozen=True)
class TrackInput:
    """What the rules take of a read pass: the parse's request rows (`req`, the arrays' types),
    how many objects it numbered (`seq` 0..objects-1) and the checked operation tables. The
    parse's own frames go once checked: a pass's objects with every field as text are several
    times the tables the rules read, and a worker ships back only these."""

    requests: pl.DataFrame
    objects: int
    valid: ValidTrack


# how a batch reads its track passes: the pass's request texts and the updates a request may
# make (None: no limit) to what the rules take
TrackReader = Callable[[Sequence[str], "int | None"], TrackInput]


def read_track(texts: Sequence[str], max_updates: int | None = None, *, first_req: int = 0) -> TrackInput:
    """Parse and check the track bodies `texts` (JSON text), numbered from `first_req`. A request
    refused whole takes no `seq`: its objects leave the operation tables, the others numbered
    again from 0."""
    bodies = pa.table({
        "req": pa.array(range(first_req, first_req + len(texts)), pa.int64()),
        "body": pa.array(texts, pa.string()),
    })
    parsed = parse_track(bodies)
    valid = validate_track(parsed, max_updates=max_updates)
    if valid.fatal.height:  # validate the rest again, without the refused requests' objects
        parsed = without_requests(parsed, valid.fatal["req"])
        valid = dataclasses.replace(validate_track(parsed, max_updates=max_updates), fatal=valid.fatal)
    valid = dataclasses.replace(valid, fatal=valid.fatal.sort("req"))  # shares joined keep this order
    return TrackInput(parsed.requests, parsed.objects.height, valid)


def joined(parts: Sequence[TrackInput]) -> TrackInput:
    """Consecutive shares of a pass's requests, read apart, as one read: each share's `seq`
    shifted by the objects of the shares before it."""
    if len(parts) == 1:
        return parts[0]
    shifts = [0]
    for part in parts[:-1]:
        shifts.append(shifts[-1] + part.objects)

    def concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
        return pl.concat([f.with_columns(pl.col("seq") + s) if "seq" in f.columns and s else f
                          for f, s in zip(frames, shifts, strict=True)])

    valid = ValidTrack(**{f.name: concat([getattr(p.valid, f.name) for p in parts])
                          for f in dataclasses.fields(ValidTrack)})
    return TrackInput(pl.concat([p.requests for p in parts]), sum(p.objects for p in parts), valid)


def shares_of(texts: Sequence[str], most: int, min_bytes: int) -> list[tuple[int, int]]:
    """(start, stop) of up to `most` runs of consecutive `texts` of about equal length, each
    `min_bytes` long at least (one run when the texts are shorter)."""
    sizes = np.fromiter((len(text) for text in texts), dtype=np.int64, count=len(texts))
    shares = int(min(most, sizes.sum() // max(min_bytes, 1), len(texts)))
    if shares <= 1:
        return [(0, len(texts))]
    sums = np.cumsum(sizes)
    total = int(sums[-1])
    # each run ends at the text that reaches its share of the total; a cut that would leave a
    # run (before it or after it) shorter than `min_bytes` is not made (one long text)
    reached = np.unique(np.searchsorted(sums, total * np.arange(1, shares) / shares) + 1)
    ends: list[int] = []
    for end in reached.tolist():
        done = int(sums[end - 1])
        if end < len(texts) and done - (int(sums[ends[-1] - 1]) if ends else 0) >= min_bytes \
                and total - done >= min_bytes:
            ends.append(end)
    ends.append(len(texts))
    return list(zip([0, *ends[:-1]], ends, strict=True))
