"""Scheduler rejections become 429 with Retry-After (503 when no engine can serve), and
leave no bookkeeping behind."""

from __future__ import annotations

import httpx
import pytest

from conductor.core.plan import Rejection
from conductor.core.types import InstanceId, RequestId
from tests.gateway.harness import client_for, engine, make_gateway

pytestmark = pytest.mark.anyio


def transport() -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method != "POST":
            return httpx.Response(200, text="")
        return httpx.Response(200, json={"choices": [{"text": "ok"}]})

    return httpx.MockTransport(handler)


async def test_tiny_ttft_slo_rejects_with_429_and_retry_after() -> None:
    gw = make_gateway(
        [engine("e0", "http://10.0.0.1:8000")],
        ttft_slo_s=1e-6,
        admission="early",
        transport=transport(),
    )
    async with client_for(gw) as client:
        resp = await client.post(
            "/v1/completions", json={"model": "tiny", "prompt": "hello world", "max_tokens": 2}
        )
        metrics = (await client.get("/metrics")).text
    assert resp.status_code == 429
    assert resp.headers["retry-after"] == "1"
    error = resp.json()["error"]
    assert error["type"] == "rate_limit_error"
    assert error["code"] == 429
    assert error["message"].startswith("request rejected (ttft_slo): predicted TTFT ")
    assert error["message"].endswith("> SLO 0.000s on e0")
    assert 'conductor_rejections_total{reason="ttft_slo"} 1.0' in metrics
    assert 'conductor_decisions_total{outcome="rejected",policy="conductor"} 1.0' in metrics
    assert 'conductor_http_responses_total{endpoint="completions",status="429"} 1.0' in metrics
    assert gw.conductor.inflight() == 0


def test_retry_after_grows_with_the_predicted_excess() -> None:
    gw = make_gateway([engine("e0", "http://10.0.0.1:8000")], admission="early")
    rejection_ttft = gw.conductor.config.ttft_slo_s + 7.2
    err = gw.requests.rejection_error(
        Rejection(RequestId("r"), "ttft_slo", "x", rejection_ttft, None)
    )
    assert err.status == 429
    assert err.headers == {"Retry-After": "8"}
    err = gw.requests.rejection_error(Rejection(RequestId("r"), "kv_capacity", "x"))
    assert (err.status, err.headers) == (429, {"Retry-After": "1"})


async def test_no_schedulable_engine_is_503_with_retry_after() -> None:
    gw = make_gateway([engine("e0", "http://10.0.0.1:8000")], transport=transport())
    gw.conductor.set_draining(InstanceId("e0"), draining=True)
    async with client_for(gw) as client:
        resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hello"})
        health = await client.get("/health")
        ready = await client.get("/ready")
    assert resp.status_code == 503
    assert resp.headers["retry-after"] == "1"
    assert resp.json() == {
        "error": {
            "message": "request rejected (no_instance): no schedulable instance",
            "type": "service_unavailable",
            "code": 503,
        }
    }
    # liveness stays 200 (a probe must not restart a gateway that has nothing to route to);
    # readiness says it cannot route
    assert health.status_code == 200
    assert health.json() == {"status": "alive"}
    assert ready.status_code == 503
    assert ready.json() == {
        "status": "unavailable",
        "engines": 1,
        "healthy_engines": 1,
        "unhealthy": [],
        "warnings": [],
    }
