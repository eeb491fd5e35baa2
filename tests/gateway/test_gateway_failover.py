"""Failover: engines that do not start a request are skipped and the request is scheduled
again; broken streams end with a clean error event; hangs time out; health and load
monitors update the scheduler's view. No accepted request is left in flight."""

from __future__ import annotations

import json

import httpx
import pytest

from conductor.core.events import BlocksStored
from conductor.core.hashing import hash_blocks
from conductor.core.types import InstanceId
from conductor.gateway.config import UpstreamConfig
from conductor.gateway.engines.kind import ReportedLoad
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import (
    admin_headers,
    client_for,
    closed_port_url,
    engine,
    eventually,
    make_gateway,
    serve,
)

pytestmark = pytest.mark.anyio
PROMPT = {"model": "tiny", "prompt": "hello world, again", "max_tokens": 3}


def refusing(refuse: set[str], served: list[str]) -> httpx.MockTransport:
    """Health checks pass everywhere; generation calls to hosts in ``refuse`` fail to
    connect."""

    def handler(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if request.method != "POST":
            return httpx.Response(200, text="")
        if host in refuse:
            raise httpx.ConnectError("connection refused", request=request)
        served.append(host)
        return httpx.Response(200, json={"choices": [{"text": "ok"}], "served_by": host})

    return httpx.MockTransport(handler)


async def test_refused_connection_is_retried_on_another_engine() -> None:
    served: list[str] = []
    gw = make_gateway(
        [engine("a", "http://10.0.0.1:8000"), engine("b", "http://10.0.0.2:8000")],
        transport=refusing({"10.0.0.1"}, served),
    )
    async with client_for(gw) as client:
        resp = await client.post("/v1/completions", json=PROMPT)
        metrics = (await client.get("/metrics")).text
    assert resp.status_code == 200, resp.text
    assert resp.json()["served_by"] == "10.0.0.2"
    assert resp.headers["x-conductor-prefill"] == "b"
    assert resp.headers["x-conductor-request-id"].endswith("-retry1")
    assert served == ["10.0.0.2"]
    # "a" was marked unhealthy (its /health answers, so the health loop brings it back)
    assert 'conductor_retries_total{reason="connect_error"} 1.0' in metrics
    assert 'conductor_requests_finished_total{outcome="retried"} 1.0' in metrics
    assert 'conductor_requests_finished_total{outcome="completed"} 1.0' in metrics
    assert 'conductor_engine_failures_total{engine="a",reason="request"} 1.0' in metrics
    assert gw.conductor.inflight() == 0


async def test_refused_real_port_is_retried_over_real_http() -> None:
    fake = FakeEngine("b")
    async with serve(fake.app()) as b_url:
        gw = make_gateway([engine("a", closed_port_url()), engine("b", b_url)])
        async with client_for(gw) as client:
            # the first health round marks "a" down; pretend it looked fine a moment ago
            await eventually(lambda: not gw.conductor.instances[InstanceId("a")].healthy)
            gw.conductor.set_health(InstanceId("a"), healthy=True)
            resp = await client.post("/v1/completions", json=PROMPT)
    assert resp.status_code == 200, resp.text
    assert resp.json()["served_by"] == "b"
    assert len(fake.requests) == 1
    assert gw.conductor.inflight() == 0


async def test_every_engine_refusing_gives_503_naming_the_failures() -> None:
    gw = make_gateway(
        [engine("a", "http://10.0.0.1:8000"), engine("b", "http://10.0.0.2:8000")],
        transport=refusing({"10.0.0.1", "10.0.0.2"}, []),
    )
    async with client_for(gw) as client:
        resp = await client.post("/v1/completions", json=PROMPT)
    assert resp.status_code == 503
    assert resp.headers["retry-after"] == "1"
    message = resp.json()["error"]["message"]
    assert message.startswith("no engine could start the request: engine a did not start")
    assert "engine b did not start the request: connect_error" in message
    assert gw.conductor.inflight() == 0


async def test_stream_broken_midway_ends_with_an_sse_error_event() -> None:
    fake = FakeEngine("a", tokens=["one", " two", " three", " four"], break_after=2)
    async with serve(fake.app()) as url:
        gw = make_gateway([engine("a", url)])
        async with client_for(gw) as client:
            body = {**PROMPT, "stream": True, "max_tokens": 4}
            resp = await client.post("/v1/completions", json=body)
            metrics = (await client.get("/metrics")).text
    assert resp.status_code == 200
    events = [e for e in resp.text.split("\n\n") if e]
    assert [json.loads(e[6:])["choices"][0]["text"] for e in events[:2]] == ["one", " two"]
    error = json.loads(events[2].removeprefix("data: "))
    assert error["error"]["type"] == "upstream_error"
    assert error["error"]["code"] == 502
    assert error["error"]["message"].startswith("the engine failed mid-stream")
    assert events[3] == "data: [DONE]"
    assert len(events) == 4
    assert len(fake.requests) == 1  # a started request is not retried
    assert 'conductor_requests_finished_total{outcome="upstream_error"} 1.0' in metrics
    assert gw.conductor.inflight() == 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_hanging_engine_times_out_with_504(stream: bool) -> None:
    fake = FakeEngine("a", hang=True)
    async with serve(fake.app()) as url:
        gw = make_gateway(
            [engine("a", url)],
            upstream=UpstreamConfig(request_timeout_s=0.5, read_timeout_s=30.0, max_attempts=3),
        )
        async with client_for(gw) as client:
            resp = await client.post("/v1/completions", json={**PROMPT, "stream": stream})
    assert resp.status_code == 504
    assert resp.json() == {
        "error": {
            "message": "no answer within 0.5 s",
            "type": "upstream_timeout",
            "code": 504,
        }
    }
    assert len(fake.requests) == 1
    assert gw.conductor.inflight() == 0


async def test_engine_error_status_is_passed_through_and_not_retried() -> None:
    fake = FakeEngine("a", status=400)
    async with serve(fake.app()) as url:
        gw = make_gateway([engine("a", url)])
        async with client_for(gw) as client:
            resp = await client.post("/v1/completions", json=PROMPT)
    assert resp.status_code == 400
    assert resp.json() == {"error": {"message": "a refuses", "type": "BadRequestError"}}
    assert len(fake.requests) == 1
    assert gw.conductor.inflight() == 0
    assert gw.conductor.instances[InstanceId("a")].healthy


async def test_failed_health_check_takes_engine_and_its_blocks_out_until_it_recovers() -> None:
    fake = FakeEngine("a")
    async with serve(fake.app()) as url:
        gw = make_gateway([engine("a", url), engine("b", "http://127.0.0.1:9")])
        a = InstanceId("a")
        hashes = tuple(hash_blocks(list(range(16)), 4))
        async with client_for(gw):
            await eventually(lambda: gw.conductor.instances[a].healthy)
            gw.conductor.on_event(BlocksStored(a, hashes))
            assert gw.conductor.index.count(a) == 4
            fake.health_status = 503
            await eventually(lambda: not gw.conductor.instances[a].healthy)
            assert gw.conductor.index.count(a) == 0
            fake.health_status = 200
            await eventually(lambda: gw.conductor.instances[a].healthy)


async def test_engine_metrics_are_polled_into_reported_load() -> None:
    fake = FakeEngine("a", running=3, waiting=2, kv_usage=0.25)
    async with serve(fake.app()) as url:
        gw = make_gateway([engine("a", url)])
        handle = gw.handle("a")
        async with client_for(gw) as client:
            await eventually(lambda: handle.load.running == 3)
            assert handle.load == ReportedLoad(running=3, waiting=2, kv_usage=0.25)
            # the scheduler placed nothing there: the 2 waiting requests become queued time
            a = gw.conductor.instances[InstanceId("a")]
            await eventually(lambda: a.prefill.queue_s(gw.clock()) > 0)
            metrics = (await client.get("/metrics")).text
            listed = (await client.get("/admin/engines", headers=admin_headers())).json()
    assert 'conductor_engine_reported_running_requests{engine="a",role="both"} 3.0' in metrics
    assert 'conductor_engine_reported_waiting_requests{engine="a",role="both"} 2.0' in metrics
    assert 'conductor_engine_reported_kv_usage_ratio{engine="a",role="both"} 0.25' in metrics
    (a,) = listed["engines"]
    assert (a["reported_running"], a["reported_waiting"], a["reported_kv_usage"]) == (3, 2, 0.25)
