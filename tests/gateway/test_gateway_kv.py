"""KV-event ingestion inside the running gateway: a vLLM-like publisher's BlockStored events
fill the prefix index under the engine's id with the same hashes the request path computes,
steer requests to the holder, and AllBlocksCleared / a resync empty it again."""

from __future__ import annotations

import asyncio
import time

import pytest
import zmq.asyncio

from conductor.core.types import InstanceId, Role
from conductor.gateway.config import EngineConfig
from conductor.gateway.tokenizer import request_block_hashes
from tests.gateway import vllm_wire as w
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import (
    BLOCK,
    FakeTokenizer,
    client_for,
    engine,
    eventually,
    make_gateway,
    serve,
)
from tests.gateway.test_vllm_kv_feed import FakeVllmPublisher

pytestmark = pytest.mark.anyio
E1 = InstanceId("e1")
PROMPT = "a long shared system prompt, then the question"


async def test_kv_events_fill_the_index_and_steer_requests_to_the_holder() -> None:
    ctx = zmq.asyncio.Context()
    pub = FakeVllmPublisher(ctx)
    try:
        e0, e1 = FakeEngine("e0"), FakeEngine("e1")
        async with serve(e0.app()) as u0, serve(e1.app()) as u1:
            e1_cfg = EngineConfig(
                "e1", u1, Role.BOTH, kv_events=pub.endpoint, block_size_tokens=BLOCK, topic="kv"
            )
            gw = make_gateway([engine("e0", u0), e1_cfg])
            async with client_for(gw) as client:
                await asyncio.wait_for(pub.wait_subscriber(), 5)
                tokens = FakeTokenizer().encode(PROMPT, add_special_tokens=True)
                n = len(tokens) // BLOCK
                full = tokens[: n * BLOCK]
                # two batches, the second chained on the first's last engine hash
                head = [9001, 9002]
                tail = [9003 + i for i in range(n - 2)]
                await pub.publish(
                    w.payload([w.stored(list(head), full[: 2 * BLOCK])], ts=time.time())
                )
                await pub.publish(
                    w.payload(
                        [w.stored(list(tail), full[2 * BLOCK :], parent=head[-1])],
                        ts=time.time(),
                    )
                )
                await eventually(lambda: gw.conductor.index.count(E1) == n)
                ours = request_block_hashes(tokens, BLOCK)
                assert gw.conductor.index.match(ours).local_blocks == {E1: n}

                resp = await client.post(
                    "/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 2}
                )
                assert resp.status_code == 200
                assert resp.headers["x-conductor-prefill"] == "e1"
                assert int(resp.headers["x-conductor-cached-tokens"]) == n * BLOCK
                assert len(e1.requests) == 1 and e0.requests == []

                await pub.publish(w.payload([w.BlockRemoved([9003 + n - 3], "GPU")]))
                await eventually(lambda: gw.conductor.index.count(E1) == n - 1)
                await pub.publish(w.payload([w.AllBlocksCleared()]))
                await eventually(lambda: gw.conductor.index.count(E1) == 0)
                metrics = (await client.get("/metrics")).text
    finally:
        pub.close()
        ctx.destroy(linger=0)
    assert 'conductor_kv_events_total{engine="e1",kind="stored"} 2.0' in metrics
    assert 'conductor_kv_events_total{engine="e1",kind="removed"} 1.0' in metrics
    assert 'conductor_kv_events_total{engine="e1",kind="cleared"} 1.0' in metrics
    assert 'conductor_kv_event_lag_seconds_count{engine="e1"} 4.0' in metrics
    assert 'conductor_kv_event_queue_depth{engine="e1",role="both"} 0.0' in metrics
    assert 'conductor_engine_indexed_blocks{engine="e1",role="both"} 0.0' in metrics


async def test_lost_events_clear_the_engine_and_the_index_refills() -> None:
    ctx = zmq.asyncio.Context()
    pub = FakeVllmPublisher(ctx)
    try:
        fake = FakeEngine("e1")
        async with serve(fake.app()) as url:
            cfg = EngineConfig(
                "e1", url, Role.BOTH, kv_events=pub.endpoint, block_size_tokens=BLOCK, topic="kv"
            )
            gw = make_gateway([cfg])
            async with client_for(gw) as client:
                await asyncio.wait_for(pub.wait_subscriber(), 5)
                tokens = list(range(100, 116))
                await pub.publish(w.payload([w.stored([1, 2, 3, 4], tokens)]))
                await eventually(lambda: gw.conductor.index.count(E1) == 4)
                handle = gw.engines[E1]
                assert handle.feed is not None
                handle.feed.needs_resync = True  # as after a queue overflow
                await eventually(lambda: gw.conductor.index.count(E1) == 0)
                assert not handle.feed.needs_resync
                # a gap without replay marks a resync too; later chains index again
                await pub.publish(w.payload([w.stored([5], tokens[:4])]), deliver=False)
                await pub.publish(w.payload([w.stored([6], tokens[4:8], parent=5)]))
                await pub.publish(w.payload([w.stored([7, 8], tokens[8:16], parent=None)]))
                await eventually(lambda: gw.conductor.index.count(E1) == 2)
                metrics = (await client.get("/metrics")).text
    finally:
        pub.close()
        ctx.destroy(linger=0)
    assert 'conductor_kv_resyncs_total{engine="e1",reason="lost_events"} 2.0' in metrics


async def test_engine_restart_clears_its_blocks_before_new_ones_arrive() -> None:
    ctx = zmq.asyncio.Context()
    pub = FakeVllmPublisher(ctx)
    try:
        fake = FakeEngine("e1")
        async with serve(fake.app()) as url:
            cfg = EngineConfig(
                "e1", url, Role.BOTH, kv_events=pub.endpoint, block_size_tokens=BLOCK, topic="kv"
            )
            gw = make_gateway([cfg])
            async with client_for(gw):
                await asyncio.wait_for(pub.wait_subscriber(), 5)
                old = list(range(100, 116))
                await pub.publish(w.payload([w.stored([1, 2, 3, 4], old)], ts=10.0))
                await pub.publish(w.payload([w.stored([5], list(range(200, 204)))], ts=11.0))
                await eventually(lambda: gw.conductor.index.count(E1) == 5)
                pub.next_seq = 0  # the engine restarted: its sequence starts over, later ts
                new = list(range(300, 308))
                await pub.publish(w.payload([w.stored([1, 2], new)], ts=20.0))
                ours = request_block_hashes(new, BLOCK)
                await eventually(lambda: gw.conductor.index.match(ours).local(E1) == 2)
                assert gw.conductor.index.count(E1) == 2
                assert gw.conductor.index.match(request_block_hashes(old, BLOCK)).local(E1) == 0
    finally:
        pub.close()
        ctx.destroy(linger=0)


async def test_background_tasks_end_with_the_app() -> None:
    ctx = zmq.asyncio.Context()
    pub = FakeVllmPublisher(ctx)
    try:
        cfg = EngineConfig(
            "e1",
            "http://127.0.0.1:9",
            Role.BOTH,
            kv_events=pub.endpoint,
            block_size_tokens=BLOCK,
            topic="kv",
        )
        gw = make_gateway([cfg])
        before = {t.get_name() for t in asyncio.all_tasks()}
        async with client_for(gw):
            names = {t.get_name() for t in asyncio.all_tasks()} - before
            assert {"health", "load", "kv-sub-e1", "kv-pump-e1"} <= names
            assert gw.engines[E1].tasks
        await asyncio.sleep(0)
        after = {t.get_name() for t in asyncio.all_tasks()}
        assert not {"health", "load", "kv-sub-e1", "kv-pump-e1"} & after
        assert gw.engines[E1].tasks == []
    finally:
        pub.close()
        ctx.destroy(linger=0)
