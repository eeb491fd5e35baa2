"""Streaming relay, client-disconnect bookkeeping, the disaggregated (P/D) flow, and the
metrics the gateway exposes."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from conductor.core.events import RequestFinished
from conductor.core.types import InstanceId, Request, RequestId, Role
from conductor.gateway.config import UpstreamConfig
from conductor.gateway.flight import StreamTokens, completion_tokens
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import client_for, engine, eventually, make_gateway, serve

pytestmark = pytest.mark.anyio
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "tell me about caches"}]}


async def test_stream_is_relayed_byte_for_byte_and_bookkept() -> None:
    fake = FakeEngine("a", tokens=["The", " cache", " holds", " blocks"])
    body = {**CHAT, "stream": True, "max_tokens": 4, "stream_options": {"include_usage": True}}
    async with serve(fake.app()) as url:
        async with httpx.AsyncClient(base_url=url) as direct:
            expected = (await direct.post("/v1/chat/completions", json=body)).content
        gw = make_gateway([engine("a", url)])
        async with client_for(gw) as client:
            resp = await client.post("/v1/chat/completions", json=body)
            metrics = (await client.get("/metrics")).text
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.headers["x-conductor-mode"] == "aggregated"
    assert resp.content == expected
    assert json.loads(resp.text.split("\n\n")[4][6:])["usage"]["completion_tokens"] == 4
    assert fake.requests[-1] == {**body, "model": "tiny"}
    assert 'conductor_observed_ttft_seconds_count{mode="aggregated",policy="conductor"} 1.0' in (
        metrics
    )
    assert 'conductor_requests_finished_total{outcome="completed"} 1.0' in metrics
    assert 'conductor_observed_tbt_seconds_count{policy="conductor"} 1.0' in metrics
    assert gw.conductor.inflight() == 0
    state = gw.conductor.instances[InstanceId("a")]
    assert (state.prefill.queued_requests, state.decode.batch_size) == (0, 0)


async def test_client_disconnect_mid_stream_cancels_bookkeeping_and_upstream() -> None:
    fake = FakeEngine("a", tokens=[f" t{i}" for i in range(50)], chunk_delay_s=0.1)
    async with serve(fake.app()) as url:
        gw = make_gateway([engine("a", url)])
        async with client_for(gw) as client:
            body = {**CHAT, "stream": True, "max_tokens": 50}
            async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
                assert resp.status_code == 200
                async for _chunk in resp.aiter_raw():
                    break  # the first token arrived; now hang up
            assert gw.conductor.inflight() in (0, 1)
            await eventually(lambda: gw.conductor.inflight() == 0)
            await eventually(lambda: fake.disconnects == 1)
            metrics = (await client.get("/metrics")).text
    assert fake.completed_streams == 0
    assert 'conductor_requests_finished_total{outcome="client_disconnect"} 1.0' in metrics
    state = gw.conductor.instances[InstanceId("a")]
    assert (state.prefill.queued_requests, state.decode.batch_size) == (0, 0)


async def test_client_gone_before_the_first_byte_is_still_bookkept() -> None:
    fake = FakeEngine("a", tokens=[" slow"] * 5, chunk_delay_s=0.5)
    async with serve(fake.app()) as url:
        gw = make_gateway([engine("a", url)])
        async with client_for(gw) as client:
            body = {**CHAT, "stream": True}
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/v1/chat/completions", json=body, timeout=0.2)
            await eventually(lambda: gw.conductor.inflight() == 0)
            await eventually(lambda: fake.disconnects == 1)


async def test_client_gone_from_a_non_streamed_request_aborts_the_engine_call() -> None:
    fake = FakeEngine("a", hang=True)
    async with serve(fake.app()) as url:
        gw = make_gateway([engine("a", url)])
        async with client_for(gw) as client:
            body = {"model": "tiny", "prompt": "abc", "max_tokens": 2}
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/v1/completions", json=body, timeout=0.3)
            await eventually(lambda: gw.conductor.inflight() == 0)
            await eventually(lambda: fake.disconnects == 1)  # the engine saw the call end
            metrics = (await client.get("/metrics")).text
    assert 'conductor_requests_finished_total{outcome="client_disconnect"} 1.0' in metrics
    assert 'conductor_http_responses_total{endpoint="completions",status="499"} 1.0' in metrics


async def test_non_streamed_aggregated_request_releases_its_prefill_at_the_predicted_time() -> None:
    fake = FakeEngine("a", hang=False, chunk_delay_s=0.0)
    async with serve(fake.app()) as url:
        gw = make_gateway([engine("a", url)])
        async with client_for(gw) as client:
            resp = await client.post(
                "/v1/completions", json={"model": "tiny", "prompt": "abc", "max_tokens": 2}
            )
    assert resp.status_code == 200
    assert resp.json()["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    assert gw.conductor.inflight() == 0


@pytest.mark.parametrize("kv_params", [False, True], ids=["example_connector", "nixl_style"])
async def test_disaggregated_flow_prefills_one_token_then_streams_from_decode(
    kv_params: bool,
) -> None:
    returned = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_engine_id": "p"}
    prefill = FakeEngine("p", kv_transfer_params=returned if kv_params else None)
    decode = FakeEngine("d", tokens=["Hi", " there"])
    body = {**CHAT, "stream": True, "max_tokens": 2, "stream_options": {"include_usage": True}}
    async with serve(prefill.app()) as p_url, serve(decode.app()) as d_url:
        gw = make_gateway(
            [engine("p", p_url, Role.PREFILL), engine("d", d_url, Role.DECODE)],
            upstream=UpstreamConfig(kv_transfer_params=kv_params),
        )
        async with client_for(gw) as client:
            resp = await client.post("/v1/chat/completions", json=body)
            metrics = (await client.get("/metrics")).text
    assert resp.status_code == 200
    assert resp.headers["x-conductor-mode"] == "disaggregated"
    assert (resp.headers["x-conductor-prefill"], resp.headers["x-conductor-decode"]) == ("p", "d")
    texts = [
        json.loads(e[6:])["choices"][0]["delta"]["content"]
        for e in resp.text.split("\n\n")
        if e.startswith("data: {") and json.loads(e[6:])["choices"]
    ]
    assert texts == ["Hi", " there"]
    leg = {**CHAT, "model": "tiny", "max_tokens": 1, "stream": False}
    if kv_params:
        leg["kv_transfer_params"] = {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        }
    assert prefill.requests == [leg]
    expected_decode: dict[str, object] = {**body, "model": "tiny"}
    if kv_params:
        expected_decode["kv_transfer_params"] = returned
    assert decode.requests == [expected_decode]
    assert 'conductor_observed_prefill_seconds_count{policy="conductor"} 1.0' in metrics
    assert (
        'conductor_observed_ttft_seconds_count{mode="disaggregated",policy="conductor"} 1.0'
        in metrics
    )
    assert gw.conductor.inflight() == 0


async def test_prefill_leg_error_is_returned_and_decode_never_called() -> None:
    prefill = FakeEngine("p", status=400)
    decode = FakeEngine("d")
    async with serve(prefill.app()) as p_url, serve(decode.app()) as d_url:
        gw = make_gateway([engine("p", p_url, Role.PREFILL), engine("d", d_url, Role.DECODE)])
        async with client_for(gw) as client:
            resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == "p refuses"
    assert decode.requests == []
    assert gw.conductor.inflight() == 0


async def test_metrics_exposition_names() -> None:
    fake = FakeEngine("a")
    async with serve(fake.app()) as url:
        gw = make_gateway([engine("a", url)], ttft_slo_s=30.0)
        async with client_for(gw) as client:
            await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
            await client.post("/v1/completions", json={"model": "tiny", "prompt": "x" * 40})
            resp = await client.get("/metrics")
    assert resp.headers["content-type"].startswith("text/plain")
    names = {line.split(" ")[2] for line in resp.text.splitlines() if line.startswith("# TYPE ")}
    for name in (
        "conductor_decisions_total",
        "conductor_decision_latency_seconds",
        "conductor_predicted_ttft_seconds",
        "conductor_observed_ttft_seconds",
        "conductor_observed_tbt_seconds",
        "conductor_observed_prefill_seconds",
        "conductor_cache_hit_tokens_total",
        "conductor_prompt_tokens_total",
        "conductor_rejections_total",
        "conductor_http_responses_total",
        "conductor_requests_finished_total",
        "conductor_retries_total",
        "conductor_engine_failures_total",
        "conductor_kv_event_lag_seconds",
        "conductor_kv_events_total",
        "conductor_kv_resyncs_total",
        "conductor_load_polls_total",
        "conductor_engine_queued_requests",
        "conductor_engine_queued_prefill_tokens",
        "conductor_engine_running_requests",
        "conductor_engine_kv_reserved_tokens",
        "conductor_engine_reported_waiting_requests",
        "conductor_engine_reported_running_requests",
        "conductor_engine_reported_kv_usage_ratio",
        "conductor_engine_healthy",
        "conductor_engine_draining",
        "conductor_engine_indexed_blocks",
        "conductor_kv_event_queue_depth",
        "conductor_kv_event_needs_resync",
        "conductor_kv_event_drops_total",
        "conductor_inflight_requests",
    ):
        assert name in names, name
    assert 'conductor_decisions_total{outcome="accepted",policy="conductor"} 2.0' in resp.text
    assert 'conductor_engine_queued_requests{engine="a",role="both"} 0.0' in resp.text
    assert "conductor_inflight_requests 0.0" in resp.text


async def test_concurrent_requests_all_finish() -> None:
    fakes = [FakeEngine(f"e{i}", chunk_delay_s=0.01) for i in range(2)]
    async with serve(fakes[0].app()) as u0, serve(fakes[1].app()) as u1:
        gw = make_gateway([engine("e0", u0), engine("e1", u1)])
        async with client_for(gw) as client:

            async def one(i: int) -> int:
                body = {"model": "tiny", "prompt": f"request {i} " * 5, "stream": i % 2 == 0}
                return (await client.post("/v1/completions", json=body)).status_code

            codes = await asyncio.gather(*(one(i) for i in range(40)))
    assert codes == [200] * 40
    assert len(fakes[0].requests) + len(fakes[1].requests) == 40
    assert fakes[0].requests and fakes[1].requests  # load was spread
    assert gw.conductor.inflight() == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_the_scheduler_learns_the_real_completion_length(stream: bool) -> None:
    """RequestFinished carries what the engine generated (its usage, or the streamed
    events), and the output-length predictor learns it: prior 256 x 4, then 3 tokens."""
    fake = FakeEngine("a", tokens=["The", " cache", " holds", " blocks"])
    body = {**CHAT, "max_tokens": 3, "stream": stream}
    async with serve(fake.app()) as url:
        gw = make_gateway([engine("a", url)])
        finished: list[int | None] = []
        on_event = gw.conductor.on_event

        def spy(event: object) -> None:
            if isinstance(event, RequestFinished):
                finished.append(event.output_tokens)
            on_event(event)  # type: ignore[arg-type]

        gw.conductor.on_event = spy  # type: ignore[method-assign]
        async with client_for(gw) as client:
            resp = await client.post("/v1/chat/completions", json=body)
            assert resp.status_code == 200
            await eventually(lambda: gw.conductor.inflight() == 0)
    assert finished == [3]
    assert gw.conductor.lengths.estimate(  # type: ignore[attr-defined]
        Request(RequestId("x"), 5, ()), 10_000
    ).mean == pytest.approx((4 * 256 + 3) / 5)


def test_stream_token_count_prefers_usage() -> None:
    counted = StreamTokens()
    two = b'data: {"choices": [{"text": "a"}]}\n\ndata: {"choices": [{"text": "b"}]}\n\n'
    assert counted.feed(two) == 2
    assert counted.tokens == 2
    end = b'data: {"choices": [], "usage": {"completion_tokens": 7}}\n\ndata: [DONE]\n\n'
    assert counted.feed(end) == 0  # no token in it: no gap for the TBT either
    assert counted.tokens == 7
    last = b'data: {"choices":[{"text":"c"}],"usage":{"completion_tokens":8}}\n\n'
    assert counted.feed(last) == 1
    assert counted.tokens == 8
    assert completion_tokens(b'{"usage": {"completion_tokens": 5}}') == 5
    assert completion_tokens(b"not json") is None
