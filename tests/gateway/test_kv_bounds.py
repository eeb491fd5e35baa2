"""What one engine's KV events may cost the gateway: its claim is bounded by its KV capacity
(``max_blocks``), big batches are translated in slices with the same result as whole, and
every drop is counted by reason."""

from __future__ import annotations

import asyncio

from conductor.core.events import BlocksStored, KvEvent
from conductor.core.hashing import hash_block, hash_blocks
from conductor.core.types import InstanceId
from conductor.gateway.kv_feed import EngineKvIngest, KvFeed
from conductor.gateway.kv_ingest import EngineHashMapper
from conductor.gateway.kv_slices import SLICE_BLOCKS, slices, split_stored
from conductor.wire.events import (
    EngineBlockHash,
    EngineBlockRemoved,
    EngineBlockStored,
    EngineEventBatch,
    WireError,
)

E = InstanceId("e")


def stored(n: int, first: int = 0, parent: int | None = None) -> EngineBlockStored:
    """``n`` blocks of 2 tokens, engine hashes ``first .. first + n - 1``."""
    return EngineBlockStored(
        engine_hashes=tuple(EngineBlockHash(first + i) for i in range(n)),
        parent_engine_hash=None if parent is None else EngineBlockHash(parent),
        token_ids=tuple(range(first * 2, (first + n) * 2)),
        block_size=2,
    )


def test_a_claim_beyond_max_blocks_is_skipped_and_counted() -> None:
    mapper = EngineHashMapper(E, hash_block, max_blocks=4)
    assert mapper.translate(stored(3)) is not None
    assert mapper.translate(stored(2, first=3, parent=2)) is None  # 5 > 4
    assert mapper.translate(stored(1, first=3, parent=2)) is not None  # exactly 4
    assert mapper.translate(stored(2, first=2, parent=1)) is not None  # re-stores: no growth
    assert (len(mapper), mapper.stats.over_capacity) == (4, 1)


def test_a_split_event_hashes_like_the_whole() -> None:
    whole = stored(10)
    pieces = list(split_stored(whole, 3))
    assert [len(p.engine_hashes) for p in pieces] == [3, 3, 3, 1]
    assert [p.parent_engine_hash for p in pieces] == [None, 2, 5, 8]
    a, b = EngineHashMapper(E, hash_block), EngineHashMapper(E, hash_block)
    one = a.translate(whole)
    many = [b.translate(p) for p in pieces]
    assert isinstance(one, BlocksStored)
    assert one.block_hashes == tuple(h for m in many if m for h in m.block_hashes)
    assert one.block_hashes == tuple(hash_blocks(list(range(20)), 2))


def test_slices_bound_blocks_and_drop_impossible_events() -> None:
    events = [stored(5), EngineBlockRemoved((EngineBlockHash(0),)), stored(100, first=50)]
    pieces, dropped = slices(events, 4, max_event_blocks=50)
    assert dropped == 1  # 100 blocks cannot fit an engine of 50
    assert [sum(len(e.engine_hashes) for e in p) for p in pieces] == [4, 2]  # type: ignore[union-attr]


class OneShot:
    can_replay = False

    def __init__(self, items: list[EngineEventBatch | WireError]) -> None:
        self.items = items

    async def batches(self):  # type: ignore[no-untyped-def]
        for item in self.items:
            yield item
        await asyncio.Event().wait()

    async def wait_connected(self) -> None:
        return None

    async def replay_from(self, start_seq: int) -> list[EngineEventBatch]:
        return []


def test_a_big_batch_is_sliced_bounded_and_counted() -> None:
    big = SLICE_BLOCKS * 3 + 7

    async def main() -> tuple[KvFeed, list[KvEvent]]:
        queue: asyncio.Queue[KvEvent] = asyncio.Queue(maxsize=1000)
        mapper = EngineHashMapper(E, hash_block, max_blocks=SLICE_BLOCKS * 2)
        items: list[EngineEventBatch | WireError] = [
            EngineEventBatch(b"", 0, 1.0, (stored(big),)),
            WireError("garbage"),
        ]
        feed = KvFeed(OneShot(items), EngineKvIngest(mapper), queue)
        task = asyncio.create_task(feed.run())
        for _ in range(20):
            await asyncio.sleep(0)
        task.cancel()
        got = []
        while not queue.empty():
            got.append(queue.get_nowait())
        return feed, got

    feed, got = asyncio.run(main())
    # the whole event claims more than the engine holds: dropped before any hashing
    assert got == []
    assert feed.ingest.mapper.stats.over_capacity == 1
    assert (feed.stats.batches, feed.stats.decode_errors) == (1, 1)


def test_a_big_batch_within_capacity_arrives_in_slices_equal_to_the_whole() -> None:
    big = SLICE_BLOCKS * 2 + 5

    async def main() -> list[KvEvent]:
        queue: asyncio.Queue[KvEvent] = asyncio.Queue(maxsize=1000)
        mapper = EngineHashMapper(E, hash_block)
        feed = KvFeed(OneShot([]), EngineKvIngest(mapper), queue)
        await feed.handle(EngineEventBatch(b"", 0, 1.0, (stored(big),)))
        return [queue.get_nowait() for _ in range(queue.qsize())]

    got = asyncio.run(main())
    assert [len(e.block_hashes) for e in got] == [SLICE_BLOCKS, SLICE_BLOCKS, 5]  # type: ignore[attr-defined]
    flat = tuple(h for e in got for h in e.block_hashes)  # type: ignore[attr-defined]
    assert flat == tuple(hash_blocks(list(range(big * 2)), 2))
