"""The KV feed on vLLM's ZMQ sockets (``vllm_kv_feed``): a test publisher that behaves like vLLM's
``ZmqEventPublisher`` (PUB frames ``[topic, seq, payload]``, replay ROUTER answering
``[id, b"", topic, seq, payload]`` ... ``[id, b"", b"", -1, b""]``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import zmq
import zmq.asyncio

from conductor.core.events import AllBlocksCleared, BlocksRemoved, BlocksStored, KvEvent
from conductor.core.types import InstanceId, Tier
from conductor.gateway.engines.vllm import vllm_kv_feed
from conductor.gateway.engines.vllm_zmq import decode_message
from conductor.gateway.kv_feed import EngineKvIngest, FeedStats, KvFeed
from conductor.gateway.kv_ingest import EngineHashMapper
from tests.gateway import vllm_wire as w
from tests.gateway.hashing_standin import chain, hash_block

P0 = InstanceId("prefill-0")
TOKENS = list(range(200, 216))  # 4 blocks of 4
FULL = chain(TOKENS, 4)
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class FakeVllmPublisher:
    """PUB (XPUB, to see the subscription arrive) + replay ROUTER, like vLLM 0.32."""

    def __init__(self, ctx: zmq.asyncio.Context, topic: bytes = b"kv") -> None:
        self.topic = topic
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.buffer: list[tuple[int, bytes]] = []
        self.replay_requests: list[int] = []
        self.next_seq = 0

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    async def wait_subscriber(self) -> None:
        message = await self.pub.recv()
        assert message == b"\x01" + self.topic

    async def publish(self, body: bytes, *, deliver: bool = True) -> int:
        """Buffer the batch for replay; send it unless simulating a loss."""
        seq = self.next_seq
        self.next_seq += 1
        self.buffer.append((seq, body))
        if deliver:
            await self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), body])
        return seq

    async def serve_replay(self) -> None:
        while True:
            client_id, _, start_bytes = await self.router.recv_multipart()
            start = int.from_bytes(start_bytes, "big")
            self.replay_requests.append(start)
            for seq, body in self.buffer:
                if seq >= start:
                    await self.router.send_multipart(
                        [client_id, b"", self.topic, seq.to_bytes(8, "big"), body]
                    )
            await self.router.send_multipart([client_id, b"", b"", END_SEQ, b""])

    def close(self) -> None:
        self.pub.close(linger=0)
        self.router.close(linger=0)


Scenario = Callable[[FakeVllmPublisher, KvFeed], Awaitable[None]]


def run_scenario(
    scenario: Scenario,
    *,
    replay: bool = True,
    queue_size: int = 100,
    serve_replay: bool = True,
    replay_timeout_s: float = 2.0,
) -> KvFeed:
    async def main() -> KvFeed:
        ctx = zmq.asyncio.Context()
        publisher = FakeVllmPublisher(ctx)
        queue: asyncio.Queue[KvEvent] = asyncio.Queue(maxsize=queue_size)
        sub = vllm_kv_feed(
            endpoint=publisher.endpoint,
            ingest=EngineKvIngest(EngineHashMapper(P0, hash_block)),
            queue=queue,
            topic=b"kv",
            replay_endpoint=publisher.replay_endpoint if replay else None,
            replay_timeout_s=replay_timeout_s,
            context=ctx,
        )
        try:
            async with asyncio.timeout(10), asyncio.TaskGroup() as tg:
                run_task = tg.create_task(sub.run())
                replay_task = tg.create_task(publisher.serve_replay()) if serve_replay else None
                await sub.wait_connected()
                await publisher.wait_subscriber()
                await scenario(publisher, sub)
                run_task.cancel()
                if replay_task is not None:
                    replay_task.cancel()
        finally:
            publisher.close()
            ctx.destroy(linger=0)
        return sub

    return asyncio.run(main())


async def take(sub: KvFeed, n: int) -> list[KvEvent]:
    return [await sub.queue.get() for _ in range(n)]


def stored_payload(
    hashes: list[Any], tokens: list[int], parent: Any = None, ts: float = 1.0
) -> bytes:
    return w.map_payload([w.stored(hashes, tokens, parent)], ts=ts)


def test_subscriber_receives_and_translates_vllm_frames() -> None:
    got: list[KvEvent] = []

    async def scenario(pub: FakeVllmPublisher, sub: KvFeed) -> None:
        # The map form of the batch, and vLLM 0.32's own array form, in one stream.
        await pub.publish(stored_payload([11, 12], TOKENS[:8], ts=1.0))
        await pub.publish(w.payload([w.stored([13, 14], TOKENS[8:], parent=12)], ts=1.1))
        await pub.publish(
            w.map_payload([w.BlockRemoved(block_hashes=[14, 13], medium="GPU")], ts=1.2)
        )
        await pub.publish(w.map_payload([w.AllBlocksCleared()], ts=1.3))
        got.extend(await take(sub, 4))

    sub = run_scenario(scenario)
    assert got == [
        BlocksStored(holder=P0, block_hashes=(FULL[0], FULL[1]), tier=Tier.GPU, seq=0),
        BlocksStored(holder=P0, block_hashes=(FULL[2], FULL[3]), tier=Tier.GPU, seq=1),
        BlocksRemoved(holder=P0, block_hashes=(FULL[3], FULL[2]), tier=Tier.GPU, seq=2),
        AllBlocksCleared(holder=P0, tier=None, seq=3),
    ]
    assert sub.stats == FeedStats(batches=4, events_out=4)
    assert sub.needs_resync is False
    assert sub.depth == 0


def test_gap_is_filled_from_replay_in_order() -> None:
    got: list[KvEvent] = []
    requests: list[int] = []

    async def scenario(pub: FakeVllmPublisher, sub: KvFeed) -> None:
        await pub.publish(stored_payload([11], TOKENS[:4], ts=1.0))
        await pub.publish(stored_payload([12], TOKENS[4:8], parent=11, ts=1.1), deliver=False)
        await pub.publish(stored_payload([13], TOKENS[8:12], parent=12, ts=1.2), deliver=False)
        await pub.publish(stored_payload([14], TOKENS[12:], parent=13, ts=1.3))
        got.extend(await take(sub, 4))
        requests.extend(pub.replay_requests)

    sub = run_scenario(scenario)
    assert got == [BlocksStored(holder=P0, block_hashes=(FULL[i],), seq=i) for i in range(4)]
    assert requests == [1]
    assert sub.stats == FeedStats(batches=2, events_out=4, replays=1)
    assert sub.ingest.tracker.gaps == 1
    assert sub.needs_resync is False


def test_joining_mid_stream_catches_up_from_replay() -> None:
    got: list[KvEvent] = []

    async def scenario(pub: FakeVllmPublisher, sub: KvFeed) -> None:
        await pub.publish(stored_payload([11, 12], TOKENS[:8]), deliver=False)
        await pub.publish(stored_payload([13, 14], TOKENS[8:], parent=12))
        got.extend(await take(sub, 2))

    sub = run_scenario(scenario)
    assert got == [
        BlocksStored(holder=P0, block_hashes=(FULL[0], FULL[1]), seq=0),
        BlocksStored(holder=P0, block_hashes=(FULL[2], FULL[3]), seq=1),
    ]
    assert sub.stats.replays == 1
    assert sub.needs_resync is False


def test_gap_without_replay_endpoint_marks_resync() -> None:
    got: list[KvEvent] = []

    async def scenario(pub: FakeVllmPublisher, sub: KvFeed) -> None:
        await pub.publish(stored_payload([11], TOKENS[:4], ts=1.0))
        await pub.publish(stored_payload([12], TOKENS[4:8], parent=11, ts=1.1), deliver=False)
        await pub.publish(stored_payload([21], TOKENS[:4], ts=1.2))
        got.extend(await take(sub, 2))

    sub = run_scenario(scenario, replay=False)
    assert got == [
        BlocksStored(holder=P0, block_hashes=(FULL[0],), seq=0),
        BlocksStored(holder=P0, block_hashes=(FULL[0],), seq=2),
    ]
    assert sub.needs_resync is True
    assert (sub.ingest.tracker.gaps, sub.ingest.tracker.missed) == (1, 1)
    sub.resynced()
    assert sub.needs_resync is False


def test_replay_that_never_answers_times_out_and_marks_resync() -> None:
    got: list[KvEvent] = []

    async def scenario(pub: FakeVllmPublisher, sub: KvFeed) -> None:
        await pub.publish(stored_payload([11], TOKENS[:4], ts=1.0))
        await pub.publish(stored_payload([12], TOKENS[4:8], parent=11, ts=1.1), deliver=False)
        await pub.publish(stored_payload([13], TOKENS[8:12], parent=12, ts=1.2))
        got.extend(await take(sub, 1))
        await asyncio.sleep(0.5)

    sub = run_scenario(scenario, serve_replay=False, replay_timeout_s=0.2)
    # Batch 2's parent (seq 1) never arrived, so it is skipped as a missing parent.
    assert got == [BlocksStored(holder=P0, block_hashes=(FULL[0],), seq=0)]
    assert sub.stats.replay_failures == 1
    assert sub.ingest.mapper.stats.missing_parent == 1
    assert sub.needs_resync is True


def test_restart_emits_all_blocks_cleared() -> None:
    got: list[KvEvent] = []

    async def scenario(pub: FakeVllmPublisher, sub: KvFeed) -> None:
        await pub.publish(stored_payload([11], TOKENS[:4], ts=1.0))
        await pub.publish(stored_payload([12], TOKENS[4:8], parent=11, ts=1.1))
        pub.next_seq = 0  # a new engine process
        pub.buffer.clear()
        await pub.publish(stored_payload([99], TOKENS[:4], ts=5.0))
        got.extend(await take(sub, 4))

    sub = run_scenario(scenario)
    assert got == [
        BlocksStored(holder=P0, block_hashes=(FULL[0],), seq=0),
        BlocksStored(holder=P0, block_hashes=(FULL[1],), seq=1),
        AllBlocksCleared(holder=P0, tier=None, seq=0),
        BlocksStored(holder=P0, block_hashes=(FULL[0],), seq=0),
    ]
    assert sub.ingest.tracker.restarts == 1
    assert len(sub.ingest.mapper) == 1


def _socketless(queue_size: int) -> KvFeed:
    queue: asyncio.Queue[KvEvent] = asyncio.Queue(maxsize=queue_size)
    return vllm_kv_feed(
        endpoint="tcp://127.0.0.1:1",
        ingest=EngineKvIngest(EngineHashMapper(P0, hash_block)),
        queue=queue,
    )


def test_full_queue_counts_drops_and_marks_resync() -> None:
    async def main() -> KvFeed:
        sub = _socketless(queue_size=1)
        body = w.map_payload([w.stored([11], TOKENS[:4]), w.stored([12], TOKENS[4:8], 11)])
        await sub.handle(decode_message(w.frames(0, body)))
        await sub.handle(decode_message(w.frames(1, w.map_payload([w.AllBlocksCleared()], ts=1.0))))
        return sub

    sub = asyncio.run(main())
    assert sub.depth == 1
    assert sub.queue.get_nowait() == BlocksStored(holder=P0, block_hashes=(FULL[0],), seq=0)
    assert sub.stats == FeedStats(batches=2, events_out=1, drops=2)
    assert sub.needs_resync is True


def test_undecodable_message_is_counted_and_skipped() -> None:
    async def main() -> KvFeed:
        sub = _socketless(queue_size=10)
        await sub.handle(decode_message([b"kv", b"\x00" * 8, b"\xc1"]))
        await sub.handle(decode_message([b"kv"]))
        await sub.handle(decode_message(w.frames(0, stored_payload([11], TOKENS[:4]))))
        return sub

    sub = asyncio.run(main())
    assert sub.stats == FeedStats(batches=1, events_out=1, decode_errors=2)
    assert sub.needs_resync is True
