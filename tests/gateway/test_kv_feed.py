"""KvFeed without sockets: a scripted :class:`KvEventSource` drives the one place where
sequence gaps, replays and the queue are handled; and the replay reply's two wire forms."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from conductor.core.events import BlocksStored, KvEvent
from conductor.core.types import InstanceId
from conductor.gateway.kv_feed import EngineKvIngest, FeedStats, KvFeed, ReplayFailed
from conductor.gateway.kv_ingest import EngineHashMapper
from conductor.wire import vllm_events_encode as enc
from conductor.wire.events import EngineBlockHash, EngineBlockStored, EngineEventBatch, WireError
from conductor.wire.vllm_events import decode_replay, encode_seq
from tests.gateway.hashing_standin import chain, hash_block

E = InstanceId("e")
TOKENS = list(range(300, 316))  # 4 blocks of 4
FULL = chain(TOKENS, 4)


def batch(seq: int, block: int, ts: float | None = None) -> EngineEventBatch:
    """Block ``block`` of TOKENS stored, chained after the one before (engine hash = 10+i)."""
    parent = None if block == 0 else EngineBlockHash(10 + block - 1)
    event = EngineBlockStored(
        engine_hashes=(EngineBlockHash(10 + block),),
        parent_engine_hash=parent,
        token_ids=tuple(TOKENS[block * 4 : block * 4 + 4]),
        block_size=4,
    )
    return EngineEventBatch(b"kv", seq, float(seq) if ts is None else ts, (event,))


class ScriptedSource:
    """Yields ``live`` in order; answers replays from ``buffer`` (or fails)."""

    def __init__(
        self,
        live: list[EngineEventBatch | WireError],
        buffer: list[EngineEventBatch],
        *,
        can_replay: bool = True,
        fail: bool = False,
    ) -> None:
        self.live = live
        self.buffer = buffer
        self.can_replay = can_replay
        self.fail = fail
        self.replays: list[int] = []
        self.closed = False

    async def batches(self) -> AsyncGenerator[EngineEventBatch | WireError, None]:
        try:
            for item in self.live:
                yield item
            await asyncio.Event().wait()  # then silence, as a quiet socket
        finally:
            self.closed = True

    async def wait_connected(self) -> None:
        return None

    async def replay_from(self, start_seq: int) -> list[EngineEventBatch]:
        self.replays.append(start_seq)
        if self.fail:
            raise ReplayFailed("scripted failure")
        return [b for b in self.buffer if b.seq >= start_seq]


def run(source: ScriptedSource, want: int, queue_size: int = 100) -> tuple[KvFeed, list[KvEvent]]:
    async def main() -> tuple[KvFeed, list[KvEvent]]:
        queue: asyncio.Queue[KvEvent] = asyncio.Queue(maxsize=queue_size)
        feed = KvFeed(source, EngineKvIngest(EngineHashMapper(E, hash_block)), queue)
        task = asyncio.create_task(feed.run())
        got = [await asyncio.wait_for(queue.get(), 5) for _ in range(want)]
        for _ in range(len(source.live) + 5):
            await asyncio.sleep(0)  # let the feed finish the script
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return feed, got

    return asyncio.run(main())


def stored(seq: int, block: int) -> BlocksStored:
    return BlocksStored(holder=E, block_hashes=(FULL[block],), seq=seq)


def test_in_order_batches_pass_through_and_the_source_is_closed() -> None:
    source = ScriptedSource([batch(0, 0), batch(1, 1)], [])
    feed, got = run(source, 2)
    assert got == [stored(0, 0), stored(1, 1)]
    assert feed.stats == FeedStats(batches=2, events_out=2)
    assert source.replays == [] and source.closed and not feed.needs_resync


def test_a_gap_is_replayed_before_the_batch_that_revealed_it() -> None:
    all_batches = [batch(i, i) for i in range(4)]
    source = ScriptedSource([all_batches[0], all_batches[3]], all_batches)
    feed, got = run(source, 4)
    assert got == [stored(i, i) for i in range(4)]
    assert source.replays == [1]
    assert feed.stats == FeedStats(batches=2, events_out=4, replays=1)
    assert not feed.needs_resync


def test_an_incomplete_replay_marks_resync() -> None:
    all_batches = [batch(i, i) for i in range(4)]
    source = ScriptedSource([all_batches[0], all_batches[3]], [all_batches[2]])
    feed, got = run(source, 1)
    assert got == [stored(0, 0)]  # batch 2's parent (batch 1) never came: skipped
    assert feed.stats == FeedStats(batches=2, events_out=1, replay_failures=1)
    assert feed.needs_resync
    assert feed.ingest.mapper.stats.missing_parent == 2


def test_a_failed_replay_or_none_at_all_marks_resync_on_a_gap() -> None:
    for source in (
        ScriptedSource([batch(0, 0), batch(2, 2)], [], fail=True),
        ScriptedSource([batch(0, 0), batch(2, 2)], [], can_replay=False),
    ):
        feed, got = run(source, 1)
        assert got == [stored(0, 0)]
        assert feed.needs_resync
        assert feed.stats.replay_failures == (1 if source.can_replay else 0)


def test_joining_late_catches_up_but_a_failed_catch_up_is_no_loss() -> None:
    all_batches = [batch(i, i) for i in range(3)]
    feed, got = run(ScriptedSource([all_batches[2]], all_batches), 3)
    assert got == [stored(i, i) for i in range(3)]
    assert feed.stats.replays == 1 and not feed.needs_resync
    failed = ScriptedSource([all_batches[2]], [], fail=True)
    feed, got = run(failed, 0)
    assert failed.replays == [0]
    assert not feed.needs_resync  # nothing was lost that we ever had


def test_undecodable_messages_and_a_full_queue_mark_resync() -> None:
    source = ScriptedSource([WireError("bad"), batch(0, 0), batch(1, 1)], [])
    feed, got = run(source, 1, queue_size=1)
    assert got == [stored(0, 0)]
    assert feed.stats == FeedStats(batches=2, events_out=1, drops=1, decode_errors=1)
    assert feed.needs_resync
    feed.resynced()
    assert not feed.needs_resync


def test_decode_replay_reads_both_reply_forms_and_the_end_marker() -> None:
    payload = enc.encode_payload([enc.all_blocks_cleared()], ts=2.5)
    with_topic = decode_replay([b"", b"kv", encode_seq(7), payload], b"sub")
    without_topic = decode_replay([b"", encode_seq(7), payload], b"sub")
    assert with_topic is not None and without_topic is not None
    assert (with_topic.topic, with_topic.seq, with_topic.ts) == (b"kv", 7, 2.5)
    assert (without_topic.topic, without_topic.seq) == (b"sub", 7)
    assert decode_replay([b"", b"", encode_seq(-1), b""], b"sub") is None
    with pytest.raises(WireError, match="2 or 3 frames"):
        decode_replay([b"", b"x"], b"sub")
    with pytest.raises(WireError, match="negative sequence number -2"):
        decode_replay([b"", encode_seq(-2), payload], b"sub")


def test_a_restart_seen_late_replays_the_restarted_engines_first_batches() -> None:
    """The engine restarted and published seq 0 before we reconnected; its seq 1 reveals the
    restart: the index is cleared, seq 0 replayed, then seq 1 applied (its parent known)."""
    from conductor.core.events import AllBlocksCleared

    live: list[EngineEventBatch | WireError] = [
        batch(0, 0, ts=0.0),
        batch(1, 1, ts=1.0),
        batch(1, 1, ts=10.0),
    ]
    source = ScriptedSource(live, [batch(0, 0, ts=9.0), batch(1, 1, ts=10.0)])
    feed, got = run(source, 5)
    assert got == [
        stored(0, 0),
        stored(1, 1),
        AllBlocksCleared(holder=E, tier=None, seq=1),
        stored(0, 0),
        stored(1, 1),
    ]
    assert source.replays == [0]
    assert feed.stats.replays == 1 and not feed.needs_resync
