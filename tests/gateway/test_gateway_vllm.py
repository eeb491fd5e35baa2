"""The gateway in front of real vLLM CPU engines (tiny model), over real HTTP.

Two aggregated engines (role ``both``, prefix caching, KV events) are shared by the tests of
this module, started in parallel once; the engine-killing test runs last. The P/D pair
lives in ``test_gateway_vllm_pd.py`` (started after these two are stopped: at most two
engines run at once on a 2-core machine).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conductor.core.config import SchedulerConfig
from conductor.core.policies.colocated import ColocatedDecode
from conductor.core.scheduler import Scheduler
from conductor.core.types import InstanceId, Role
from conductor.gateway.config import EngineConfig, GatewayConfig, MonitorConfig, UpstreamConfig
from conductor.gateway.openai_api import parse_chat
from conductor.gateway.service import Gateway
from conductor.gateway.tokenizer import prompt_token_ids, request_block_hashes
from conductor.hf.tokenizer import HfTokenizer
from tests.engines.costs import profiled_cost
from tests.engines.fixtures import (
    BLOCK_SIZE_TOKENS,
    SERVED_MODEL_NAME,
    TINY_MODEL,
    VllmEngine,
    free_ports,
    missing_prerequisites,
    start_vllm_engine,
)
from tests.gateway.harness import client_for, eventually
from tests.gateway.test_vllm_engine_events import metric

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.anyio]

MAX_MODEL_LEN = 2048
FAST_START = ["--enforce-eager"]  # no torch.compile warm-up: ~15-50 s less per start
SHARED_PREFIX = (
    "Conductor chooses where to prefill where to decode and which blocks to move. "
    "Mooncake stores kv blocks in a shared pool across many machines. "
    "The cache holds blocks of keys and values for every token a model has seen, "
    "prefill computes the prompt while decode produces one token at a time. "
    "Latency throughput goodput memory bandwidth network transfer reuse eviction. "
    "Red green blue yellow river mountain ocean forest city garden window door. "
    "Alpha beta gamma delta one two three four five six seven eight nine ten. "
)


def start_engines(
    tmp: Path, count: int, extra_args: list[list[str]] | None = None
) -> list[VllmEngine]:
    """``count`` engines started in parallel (each with KV events and replay)."""
    reason = missing_prerequisites()
    if reason is not None:
        pytest.skip(reason)
    engines: list[VllmEngine] = []
    try:
        for i in range(count):
            port, kv_port, replay_port = free_ports(3)
            args = [*FAST_START, *(extra_args[i] if extra_args else [])]
            engines.append(
                start_vllm_engine(
                    port,
                    kv_port,
                    args,
                    replay_port=replay_port,
                    log_path=tmp / f"engine-{i}.log",
                )
            )
        for engine in engines:
            engine.wait_healthy()
    except BaseException:
        for engine in engines:
            engine.stop()
        raise
    return engines


def engine_config(engine_id: str, engine: VllmEngine, role: Role) -> EngineConfig:
    return EngineConfig(
        engine_id=engine_id,
        url=engine.base_url,
        role=role,
        kv_events=engine.kv_endpoint,
        replay=engine.replay_endpoint,
        model=SERVED_MODEL_NAME,
        block_size_tokens=BLOCK_SIZE_TOKENS,
        topic=engine.topic,
    )


def real_gateway(engines: list[EngineConfig]) -> Gateway:
    """The gateway as ``conductor serve --cost-file .tiny-model/cost.toml`` builds it."""
    sched = SchedulerConfig(
        block_size_tokens=BLOCK_SIZE_TOKENS, ttft_slo_s=30.0, admission="early", cpp_enabled=False
    )
    conductor = Scheduler(profiled_cost(), policy="conductor", config=sched)
    conductor.decode_policy = ColocatedDecode(conductor.decode_policy)
    cfg = GatewayConfig(
        model_name=SERVED_MODEL_NAME,
        max_model_len=MAX_MODEL_LEN,
        block_size_tokens=BLOCK_SIZE_TOKENS,
        engines=tuple(engines),
        upstream=UpstreamConfig(connect_timeout_s=2.0, request_timeout_s=60.0),
        monitor=MonitorConfig(health_interval_s=0.5, health_timeout_s=2.0, load_interval_s=0.5),
    )
    return Gateway(cfg, conductor, HfTokenizer.load(TINY_MODEL))


@pytest.fixture(scope="module")
def agg_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VllmEngine]]:
    engines = start_engines(tmp_path_factory.mktemp("agg"), 2)
    try:
        yield engines
    finally:
        for engine in engines:
            engine.stop()


@pytest.fixture(scope="module")
def tokenizer() -> HfTokenizer:
    return HfTokenizer.load(TINY_MODEL)


def configs(engines: list[VllmEngine]) -> list[EngineConfig]:
    return [engine_config(f"vllm-{i}", e, Role.BOTH) for i, e in enumerate(engines)]


async def engine_metric(engine: VllmEngine, name: str) -> float:
    async with httpx.AsyncClient(base_url=engine.base_url) as c:
        return metric((await c.get("/metrics")).text, name)


async def test_c_index_is_built_from_the_engines_kv_events(
    agg_engines: list[VllmEngine], tokenizer: HfTokenizer
) -> None:
    gw = real_gateway(configs(agg_engines))
    prompt = "Index check. " + SHARED_PREFIX
    tokens = tokenizer.encode(prompt, add_special_tokens=True)
    hashes = request_block_hashes(tokens, BLOCK_SIZE_TOKENS)
    assert len(hashes) >= 3
    async with client_for(gw) as client:
        await eventually(lambda: all(s.healthy for s in gw.conductor.instances.values()))
        await asyncio.sleep(0.5)  # SUB sockets joined
        resp = await client.post(
            "/v1/completions",
            json={"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0},
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["prompt_tokens"] == len(tokens)
        holder = InstanceId(resp.headers["x-conductor-prefill"])
        await eventually(
            lambda: gw.conductor.index.match(hashes).local_blocks.get(holder, 0) == len(hashes),
            timeout_s=15,
        )
        match = gw.conductor.index.match(hashes)
    assert match.local_blocks == {holder: len(hashes)}
    assert match.best_holders == (holder,)


async def test_a_repeated_prefix_goes_to_the_engine_that_holds_it(
    agg_engines: list[VllmEngine],
) -> None:
    cfgs = configs(agg_engines)
    gw = real_gateway(cfgs)
    first, second = InstanceId(cfgs[0].engine_id), InstanceId(cfgs[1].engine_id)
    holder_engine = agg_engines[1]
    prefix = "Routing check. " + SHARED_PREFIX * 3
    async with client_for(gw) as client:
        await eventually(lambda: all(s.healthy for s in gw.conductor.instances.values()))
        await asyncio.sleep(0.5)
        # Warm the prefix on the *second* engine: without cache awareness, ties go first.
        gw.set_draining(first, True)
        warm = await client.post(
            "/v1/completions",
            json={"model": "tiny", "prompt": prefix + "Question zero?", "max_tokens": 2},
        )
        assert warm.status_code == 200, warm.text
        assert warm.headers["x-conductor-prefill"] == second
        gw.set_draining(first, False)
        n_prefix_blocks = len(gw.tokenizer.encode(prefix, add_special_tokens=True)) // 32
        await eventually(lambda: gw.conductor.index.count(second) >= n_prefix_blocks, 15)

        hits_before = await engine_metric(holder_engine, "vllm:prefix_cache_hits_total")
        other_before = await engine_metric(agg_engines[0], "vllm:prefix_cache_hits_total")
        served: list[str] = []
        cached: list[int] = []
        for i in range(1, 5):
            resp = await client.post(
                "/v1/completions",
                json={"model": "tiny", "prompt": prefix + f"Question {i}?", "max_tokens": 2},
            )
            assert resp.status_code == 200, resp.text
            served.append(resp.headers["x-conductor-prefill"])
            cached.append(int(resp.headers["x-conductor-cached-tokens"]))
        hits_after = await engine_metric(holder_engine, "vllm:prefix_cache_hits_total")
        other_after = await engine_metric(agg_engines[0], "vllm:prefix_cache_hits_total")
        metrics = (await client.get("/metrics")).text
    assert served == [second] * 4
    assert all(c >= n_prefix_blocks * 32 for c in cached), cached
    assert hits_after - hits_before >= 4 * n_prefix_blocks * 32
    assert other_after == other_before
    assert 'conductor_cache_hit_tokens_total{policy="conductor"}' in metrics
    assert gw.conductor.inflight() == 0


def sse_texts(body: str, chat: bool) -> tuple[list[str], list[object]]:
    texts: list[str] = []
    finishes: list[object] = []
    for event in body.split("\n\n"):
        if not event.startswith("data: {"):
            continue
        data = json.loads(event[6:])
        for choice in data.get("choices", []):
            texts.append(choice["delta"].get("content", "") if chat else choice["text"])
            finishes.append(choice.get("finish_reason"))
    return texts, finishes


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_e_streamed_output_equals_the_engines_own(
    agg_engines: list[VllmEngine], tokenizer: HfTokenizer, chat: bool
) -> None:
    gw = real_gateway(configs(agg_engines))
    by_id = {cfg.engine_id: e for cfg, e in zip(configs(agg_engines), agg_engines, strict=True)}
    messages = [{"role": "user", "content": "Alpha beta gamma, tell me about the river."}]
    body: dict[str, object] = {
        "model": "tiny",
        "max_tokens": 24,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **({"messages": messages} if chat else {"prompt": "Red green blue yellow river"}),
    }
    path = "/v1/chat/completions" if chat else "/v1/completions"
    async with client_for(gw) as client:
        await eventually(lambda: all(s.healthy for s in gw.conductor.instances.values()))
        through = await client.post(path, json=body)
        assert through.status_code == 200, through.text
        engine = by_id[through.headers["x-conductor-prefill"]]
        async with httpx.AsyncClient(base_url=engine.base_url, timeout=60) as direct:
            own = await direct.post(path, json=body)
    assert gw.conductor.inflight() == 0
    assert through.text.endswith("data: [DONE]\n\n")
    got, got_finish = sse_texts(through.text, chat)
    want, want_finish = sse_texts(own.text, chat)
    # chunk boundaries may differ (a busy API server merges tokens into one chunk); the text
    # and how it ended may not
    assert "".join(got) == "".join(want)
    assert [f for f in got_finish if f] == [f for f in want_finish if f] == ["length"]
    usage = [
        json.loads(e[6:])["usage"]
        for e in through.text.split("\n\n")
        if e.startswith("data: {") and json.loads(e[6:]).get("usage")
    ]
    assert usage and usage[-1]["completion_tokens"] == 24
    if chat:
        expected = prompt_token_ids(tokenizer, parse_chat({"model": "tiny", "messages": messages}))
        assert usage[-1]["prompt_tokens"] == len(expected)


async def test_d_killing_an_engine_under_load_loses_no_request(
    agg_engines: list[VllmEngine],
) -> None:
    cfgs = configs(agg_engines)
    gw = real_gateway(cfgs)
    ids = [InstanceId(c.engine_id) for c in cfgs]
    outcomes: list[tuple[str, str]] = []  # (outcome, engine)
    killed_at: list[int] = []

    def batch(engine_id: InstanceId) -> int:
        return gw.conductor.instances[engine_id].decode.batch_size

    async with client_for(gw) as client:
        await eventually(lambda: all(s.healthy for s in gw.conductor.instances.values()))
        limit = asyncio.Semaphore(6)

        async def one(i: int) -> None:
            stream = i % 2 == 0
            body = {
                "model": "tiny",
                "prompt": f"Load {i}: " + SHARED_PREFIX[: 120 + 7 * i],
                "max_tokens": 96,
                "ignore_eos": True,
                "temperature": 0,
                "stream": stream,
                **({"stream_options": {"include_usage": True}} if stream else {}),
            }
            async with limit:
                try:
                    async with asyncio.timeout(90):
                        resp = await client.post("/v1/completions", json=body, timeout=90)
                except TimeoutError:
                    outcomes.append(("hung", "?"))
                    return
            where = resp.headers.get("x-conductor-prefill", "?")
            if resp.status_code != 200:
                assert resp.json()["error"]["message"]
                outcomes.append(("error", where))
            elif not stream:
                assert resp.json()["usage"]["completion_tokens"] == 96
                outcomes.append(("ok", where))
            elif '"error"' in resp.text:
                assert resp.text.endswith("data: [DONE]\n\n")
                outcomes.append(("error", where))
            else:
                # chunks are not tokens (the detokenizer holds back partial characters)
                assert resp.text.endswith("data: [DONE]\n\n")
                assert '"completion_tokens":96' in resp.text.replace(" ", "")
                outcomes.append(("ok", where))

        tasks = [asyncio.create_task(one(i)) for i in range(24)]
        # the victim is whichever engine is busiest once load is flowing (routing follows
        # the caches, and a slow engine may be taken out for a while by its health checks)
        await eventually(
            lambda: len(outcomes) >= 2 and max(batch(e) for e in ids) >= 2, timeout_s=120
        )
        victim_index = 0 if batch(ids[0]) >= batch(ids[1]) else 1
        victim_id, other_id = ids[victim_index], ids[1 - victim_index]
        killed_at.append(len(outcomes))
        os.killpg(agg_engines[victim_index].proc.pid, signal.SIGKILL)
        await asyncio.gather(*tasks)
        await eventually(lambda: not gw.conductor.instances[victim_id].healthy, 10)
        metrics = (await client.get("/metrics")).text
    assert len(outcomes) == 24
    assert [o for o, _ in outcomes if o == "hung"] == []
    assert {o for o, _ in outcomes} <= {"ok", "error"}
    after_kill = outcomes[killed_at[0] :]
    assert any(o == "ok" and e == other_id for o, e in after_kill)
    assert gw.conductor.inflight() == 0
    assert f'conductor_engine_failures_total{{engine="{victim_id}"' in metrics
    # the kill hit requests in flight on the victim: each was retried elsewhere or failed
    retried = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("conductor_retries_total{")
    )
    assert retried + sum(o == "error" for o, _ in outcomes) >= 1
