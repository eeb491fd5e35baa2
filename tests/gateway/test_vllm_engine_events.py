"""Against a real vLLM CPU engine: its KV events arrive through our subscriber, carry the
prompt's full blocks, map to our chained hashes, and its prefix cache really hits."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest
import zmq.asyncio
from tokenizers import Tokenizer

from conductor.core.events import BlocksStored, KvEvent
from conductor.core.types import InstanceId, Tier
from conductor.gateway.engines.vllm import vllm_kv_feed
from conductor.gateway.kv_feed import EngineKvIngest, SeqCheck
from conductor.gateway.kv_ingest import EngineHashMapper
from conductor.wire.events import EngineBlockStored, EngineEventBatch
from tests.engines.fixtures import TINY_MODEL, VllmEngine
from tests.gateway.hashing_standin import chain, hash_block

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ENGINE = InstanceId("vllm-0")
MAX_TOKENS = 4
PROMPT = (
    "The cache holds blocks of keys and values for every token a model has seen. "
    "A scheduler sends each request to the engine that already has its prefix, so "
    "prefill computes only what is new while decode produces one token at a time. "
    "Mooncake stores kv blocks in a shared pool across many machines, and conductor "
    "chooses where to prefill, where to decode and which blocks to move. Latency, "
    "throughput and goodput all depend on how well the cluster reuses those blocks."
)


class RecordingIngest(EngineKvIngest):
    """Also keeps the engine-level batches, to check what vLLM itself published."""

    def __init__(self, mapper: EngineHashMapper) -> None:
        super().__init__(mapper)
        self.batches: list[EngineEventBatch] = []

    def apply(self, batch: EngineEventBatch, check: SeqCheck) -> list[KvEvent]:
        self.batches.append(batch)
        return super().apply(batch, check)

    def apply_unchecked(self, batch: EngineEventBatch) -> list[KvEvent]:
        self.batches.append(batch)
        return super().apply_unchecked(batch)


def metric(text: str, name: str) -> float:
    """Sum of a Prometheus counter's samples (all label sets)."""
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.MULTILINE)
    values = [float(v) for v in pattern.findall(text)]
    assert values, f"{name} not in /metrics"
    return sum(values)


async def wait_metric_above(
    client: httpx.AsyncClient, name: str, floor: float, timeout_s: float = 30.0
) -> float:
    async with asyncio.timeout(timeout_s):
        while True:
            value = metric((await client.get("/metrics")).text, name)
            if value > floor:
                return value
            await asyncio.sleep(0.2)


def test_real_engine_events_map_to_our_chained_hashes(vllm_engine: VllmEngine) -> None:
    bs = vllm_engine.block_size
    tokens = Tokenizer.from_file(str(TINY_MODEL / "tokenizer.json")).encode(PROMPT).ids
    n_full = len(tokens) // bs
    assert n_full >= 2, f"prompt too short: {len(tokens)} tokens"
    # Generated tokens must not complete another block, so only the prompt's blocks appear.
    assert len(tokens) % bs + MAX_TOKENS < bs
    full_tokens = tokens[: n_full * bs]
    expected_ours = chain(full_tokens, bs)

    async def main() -> tuple[RecordingIngest, list[KvEvent], float, float, list[KvEvent]]:
        ctx = zmq.asyncio.Context()
        queue: asyncio.Queue[KvEvent] = asyncio.Queue(maxsize=1000)
        ingest = RecordingIngest(EngineHashMapper(ENGINE, hash_block))
        sub = vllm_kv_feed(
            endpoint=vllm_engine.kv_endpoint,
            ingest=ingest,
            queue=queue,
            topic=vllm_engine.topic.encode(),
            replay_endpoint=vllm_engine.replay_endpoint,
            context=ctx,
        )
        body = {
            "model": vllm_engine.model_name,
            "prompt": PROMPT,
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
        }
        try:
            async with (
                httpx.AsyncClient(base_url=vllm_engine.base_url, timeout=60.0) as client,
                asyncio.TaskGroup() as tg,
            ):
                task = tg.create_task(sub.run())
                await sub.wait_connected()
                await asyncio.sleep(1.0)  # let the SUB's subscription reach the PUB socket
                engine_tokens = (
                    await client.post(
                        "/tokenize", json={"model": vllm_engine.model_name, "prompt": PROMPT}
                    )
                ).json()["tokens"]
                assert engine_tokens == tokens, "engine and tokenizer.json disagree"
                hits_before = metric(
                    (await client.get("/metrics")).text, "vllm:prefix_cache_hits_total"
                )

                first = await client.post("/v1/completions", json=body)
                assert first.status_code == 200, first.text
                assert first.json()["usage"]["prompt_tokens"] == len(tokens)
                stored: list[KvEvent] = []
                async with asyncio.timeout(30):
                    while sum(
                        len(e.block_hashes) for e in stored if isinstance(e, BlocksStored)
                    ) < (n_full):
                        stored.append(await queue.get())

                second = await client.post("/v1/completions", json=body)
                assert second.status_code == 200, second.text
                hits_after = await wait_metric_above(
                    client, "vllm:prefix_cache_hits_total", hits_before
                )
                await asyncio.sleep(0.5)  # anything the second request published
                later = [queue.get_nowait() for _ in range(queue.qsize())]
                task.cancel()
        finally:
            ctx.destroy(linger=0)
        return ingest, stored, hits_before, hits_after, later

    ingest, stored, hits_before, hits_after, later = asyncio.run(main())

    # What vLLM published: full blocks of the prompt's tokens, chained from the root.
    engine_stored = [
        e for b in ingest.batches for e in b.events if isinstance(e, EngineBlockStored)
    ]
    assert engine_stored, "no BlockStored from the engine"
    assert engine_stored[0].parent_engine_hash is None
    assert all(e.block_size == bs and e.medium == "GPU" for e in engine_stored)
    assert [t for e in engine_stored for t in e.token_ids] == full_tokens
    assert sum(len(e.engine_hashes) for e in engine_stored) == n_full

    # What reached the queue: our chained hashes of exactly those tokens, for this engine.
    assert [e for e in stored if not isinstance(e, BlocksStored)] == []
    ours = [h for e in stored if isinstance(e, BlocksStored) for h in e.block_hashes]
    assert ours == expected_ours
    assert {(e.holder, e.tier) for e in stored if isinstance(e, BlocksStored)} == {
        (ENGINE, Tier.GPU)
    }
    assert ingest.mapper.stats.missing_parent == 0
    assert len(ingest.mapper) == n_full

    # The same prompt again hits the engine's prefix cache for every full block, and
    # stores nothing new.
    assert hits_after - hits_before == n_full * bs
    assert [e for e in later if isinstance(e, BlocksStored)] == []
