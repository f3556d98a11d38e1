"""The batch engine: one `apply`'s requests, as routed (`routing.py`), applied in runs over an
evolving state, up to the changes and responses its commit takes.

Consecutive track requests (and same-kind identity requests) form runs, each one vectorized pass
(`rules/`); an export or a resource handler between them sees every earlier request. A big
batch stages its finished passes to local files (`store/staging.py`) and reads the stored rows
of the users its next passes name ahead (`store/ahead.py`); the requests it has read are kept
for a retry after another writer's commit (`Seen`). `Workspace.apply` runs and commits it.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from datetime import datetime
from typing import Any

import orjson
import polars as pl

from engagelake.link_keys import LinkKeys
from engagelake.routing import Response, Routed
from engagelake.rules.export import export_ids
from engagelake.rules.identity.endpoints import apply_identity
from engagelake.rules.profile.parse import named_external_ids
from engagelake.rules.profile.reading import TrackReader, read_track
from engagelake.rules.profile.track import apply_track
from engagelake.rules.state import Changes, State, apply_changes
from engagelake.store.ahead import ReadAhead
from engagelake.store.staging import StagedSource, Stages

# Long runs of track requests are applied in passes of at most this many requests (up to ~170k
# objects): the same result as one pass (sequential application is the invariant), bounded memory.
TRACK_RUN_MAX = 2000
# After a pass, a batch holding at least this many changed rows stages them to local files
# (`store/staging.py`) and reads them back as it needs them: memory follows the pass.
STAGE_ROWS = 100_000
# A pass of more request text than this leaves one CPU (`cpus.py`) for every CPU, for the rest of
# its batch: about 15,000 objects. A 10,000-object batch took 323-343 ms on one CPU against
# 365-371 ms on two; 30,000 objects 817-861 against 755-757 ms.
ONE_CPU_PASS_BYTES = 2 << 20
SEEN_SPOOL_BYTES = 16 << 20  # request text a batch keeps in memory for a retry (see `Seen`)
# A batch whose track pass is full reads up to this much request text ahead, and the stored rows
# of the users it names once for all those passes (`Ahead`, `store/ahead.py`); the text is
# searched a chunk at a time and waits in the spool, not in memory
READ_AHEAD_BYTES = 128 << 20
READ_AHEAD_CHUNK_BYTES = 16 << 20
# ... when the stored attributes hold at least this many rows. A 1M-object batch into 10M users
# (30M attribute rows): 20.8-21.4 s against 28.0-29.1 s, CPU 33-34 against 44-46 s, peak RSS
# 2.7 against 3.2 GiB; into 1M users (3M rows), where a pass decodes the whole table in 190 ms,
# 0.98x the time for 160 MiB more at the peak: not worth it there
READ_AHEAD_MIN_ROWS = 8_000_000
# ... and no more users than hold about this many attribute rows, as the store's rows a profile
# average (a profile of many attributes makes a window of fewer requests): the rows read ahead
# are held until the window's passes are done (1.75M rows for 583k users at 10M)
READ_AHEAD_MAX_ROWS = 4_000_000


class Seen:
    """The requests a batch has read, for a retry after another writer's commit. The text of
    bulk requests goes to a temporary file, held in memory up to `SEEN_SPOOL_BYTES`: a big
    batch's requests (about 127 MiB of text per 1M track objects) do not stay in memory."""

    def __init__(self) -> None:
        self.kept: list[Routed | tuple[str, int, int]] = []  # bulk: (endpoint, offset, length)
        self.file = tempfile.SpooledTemporaryFile(max_size=SEEN_SPOOL_BYTES)
        self.end = 0

    def add(self, request: Routed) -> Routed:
        endpoint, routed, text = request
        if isinstance(endpoint, str) and routed is None and isinstance(text, str):
            data = text.encode()
            self.file.seek(self.end)
            self.file.write(data)
            self.kept.append((endpoint, self.end, len(data)))
            self.end += len(data)
        else:
            self.kept.append(request)
        return request

    def text(self, n: int) -> str:
        """The text of the `n`-th request read, a bulk one."""
        _, offset, length = self.kept[n]
        assert isinstance(offset, int) and isinstance(length, int)
        self.file.seek(offset)
        return self.file.read(length).decode()

    def replay(self) -> Iterator[Routed]:
        for n, item in enumerate(list(self.kept)):
            endpoint, second, _ = item
            if isinstance(second, int):
                yield endpoint, None, self.text(n)
            else:
                yield item  # type: ignore[misc]

    def __enter__(self) -> Seen:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()


class Ahead:
    """A batch's requests (as `apply` routes them), read ahead when a track pass is full: the
    track requests that follow, up to `READ_AHEAD_BYTES` of text, are searched for the external
    IDs they name, so that the batch reads those users' stored rows once (`Batch.read_ahead`),
    not once a pass. Requests read ahead keep their text in the batch's spool (`Seen`): the
    `n`-th request routed is the spool's `n`-th."""

    def __init__(self, requests: Iterable[Routed], seen: Seen):
        self.source = iter(requests)
        self.seen = seen
        self.waiting: collections.deque[int | Routed] = collections.deque()  # spooled track texts by number
        self.read = 0  # requests taken from `source`
        self.until = 0  # requests before this one were read ahead already

    def __iter__(self) -> Iterator[Routed]:
        while True:
            if self.waiting:
                waiting = self.waiting.popleft()
                yield ("track", None, self.seen.text(waiting)) if isinstance(waiting, int) else waiting
                continue
            item = next(self.source, None)
            if item is None:
                return
            self.read += 1
            yield item

    def covers(self, i: int) -> bool:
        """Whether request `i` was read ahead already."""
        return i < self.until

    def external_ids(self, texts: list[str], most: int) -> pl.Series | None:
        """The external IDs named by `texts` (the full pass's) and by the track requests that
        follow it, read ahead up to `READ_AHEAD_BYTES` of text, the next other request, or a
        chunk that brings the IDs found past `most` (None: no track request follows, and the
        pass reads its own rows)."""
        ids = pl.Series("external_id", [], pl.String)  # found in the chunks searched so far
        chunk, size, total = texts, sum(map(len, texts)), 0
        while total < READ_AHEAD_BYTES and ids.len() <= most:
            item = next(self.source, None)
            if item is None:
                break
            n, self.read = self.read, self.read + 1
            endpoint, _, text = item
            if endpoint != "track" or not isinstance(text, str):
                self.waiting.append(item)
                break
            self.waiting.append(n)
            chunk.append(text)
            size += len(text)
            total += len(text)
            if size >= READ_AHEAD_CHUNK_BYTES:
                ids = pl.concat([ids, named_external_ids(chunk)]).unique()
                chunk, size = [], 0
        self.until = self.read
        if total == 0:
            return None
        return pl.concat([ids, named_external_ids(chunk)]).unique() if chunk else ids


class Batch:
    """One `apply`: the evolving state, the changes to commit, the responses so far. Runs of
    consecutive track requests (and of same-kind identity requests) are applied as one pass."""

    def __init__(self, state: State, *, clock: datetime, seed: str, batch_id: str, link_keys: LinkKeys,
                 before_big: Callable[[], None] = lambda: None, max_updates: int | None = None,
                 release_cpu: Callable[[], None] = lambda: None):
        self._state = state
        # how track passes read their requests: in this process, or shared out (`apply`)
        self.read_track: TrackReader = read_track
        # the last pass's changes, until the state is next read: a pass that is staged next
        # never needs them folded into the rows in memory (`_stage`)
        self._unapplied: tuple[Changes, int, int] | None = None
        self.max_updates = max_updates  # track requests: attributes + events + purchases at most
        self.clock = clock
        self.seed = seed
        self.link_keys = link_keys  # what signs and checks recipients' links (`link_keys.py`)
        self.batch_id = batch_id  # names the batch in lineage rows
        self.changes = Changes()
        self.responses: list[Response | None] = []  # one per request, as they come
        self.pending: list[tuple[int, str]] = []
        self.pending_kind = "track"
        self.stages: Stages | None = None
        self.stored = state.source  # the store snapshot, under the stages
        # a big batch (a full pass, or enough changes to stage) first waits for the store's
        # run merge: the two would otherwise hold their memory at once
        self._before_big: Callable[[], None] | None = before_big
        # a batch runs on one CPU while its passes are small (`cpus.py`); a big one wants them all
        self._release_cpu = release_cpu
        self._ahead: Future[ReadAhead] | None = None  # rows being read ahead (`read_ahead`)

    @property
    def state(self) -> State:
        """The batch's state, every change written so far applied."""
        if self._unapplied is not None:
            changes, next_profile_n, next_update_seq = self._unapplied
            self._unapplied = None
            self._state = apply_changes(self._state, changes, next_profile_n=next_profile_n,
                                        next_update_seq=next_update_seq)
        return self._state

    def write(self, changes: Changes, *, next_profile_n: int | None = None,
              next_update_seq: int | None = None) -> None:
        state = self.state
        self.changes.extend(changes)
        self._unapplied = (changes, state.next_profile_n if next_profile_n is None else next_profile_n,
                           state.next_update_seq if next_update_seq is None else next_update_seq)

    def track(self, body: dict[str, Any]) -> Response:
        self.flush()
        out: list[Response | None] = [None]
        self._track_pass([(0, orjson.dumps(body).decode())], out)
        assert out[0] is not None
        return out[0]

    def add(self, i: int, kind: str, text: str) -> None:
        if self.pending and (kind != self.pending_kind or len(self.pending) >= TRACK_RUN_MAX):
            self.flush()
        self.pending_kind = kind
        self.pending.append((i, text))

    def flush(self, *, last: bool = False) -> None:
        """Apply the pending run as one pass (`last`: the batch's final pass, which
        `to_commit` stages or not)."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        if len(pending) >= TRACK_RUN_MAX:
            self._big()
        if sum(len(text) for _, text in pending) > ONE_CPU_PASS_BYTES:  # a step a request, not an object
            self._release_cpu()
        if self.pending_kind == "track":
            self._track_pass(pending, self.responses)
        else:
            outcome = apply_identity(self.state, self.pending_kind, pending, clock=self.clock, seed=self.seed,
                                     batch=self.batch_id)
            for i, (status, body) in outcome.responses.items():
                self.responses[i] = Response(status, body)
            self.write(outcome.changes, next_profile_n=outcome.next_profile_n,
                       next_update_seq=outcome.next_update_seq)
        if not last:
            self._stage_when_big()

    def _big(self) -> None:
        self._release_cpu()
        if self._before_big is not None:
            hook, self._before_big = self._before_big, None
            hook()

    def _stage_when_big(self) -> None:
        """Stage the changes held so far when they are many, and start the state again over
        the store and the stages (the same answers: staged rows read back like stored ones)."""
        held = sum(frame.height for frames in self.changes.parts.values() for frame in frames)
        if held < STAGE_ROWS or self.stored is None:
            return
        self._stage()

    def _stage(self) -> None:
        if self.stages is None:
            self._big()
            self.stages = Stages()
        # `resolve_changes` folds the last pass's changes over the rows it holds, and the batch
        # starts a new state over the stages below: they need not be applied
        state = self.settled()
        # staged rows are whole: a later pass reads them back as the stored rows they shadow
        self.stages.add(state.resolve_changes(self.changes), state.index_entries_stored())
        self.changes = Changes()
        assert self.stored is not None
        self._state = State.over(StagedSource(self.stored, self.stages), next_profile_n=state.next_profile_n,
                                 next_update_seq=state.next_update_seq, reads=state.reads, subjects=state.subjects)

    def settled(self) -> State:
        """The state with the last pass's counters and users, its rows without that pass's
        changes: what staging and the commit read (they take the rows from `changes`). Only
        they call it, as the state's rows are read no more."""
        state, unapplied, self._unapplied = self._state, self._unapplied, None
        if unapplied is not None:
            changes, next_profile_n, next_update_seq = unapplied
            for frames in changes.parts.values():
                for frame in frames:
                    state.note_subjects(frame)
            state = dataclasses.replace(state, next_profile_n=next_profile_n, next_update_seq=next_update_seq)
        self._state = state
        return state

    def to_commit(self) -> tuple[Changes, dict[str, pl.DataFrame], Stages | None]:
        """Every change of the batch: those in memory, those staged (a batch that staged
        stages its last pass too, so that the commit streams its big tables from the files),
        and the index entries the store holds already (those of the stored rows read)."""
        if self.stages is None:
            return self.changes, self.state.index_entries_stored(), None
        if self.changes:
            self._stage()
        pairs = self.stages.index_entries_stored()
        return (self.stages.changes(), {index: pl.concat(frames) for index, frames in pairs.items()},
                self.stages)

    def close(self) -> None:
        if self._ahead is not None:  # a failed batch's rows still being read: let the reader end
            wait_for([self._ahead])
        if self.stages is not None:
            self.stages.remove()

    def reads_ahead(self) -> int:
        """How many users a full pass may read ahead the rows of (0: none): where each pass
        would read most of a big attributes table again (`READ_AHEAD_MIN_ROWS`), as many as
        hold about `READ_AHEAD_MAX_ROWS` of its rows."""
        if self.stored is None or (rows := self.stored.rows("attributes")) < READ_AHEAD_MIN_ROWS:
            return 0
        return READ_AHEAD_MAX_ROWS * max(self.stored.rows("profiles"), 1) // max(rows, 1)

    def read_ahead(self, external_ids: pl.Series) -> None:
        """Read the stored rows of the users `external_ids` name, for the passes to come: their
        external IDs and their attributes (`store/ahead.py`). They are read in a thread of
        their own while the full pass parses and checks its requests, and that pass's rules
        wait for them (`_take_ahead`): at 10M users, 20.8-21.4 s for a 1M-object batch against
        25.3-26.7 s read first, with the same peak. Rows read ahead for earlier passes go."""
        if self.stored is None:
            return
        base = self.stored.base if isinstance(self.stored, ReadAhead) else self.stored

        def load() -> ReadAhead:
            ahead = ReadAhead(base)
            found = ahead.load("external_ids", "external_id", external_ids)
            ahead.load("attributes", "service_id", found["service_id"])
            return ahead

        self._ahead = _ahead_pool().submit(load)

    def _take_ahead(self) -> None:
        """From now on, read stored rows through the rows read ahead, once they are read."""
        if self._ahead is None:
            return
        future, self._ahead = self._ahead, None
        ahead = future.result()
        self.stored = ahead
        source = ahead if self.stages is None else StagedSource(ahead, self.stages)
        self._state = dataclasses.replace(self._state, source=source)

    def _track_pass(self, pending: list[tuple[int, str]], responses: list[Response | None]) -> None:
        read = self.read_track([text for _, text in pending], self.max_updates)
        self._take_ahead()
        outcome = apply_track(self.state, read, clock=self.clock, seed=self.seed)
        for req, (status, body) in outcome.responses.items():
            responses[pending[req][0]] = Response(status, body)
        self.write(outcome.changes, next_profile_n=outcome.next_profile_n, next_update_seq=outcome.next_update_seq)


@functools.cache
def _ahead_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="engagelake-ahead")


def dispatch(batch: Batch, requests: Ahead, *, fields_required: bool) -> None:
    """Run a batch's routed requests in order: bulk ones join the pending run (when a track run
    is full, the stored rows of the users the next track requests name may be read ahead), an
    export or a handler flushes it and answers at once; `fields_required` is the export setting."""
    for i, (endpoint, routed, text) in enumerate(requests):
        batch.responses.append(None)
        if isinstance(text, Response):  # routed nowhere
            batch.responses[i] = text
            continue
        if isinstance(endpoint, str) and endpoint != "export":
            batch.add(i, endpoint, text)
            if endpoint == "track" and len(batch.pending) == TRACK_RUN_MAX and not requests.covers(i) \
                    and (users := batch.reads_ahead()):
                named = requests.external_ids([t for _, t in batch.pending], users)
                if named is not None:
                    batch.read_ahead(named)
            continue
        batch.flush()
        assert routed is not None
        if endpoint == "export":
            status, out = export_ids(batch.state, routed.body, batch.clock, fields_required=fields_required)
            batch.responses[i] = Response(status, out)
        else:
            assert callable(endpoint)
            batch.responses[i] = endpoint(batch, routed)
