"""The gateway's disaggregated flow with real vLLM CPU engines: a prefill engine with
vLLM's ExampleConnector as ``kv_producer`` and a decode engine as ``kv_consumer`` sharing a
folder (vllm-cpu-recipe.md). The prefill leg (``max_tokens: 1``) writes the prompt's KV; the
decode engine loads it: its ``vllm:external_prefix_cache_hits_total`` rises."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from conductor.core.types import InstanceId, Role
from conductor.hf.tokenizer import HfTokenizer
from conductor.hf.words import WORDS
from conductor.profiling.config import ProfileConfig
from conductor.profiling.handoff import fit_handoff
from conductor.profiling.measure import Profiler
from conductor.workload.prompts import word_pool
from tests.engines.fixtures import BLOCK_SIZE_TOKENS, SERVED_MODEL_NAME, TINY_MODEL, VllmEngine
from tests.gateway.harness import client_for, eventually
from tests.gateway.test_gateway_vllm import engine_config, real_gateway, sse_texts, start_engines
from tests.gateway.test_vllm_engine_events import metric

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.anyio]

PROMPTS = [
    "Window door garden city forest ocean mountain river yellow blue green red. Ten nine "
    "eight seven six five four three two one delta gamma beta alpha. Eviction reuse transfer "
    "network bandwidth memory goodput throughput latency. Question %d?",
    "Mooncake stores kv blocks in a shared pool across many machines and conductor chooses "
    "where to prefill where to decode and which blocks to move. Prefill computes the prompt "
    "while decode produces one token at a time. Question %d?",
]


@pytest.fixture(scope="module")
def pd_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VllmEngine]]:
    tmp = tmp_path_factory.mktemp("pd")
    shared = tmp / "kv"
    shared.mkdir()

    def connector(role: str) -> list[str]:
        cfg = {
            "kv_connector": "ExampleConnector",
            "kv_role": role,
            "kv_connector_extra_config": {"shared_storage_path": str(shared)},
        }
        return ["--kv-transfer-config", json.dumps(cfg)]

    engines = start_engines(tmp, 2, [connector("kv_producer"), connector("kv_consumer")])
    try:
        yield engines
    finally:
        for engine in engines:
            engine.stop()


async def test_b_pd_flow_end_to_end_with_external_cache_hits_on_decode(
    pd_engines: list[VllmEngine],
) -> None:
    prefill, decode = pd_engines
    gw = real_gateway(
        [
            engine_config("prefill", prefill, Role.PREFILL),
            engine_config("decode", decode, Role.DECODE),
        ]
    )
    async with client_for(gw) as client, httpx.AsyncClient(base_url=decode.base_url) as d:
        await eventually(lambda: all(s.healthy for s in gw.conductor.instances.values()), 10)
        before = metric((await d.get("/metrics")).text, "vllm:external_prefix_cache_hits_total")
        prompt_tokens: list[int] = []
        for i, template in enumerate(PROMPTS):
            resp = await client.post(
                "/v1/completions",
                json={"model": "tiny", "prompt": template % i, "max_tokens": 8, "temperature": 0},
            )
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-conductor-mode"] == "disaggregated"
            assert (resp.headers["x-conductor-prefill"], resp.headers["x-conductor-decode"]) == (
                "prefill",
                "decode",
            )
            assert resp.json()["usage"]["completion_tokens"] == 8
            prompt_tokens.append(resp.json()["usage"]["prompt_tokens"])
        streamed = await client.post(
            "/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": PROMPTS[0] % 7}],
                "max_tokens": 6,
                "stream": True,
            },
        )
        assert streamed.status_code == 200
        assert streamed.text.endswith("data: [DONE]\n\n") and '"error"' not in streamed.text
        assert len([t for t in sse_texts(streamed.text, chat=True)[0] if t]) >= 1
        after = metric((await d.get("/metrics")).text, "vllm:external_prefix_cache_hits_total")
        # the prefill engine's KV events reached the index
        await eventually(lambda: gw.conductor.index.count(InstanceId("prefill")) > 0, 10)
        # and the decode engine's (the prompts it loaded stay in its prefix cache) reached
        # the decode holdings, which a hand-off to it need not carry, not the prefix index
        # that prefill placement fetches from
        await eventually(lambda: gw.conductor.decode_index.count(InstanceId("decode")) > 0, 10)
        assert gw.conductor.index.count(InstanceId("decode")) == 0
        metrics = (await client.get("/metrics")).text
    assert all(n > 40 for n in prompt_tokens), prompt_tokens
    assert after - before >= 32 * len(PROMPTS), (before, after)
    assert 'conductor_observed_prefill_seconds_count{policy="conductor"} 3.0' in metrics
    assert gw.conductor.inflight() == 0


async def test_c_profile_measures_the_hand_off_through_the_gateway(
    pd_engines: list[VllmEngine],
) -> None:
    """``conductor profile --handoff-url``'s measurement against real engines: fresh
    prompts straight to the prefill engine and through the gateway in front of both (the
    decode engine loads the KV files the prefill engine's connector wrote)."""
    prefill, decode = pd_engines
    gw = real_gateway(
        [
            engine_config("prefill", prefill, Role.PREFILL),
            engine_config("decode", decode, Role.DECODE),
        ]
    )
    tok = HfTokenizer.load(TINY_MODEL)
    pool = word_pool(lambda t: tok.encode(t, add_special_tokens=False), WORDS)
    async with client_for(gw) as client:
        await eventually(lambda: all(s.healthy for s in gw.conductor.instances.values()), 10)
        via = str(client.base_url).rstrip("/")
        cfg = ProfileConfig(
            prefill.base_url, handoff_url=via, handoff_lengths=(64, 512), handoff_samples=2
        )
        profiler = Profiler(cfg, SERVED_MODEL_NAME, BLOCK_SIZE_TOKENS, pool)
        try:
            samples = await profiler.handoff()
        finally:
            await profiler.client.aclose()
    assert [s.prompt_tokens for s in samples] == [64, 512, 64, 512]
    assert all(s.prefill_s > 0 and s.pd_ttft_s > 0 for s in samples)
    fit = fit_handoff([(s.prompt_tokens, s.handoff_s) for s in samples])
    print(f"hand-off through ExampleConnector: {samples}; fit {fit}")
    assert fit.n == 4
