"""The emulator's KV events on real ZMQ sockets: vLLM's wire format, decodable by our
decoder, mapped by ``kv_ingest`` to the scheduler's chained hashes, and replayable."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import httpx
import msgpack
import pytest
import zmq
import zmq.asyncio

from conductor.core.events import BlocksRemoved, BlocksStored, KvEvent
from conductor.core.hashing import hash_block, hash_blocks
from conductor.core.types import InstanceId, Tier
from conductor.emulator.config import EmulatorConfig
from conductor.gateway.engines.vllm import vllm_kv_feed as VllmKvSubscriber
from conductor.gateway.kv_feed import EngineKvIngest
from conductor.gateway.kv_ingest import EngineHashMapper
from conductor.wire.events import EngineBlockStored
from conductor.wire.vllm_events import decode_frames, encode_seq
from tests.emulator.helpers import EmulatorThread, running_emulator

TOPIC = "kv"
PROMPT = "KV events should carry every full block of this prompt to the gateway. " * 2  # 144


@pytest.fixture
def emu() -> Iterator[EmulatorThread]:
    cfg = EmulatorConfig(instant=True, kv_topic=TOPIC, cache_blocks=12)
    with running_emulator(cfg) as server:
        yield server


def complete(emu: EmulatorThread, prompt: str, max_tokens: int = 1) -> None:
    body = {"prompt": prompt, "max_tokens": max_tokens}
    r = httpx.post(f"{emu.base_url}/v1/completions", json=body, timeout=10)
    assert r.status_code == 200, r.text


async def _sub_socket(ctx: zmq.asyncio.Context, endpoint: str) -> zmq.asyncio.Socket:
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(endpoint)
    await asyncio.sleep(0.3)  # most of the slow-joiner window of PUB/SUB
    return sock


def test_raw_frames_are_vllm_wire_format(emu: EmulatorThread) -> None:
    def prompt(k: int) -> str:
        return f"{k:03d} " + PROMPT[4:]  # 144 tokens: one batch of 4 full blocks each

    async def main() -> tuple[int, list[bytes]]:
        ctx = zmq.asyncio.Context()
        try:
            sock = await _sub_socket(ctx, emu.kv_endpoint)
            for k in range(20):  # until the SUB socket has joined (PUB drops before that)
                await asyncio.to_thread(complete, emu, prompt(k))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        return k, await sock.recv_multipart()
            raise AssertionError("no KV event message arrived")
        finally:
            ctx.destroy(linger=0)

    k, frames = asyncio.run(main())
    topic, seq, payload = frames
    assert topic == b"kv" and seq == k.to_bytes(8, "big")  # one batch per request, from 0
    ts, events, dp_rank = msgpack.unpackb(payload)
    assert isinstance(ts, float) and dp_rank == 0
    (event,) = events
    tokens = list(prompt(k).encode())
    assert event == {
        "type": "BlockStored",
        "block_hashes": event["block_hashes"],
        "parent_block_hash": None,
        "token_ids": tokens[:128],
        "block_size": 32,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None] * 4,
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }
    assert next(iter(event)) == "type"
    assert len(event["block_hashes"]) == 4 and all(
        isinstance(h, int) and 0 <= h < 2**64 for h in event["block_hashes"]
    )
    batch = decode_frames(frames)
    assert batch.seq == k and isinstance(batch.events[0], EngineBlockStored)
    assert batch.events[0].engine_hashes == tuple(event["block_hashes"])
    # The engine's hashes are its own, not the scheduler's.
    assert list(batch.events[0].engine_hashes) != hash_blocks(tokens, 32)


def test_subscriber_maps_events_to_our_chained_hashes(emu: EmulatorThread) -> None:
    async def main() -> list[KvEvent]:
        ctx = zmq.asyncio.Context()
        queue: asyncio.Queue[KvEvent] = asyncio.Queue(maxsize=100)
        sub = VllmKvSubscriber(
            endpoint=emu.kv_endpoint,
            ingest=EngineKvIngest(EngineHashMapper(InstanceId("emu"), hash_block)),
            queue=queue,
            topic=b"kv",
            replay_endpoint=emu.replay_endpoint,
            context=ctx,
        )
        got: list[KvEvent] = []
        try:
            async with asyncio.timeout(10), asyncio.TaskGroup() as tg:
                task = tg.create_task(sub.run())
                await sub.wait_connected()
                await asyncio.sleep(0.5)
                # PROMPT caches 4 blocks, then 3 x 3 blocks of other prompts overflow the
                # 12-block cache: evictions. A batch published before the SUB socket joined
                # comes back through replay.
                for text in (PROMPT, *(f"{k} other prompt text " * 6 for k in range(3))):
                    await asyncio.to_thread(complete, emu, text)
                while len(got) < 4 or not any(isinstance(e, BlocksRemoved) for e in got):
                    got.append(await queue.get())
                task.cancel()
        finally:
            ctx.destroy(linger=0)
        assert sub.stats.decode_errors == 0 and not sub.needs_resync
        return got

    events = asyncio.run(main())
    first = events[0]
    assert isinstance(first, BlocksStored)
    assert first.holder == "emu" and first.tier is Tier.GPU and first.seq == 0
    ours = hash_blocks(list(PROMPT.encode()), 32)
    assert list(first.block_hashes) == ours
    removed = [h for e in events if isinstance(e, BlocksRemoved) for h in e.block_hashes]
    assert removed and set(removed) <= set(ours) | {
        h for e in events if isinstance(e, BlocksStored) for h in e.block_hashes
    }
    assert removed[0] == ours[-1]  # the LRU chain is evicted tail first


def test_replay_serves_buffered_batches_from_a_sequence_number(emu: EmulatorThread) -> None:
    for k in range(3):
        complete(emu, f"replay prompt number {k} " * 3)  # 69 tokens: 2 blocks each

    async def replay(start: int) -> list[list[bytes]]:
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(emu.replay_endpoint)
        out: list[list[bytes]] = []
        try:
            async with asyncio.timeout(5):
                await sock.send_multipart([b"", encode_seq(start)])
                while True:
                    frames = await sock.recv_multipart()
                    out.append(frames)
                    if frames[2] == encode_seq(-1):
                        return out
        finally:
            ctx.destroy(linger=0)

    everything = asyncio.run(replay(0))
    assert len(everything) == 4
    for seq, frames in enumerate(everything[:-1]):
        empty, topic, raw_seq, payload = frames
        assert (empty, topic) == (b"", b"kv")
        batch = decode_frames([topic, raw_seq, payload])
        assert batch.seq == seq and len(batch.events) == 1
    assert everything[-1] == [b"", b"", encode_seq(-1), b""]
    tail = asyncio.run(replay(2))
    assert [f[2] for f in tail] == [encode_seq(2), encode_seq(-1)]


def test_subscriber_joining_late_catches_up_through_replay(emu: EmulatorThread) -> None:
    complete(emu, PROMPT)  # seq 0, published before anyone listens

    async def main() -> list[KvEvent]:
        ctx = zmq.asyncio.Context()
        queue: asyncio.Queue[KvEvent] = asyncio.Queue(maxsize=100)
        sub = VllmKvSubscriber(
            endpoint=emu.kv_endpoint,
            ingest=EngineKvIngest(EngineHashMapper(InstanceId("emu"), hash_block)),
            queue=queue,
            topic=b"kv",
            replay_endpoint=emu.replay_endpoint,
            context=ctx,
        )
        try:
            async with asyncio.timeout(10), asyncio.TaskGroup() as tg:
                task = tg.create_task(sub.run())
                await sub.wait_connected()
                await asyncio.sleep(0.3)
                # A prompt extending the cached one: its event's parent is in batch 0.
                await asyncio.to_thread(complete, emu, PROMPT + "and then some more text " * 2)
                got = [await queue.get(), await queue.get()]
                task.cancel()
        finally:
            ctx.destroy(linger=0)
        assert sub.stats.replays == 1 and sub.ingest.mapper.stats.missing_parent == 0
        return got

    first, second = asyncio.run(main())
    assert isinstance(first, BlocksStored) and isinstance(second, BlocksStored)
    assert (first.seq, second.seq) == (0, 1)
    full = list((PROMPT + "and then some more text " * 2).encode())
    assert list(first.block_hashes) + list(second.block_hashes) == hash_blocks(full, 32)


def test_malformed_replay_request_is_ignored(emu: EmulatorThread) -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(emu.replay_endpoint)
        try:
            await sock.send_multipart([b"", b"short"])
            await sock.send_multipart([b"", encode_seq(0)])
            async with asyncio.timeout(5):
                frames = await sock.recv_multipart()
            assert frames[2] == encode_seq(-1)  # nothing published yet; the bad one got nothing
        finally:
            ctx.destroy(linger=0)

    asyncio.run(main())
    assert emu.emulator.publisher is not None
    assert emu.emulator.publisher.stats.bad_replay_requests == 1
