"""One engine's KV-event feed: decoded batches in, core events out, in publication order.

This module is the one place that deals with the order of an engine's batches. A
:class:`KvEventSource` (the engine kind's socket reader, e.g.
:class:`~conductor.gateway.engines.vllm_zmq.VllmEventSocket`) yields decoded batches;
:class:`KvFeed` classifies each batch's sequence number (:class:`SeqTracker`: in order, gap,
duplicate, engine restart), fills a gap (or, on joining, the history before the first batch)
by asking the source to replay the missed batches, translates the batches through the
engine's :class:`EngineKvIngest` and puts the resulting :mod:`conductor.core.events` on a
bounded :class:`asyncio.Queue` without waiting.

When the queue is full the event is dropped, counted, and the engine is marked as needing a
resync (its index entries can no longer be trusted). A gap that cannot be filled (no replay,
replay failed or came back incomplete) and an undecodable message mark it too.

The caller owns the task: ``task_group.create_task(feed.run())`` and cancel it to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections import OrderedDict
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from conductor.core.events import AllBlocksCleared, KvEvent
from conductor.core.types import InstanceId
from conductor.gateway.kv_ingest import EngineHashMapper
from conductor.gateway.kv_slices import SLICE_BLOCKS, blocks_in, slices
from conductor.wire.events import (
    EngineBlockRemoved,
    EngineBlockStored,
    EngineEvent,
    EngineEventBatch,
    WireError,
)

log = logging.getLogger(__name__)


class SeqVerdict(enum.Enum):
    """How a batch's sequence number relates to what came before."""

    FIRST = "first"
    """The first batch seen (the subscriber may have joined mid-stream)."""
    IN_ORDER = "in_order"
    GAP = "gap"
    """Batches ``expected .. got - 1`` were missed."""
    DUPLICATE = "duplicate"
    """Already seen (e.g. a live batch that a replay also delivered): ignore it."""
    RESTART = "restart"
    """The publisher started over: everything it reported before is void."""


@dataclass(frozen=True, slots=True)
class SeqCheck:
    verdict: SeqVerdict
    got: int
    expected: int | None = None

    @property
    def missed(self) -> int:
        """How many batches a gap skipped (0 for other verdicts)."""
        if self.verdict is SeqVerdict.GAP and self.expected is not None:
            return self.got - self.expected
        return 0


class SeqTracker:
    """Follows one publisher's sequence numbers (vLLM: 0, 1, 2, ... per engine process).

    Rules, for a batch ``(seq, ts)`` after the last accepted ``(last_seq, last_ts)``:

    - ``seq == last_seq + 1``: in order;
    - ``seq > last_seq + 1``: gap (``expected = last_seq + 1``); the tracker moves on to ``seq``;
    - ``seq <= last_seq`` and ``ts > last_ts``: the sequence went backwards while time went
      forwards, so the engine restarted (this covers seq 0 after a restart whose first batches
      were missed); the tracker starts over at ``seq``;
    - ``seq <= last_seq`` and ``ts <= last_ts``: a duplicate (replays overlap live batches).

    Invariant: ``expected`` is None before the first batch, else last accepted seq + 1.
    """

    def __init__(self) -> None:
        self.expected: int | None = None
        self.last_ts: float | None = None
        self.gaps = 0
        self.missed = 0
        self.duplicates = 0
        self.restarts = 0

    def observe(self, seq: int, ts: float) -> SeqCheck:
        """Classify ``seq`` and, unless it is a duplicate, accept it."""
        expected, last_ts = self.expected, self.last_ts
        if expected is None or last_ts is None:
            check = SeqCheck(SeqVerdict.FIRST, seq)
        elif seq == expected:
            check = SeqCheck(SeqVerdict.IN_ORDER, seq, expected)
        elif seq > expected:
            check = SeqCheck(SeqVerdict.GAP, seq, expected)
            self.gaps += 1
            self.missed += seq - expected
        elif ts > last_ts:
            check = SeqCheck(SeqVerdict.RESTART, seq, expected)
            self.restarts += 1
        else:
            self.duplicates += 1
            return SeqCheck(SeqVerdict.DUPLICATE, seq, expected)
        self.expected = seq + 1
        if last_ts is None or check.verdict is SeqVerdict.RESTART:
            self.last_ts = ts
        else:
            self.last_ts = max(ts, last_ts)
        return check

    def reset(self) -> None:
        """Forget the stream position (a fresh subscription)."""
        self.expected = None
        self.last_ts = None


class EngineKvIngest:
    """One engine's ingest: sequence check, then translation into core events.

    Two steps so that :class:`KvFeed` can fill a gap (replayed batches, via
    :meth:`apply_unchecked`) between noticing it (:meth:`check`) and applying the batch that
    revealed it (:meth:`apply`). A restart clears the mapper and emits ``AllBlocksCleared``
    first. Each batch's publication time is remembered by sequence number (for the
    publication-to-index lag); BlockStored events whose block size differs from
    ``block_size_tokens`` (when given) are counted, as their hashes cannot match ours.

    Invariant: ``len(published) <= keep``; the oldest entries go first.
    """

    def __init__(
        self,
        mapper: EngineHashMapper,
        tracker: SeqTracker | None = None,
        *,
        block_size_tokens: int | None = None,
        keep: int = 4096,
    ) -> None:
        self.mapper = mapper
        self.tracker = tracker if tracker is not None else SeqTracker()
        self.block_size_tokens = block_size_tokens
        self.keep = keep
        self.published: OrderedDict[int, float] = OrderedDict()
        self.block_size_mismatches = 0

    @property
    def holder(self) -> InstanceId:
        return self.mapper.holder

    def check(self, batch: EngineEventBatch) -> SeqCheck:
        return self.tracker.observe(batch.seq, batch.ts)

    def apply(self, batch: EngineEventBatch, check: SeqCheck) -> list[KvEvent]:
        """Core events for ``batch`` given its ``check`` (none for a duplicate)."""
        self._note(batch)
        if check.verdict is SeqVerdict.DUPLICATE:
            return []
        out: list[KvEvent] = []
        if check.verdict is SeqVerdict.RESTART:
            self.mapper.clear()
            out.append(AllBlocksCleared(holder=self.holder, tier=None, seq=batch.seq))
        out.extend(self.mapper.translate_all(batch.events, batch.seq))
        return out

    def apply_unchecked(self, batch: EngineEventBatch) -> list[KvEvent]:
        """Core events for a batch that fills a known gap (bypasses the tracker)."""
        self._note(batch)
        return self.mapper.translate_all(batch.events, batch.seq)

    def ingest(self, batch: EngineEventBatch) -> tuple[SeqCheck, list[KvEvent]]:
        """:meth:`check` then :meth:`apply`, for shells that do not replay."""
        check = self.check(batch)
        return check, self.apply(batch, check)

    def published_at(self, seq: int | None) -> float | None:
        """When the batch ``seq`` was published (engine wall clock), if still remembered."""
        return None if seq is None else self.published.get(seq)

    def _note(self, batch: EngineEventBatch) -> None:
        self.published[batch.seq] = batch.ts
        self.published.move_to_end(batch.seq)
        while len(self.published) > self.keep:
            self.published.popitem(last=False)
        size = self.block_size_tokens
        if size is None:
            return
        for event in batch.events:
            if isinstance(event, EngineBlockStored) and event.block_size != size:
                if not self.block_size_mismatches:
                    log.error(
                        "engine %s publishes blocks of %d tokens but the gateway hashes %d; "
                        "its cache cannot be matched (fix block_size)",
                        self.holder,
                        event.block_size,
                        size,
                    )
                self.block_size_mismatches += 1


def _blocks(event: EngineEvent) -> int:
    if isinstance(event, EngineBlockStored | EngineBlockRemoved):
        return len(event.engine_hashes)
    return 0


class ReplayFailed(Exception):
    """The source could not replay (no replay endpoint, timeout, socket or decode error)."""


class KvEventSource(Protocol):
    """An engine's KV-event transport: decoded batches, and replay of missed ones."""

    @property
    def can_replay(self) -> bool:
        """Whether :meth:`replay_from` can work at all (a replay endpoint is configured)."""
        ...

    def batches(self) -> AsyncGenerator[EngineEventBatch | WireError, None]:
        """Each message as it arrives, decoded (a :class:`WireError` for one that is not),
        until cancelled; the transport is closed when the iterator is."""
        ...

    async def wait_connected(self) -> None:
        """Returns once :meth:`batches` listens."""
        ...

    async def replay_from(self, start_seq: int) -> list[EngineEventBatch]:
        """Every buffered batch with seq >= ``start_seq``; raises :class:`ReplayFailed`."""
        ...


@dataclass(slots=True)
class FeedStats:
    batches: int = 0
    """Batches received from the source and decoded."""
    events_out: int = 0
    """Core events put on the queue."""
    drops: int = 0
    """Core events dropped because the queue was full."""
    decode_errors: int = 0
    replays: int = 0
    """Replay requests that filled their gap completely."""
    replay_failures: int = 0
    """Replay requests that failed or came back incomplete."""


class KvFeed:
    """One engine's KV-event feed (see the module docstring).

    Invariant: events reach ``queue`` in the engine's publication order, except for events
    dropped because the queue was full (then ``needs_resync`` is True).
    """

    def __init__(
        self,
        source: KvEventSource,
        ingest: EngineKvIngest,
        queue: asyncio.Queue[KvEvent],
        *,
        catch_up_on_join: bool = True,
    ) -> None:
        self.source = source
        self.ingest = ingest
        self.queue = queue
        self.catch_up_on_join = catch_up_on_join
        self.stats = FeedStats()
        self.needs_resync = False

    @property
    def depth(self) -> int:
        """Events waiting in the queue."""
        return self.queue.qsize()

    def resynced(self) -> None:
        """The owner has rebuilt this engine's state; clear the resync mark."""
        self.needs_resync = False

    async def wait_connected(self) -> None:
        await self.source.wait_connected()

    async def run(self) -> None:
        """Handle the source's batches until cancelled (then the source is closed)."""
        async with contextlib.aclosing(self.source.batches()) as batches:
            async for item in batches:
                await self.handle(item)

    async def handle(self, item: EngineEventBatch | WireError) -> None:
        """Check, fill and queue one decoded batch (public for socket-free tests)."""
        if isinstance(item, WireError):
            self.stats.decode_errors += 1
            self.needs_resync = True
            log.warning("engine %s: undecodable KV event message: %s", self.ingest.holder, item)
            return
        batch = item
        self.stats.batches += 1
        check = self.ingest.check(batch)
        if check.verdict is SeqVerdict.GAP or (
            check.verdict is SeqVerdict.FIRST and batch.seq > 0 and self.catch_up_on_join
        ):
            await self._fill(check, batch)
        elif check.verdict is SeqVerdict.RESTART:
            log.info("engine %s: KV event stream restarted (seq %d)", self.ingest.holder, batch.seq)
            if batch.seq > 0 and self.source.can_replay:
                # the restarted engine's first batches went by before we reconnected: clear,
                # replay them from 0, then this batch in order
                self._put_all(self.ingest.apply(replace(batch, events=()), check))
                await self._fill(SeqCheck(SeqVerdict.FIRST, batch.seq), batch)
                check = SeqCheck(SeqVerdict.IN_ORDER, batch.seq, batch.seq)
        try:
            await self._apply(batch, check)
        except Exception as exc:  # a decodable but nonsensical batch: counted, never fatal
            self.stats.decode_errors += 1
            self.needs_resync = True
            log.warning(
                "engine %s: KV batch %d not applicable: %r", self.ingest.holder, batch.seq, exc
            )

    async def _apply(self, batch: EngineEventBatch, check: SeqCheck) -> None:
        """Apply ``batch``; a big one slice by slice, the loop getting a turn in between."""
        max_blocks = self.ingest.mapper.max_blocks
        if check.verdict is SeqVerdict.DUPLICATE or (
            blocks_in(batch.events) <= SLICE_BLOCKS
            and (max_blocks is None or all(_blocks(e) <= max_blocks for e in batch.events))
        ):
            self._put_all(self.ingest.apply(batch, check))
            return
        pieces, dropped = slices(batch.events, SLICE_BLOCKS, max_blocks)
        if dropped:
            self.ingest.mapper.stats.over_capacity += dropped
            log.warning(
                "engine %s: %d KV events claim more than its %s blocks; dropped",
                self.ingest.holder,
                dropped,
                max_blocks,
            )
        first = pieces[0] if pieces else []
        self._put_all(self.ingest.apply(replace(batch, events=tuple(first)), check))
        for piece in pieces[1:]:
            await asyncio.sleep(0)
            self._put_all(self.ingest.mapper.translate_all(piece, batch.seq))

    async def _fill(self, check: SeqCheck, batch: EngineEventBatch) -> None:
        """Apply the batches before ``batch`` that were missed (or precede our join)."""
        start = check.expected if check.expected is not None else 0
        is_gap = check.verdict is SeqVerdict.GAP
        holder = self.ingest.holder
        if not self.source.can_replay:
            if is_gap:
                self.needs_resync = True
                log.warning(
                    "engine %s: missed KV event batches %d..%d and no replay endpoint",
                    holder,
                    start,
                    batch.seq - 1,
                )
            return
        try:
            replayed = await self.source.replay_from(start)
        except ReplayFailed as exc:
            self.stats.replay_failures += 1
            self.needs_resync = self.needs_resync or is_gap
            log.warning("engine %s: replay from seq %d failed: %s", holder, start, exc)
            return
        fill = [b for b in replayed if start <= b.seq < batch.seq]
        complete = [b.seq for b in fill] == list(range(start, batch.seq))
        if complete or not is_gap:
            # On join, a partial history (the replay buffer wrapped) still helps.
            self.stats.replays += 1
        else:
            self.stats.replay_failures += 1
            self.needs_resync = True
            log.warning(
                "engine %s: replay returned %d of %d missed batches",
                holder,
                len(fill),
                batch.seq - start,
            )
        for b in fill:
            self._put_all(self.ingest.apply_unchecked(b))

    def _put_all(self, events: Sequence[KvEvent]) -> None:
        for event in events:
            try:
                self.queue.put_nowait(event)
            except asyncio.QueueFull:
                self.stats.drops += 1
                self.needs_resync = True
            else:
                self.stats.events_out += 1
