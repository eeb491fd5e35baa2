"""The gateway against hostile or unlucky input: client templates refused, deep JSON and
absurd ``n`` answered 400, admin URLs that are not URLs 400, a stream that dies before its
first byte retried elsewhere, a slow engine failing one request without being marked dead,
/health (alive) against /ready (can route), a silent KV publisher reported."""

from __future__ import annotations

import pytest

from conductor.core.types import InstanceId
from conductor.gateway.config import MonitorConfig, UpstreamConfig
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import (
    admin_headers,
    client_for,
    engine,
    eventually,
    make_gateway,
    serve,
)

pytestmark = pytest.mark.anyio
PROMPT = {"model": "tiny", "prompt": "hello world, again", "max_tokens": 3}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def err(message: str, param: str | None = None) -> dict[str, object]:
    body: dict[str, object] = {"message": message, "type": "invalid_request_error"}
    if param is not None:
        body["param"] = param
    body["code"] = 400
    return {"error": body}


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        (
            "/v1/chat/completions",
            {**CHAT, "chat_template_kwargs": {"chat_template": "{% for i in range(9**9) %}"}},
            err(
                "'chat_template_kwargs.chat_template' is not accepted; allowed: "
                "enable_thinking, thinking, reasoning_effort",
                "chat_template_kwargs.chat_template",
            ),
        ),
        (
            "/v1/chat/completions",
            {**CHAT, "chat_template": "{{ 7 * 7 }}"},
            err(
                "'chat_template' is not accepted: the model's own template is used",
                "chat_template",
            ),
        ),
        ("/v1/completions", {**PROMPT, "n": 10**9}, err("'n' must be <= 16, got 1000000000", "n")),
    ],
    ids=["template-kwarg", "template", "huge-n"],
)
async def test_refused_bodies_get_exact_400s(
    path: str, body: dict[str, object], expected: dict[str, object]
) -> None:
    fake = FakeEngine("a")
    async with serve(fake.app()) as url:
        gw = make_gateway([engine("a", url)])
        async with client_for(gw) as client:
            resp = await client.post(path, json=body)
            ok = await client.post(
                "/v1/chat/completions", json={**CHAT, "chat_template_kwargs": {"thinking": True}}
            )
    assert (resp.status_code, resp.json()) == (400, expected)
    assert ok.status_code == 200
    assert len(fake.requests) == 1


@pytest.mark.parametrize("path", ["/v1/completions", "/admin/engines"])
async def test_deep_json_is_400_with_one_parse(path: str) -> None:
    gw = make_gateway([engine("a", "http://10.0.0.1:8000")])
    async with client_for(gw) as client:
        deep = b"[" * 30_000 + b"]" * 30_000  # (the harness allows 64 KiB bodies)
        resp = await client.post(path, content=deep, headers=admin_headers())
        health = await client.get("/health")
    assert (resp.status_code, resp.json()) == (
        400,
        err("request body nests deeper than 64 levels (max_json_depth)"),
    )
    assert health.status_code == 200


async def test_admin_engine_with_a_non_numeric_port_is_400() -> None:
    gw = make_gateway([engine("a", "http://10.0.0.1:8000")])
    body = {"url": "http://10.0.0.9:8000", "role": "both", "kv_events": "tcp://h:notaport"}
    async with client_for(gw) as client:
        resp = await client.post("/admin/engines", json=body, headers=admin_headers())
    assert (resp.status_code, resp.json()) == (
        400,
        err(
            "invalid engine.kv_events='tcp://h:notaport': must look like tcp://host:port "
            "or ipc://path",
            "engine.kv_events",
        ),
    )


async def test_a_stream_dying_before_its_first_byte_is_retried_elsewhere() -> None:
    dying, fine = FakeEngine("a", break_after=0), FakeEngine("b")
    async with serve(dying.app()) as a_url, serve(fine.app()) as b_url:
        gw = make_gateway([engine("a", a_url), engine("b", b_url)])
        gw.conductor.set_draining(InstanceId("b"), draining=True)  # "a" is tried first
        async with client_for(gw) as client:
            await eventually(lambda: gw.conductor.instances[InstanceId("a")].healthy)
            first = client.post("/v1/completions", json={**PROMPT, "stream": True})
            gw.conductor.set_draining(InstanceId("b"), draining=False)
            resp = await first
            metrics = (await client.get("/metrics")).text
    assert resp.status_code == 200
    assert '"served_by": "b"' in resp.text
    assert resp.text.endswith("data: [DONE]\n\n")
    assert resp.headers["x-conductor-request-id"].endswith("-retry1")
    assert (len(dying.requests), len(fine.requests)) == (1, 1)
    assert 'conductor_requests_finished_total{outcome="retried"} 1.0' in metrics
    assert gw.conductor.inflight() == 0


async def test_a_slow_engine_fails_that_request_only() -> None:
    fake = FakeEngine("a", hang=True)
    async with serve(fake.app()) as url:
        gw = make_gateway(
            [engine("a", url)],
            upstream=UpstreamConfig(read_timeout_s=0.3, request_timeout_s=20.0, max_attempts=3),
        )
        async with client_for(gw) as client:
            resp = await client.post("/v1/completions", json=PROMPT)
            ready = await client.get("/ready")
    assert resp.status_code == 504
    assert resp.json()["error"]["message"] == "engine a sent nothing within 0.3 s (read_timeout_s)"
    assert len(fake.requests) == 1  # not retried: slow is not dead
    assert gw.conductor.instances[InstanceId("a")].healthy
    assert ready.status_code == 200
    assert gw.conductor.inflight() == 0


async def test_health_is_liveness_and_ready_says_why_it_cannot_route() -> None:
    fake = FakeEngine("a", health_status=503)
    async with serve(fake.app()) as url:
        gw = make_gateway([engine("a", url)])
        async with client_for(gw) as client:
            await eventually(lambda: not gw.conductor.instances[InstanceId("a")].healthy)
            health = await client.get("/health")
            ready = await client.get("/ready")
    assert (health.status_code, health.json()) == (200, {"status": "alive"})
    assert (ready.status_code, ready.json()) == (
        503,
        {
            "status": "unavailable",
            "engines": 1,
            "healthy_engines": 0,
            "unhealthy": ["a"],
            "warnings": [],
        },
    )


async def test_an_engine_serving_traffic_without_kv_events_is_reported() -> None:
    fake = FakeEngine("a")
    async with serve(fake.app()) as url:
        # nothing publishes on this endpoint: a publisher that connects instead of binding
        gw = make_gateway(
            [engine("a", url, kv_events="tcp://127.0.0.1:9")],
            monitor=MonitorConfig(
                health_interval_s=0.1, load_interval_s=0.2, kv_silent_after_requests=2
            ),
        )
        async with client_for(gw) as client:
            for _ in range(2):
                assert (await client.post("/v1/completions", json=PROMPT)).status_code == 200
            await eventually(lambda: gw.handle("a").kv_silent)
            ready = (await client.get("/ready")).json()
            metrics = (await client.get("/metrics")).text
    assert ready["warnings"] == ["engine a served traffic but sent no KV events"]
    assert 'conductor_engine_kv_silent{engine="a",role="both"} 1.0' in metrics
