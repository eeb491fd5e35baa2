"""The admin API: bearer-token auth, list, add, drain/resume, remove."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest

from conductor.core.errors import InvalidInput
from conductor.core.types import InstanceId
from conductor.gateway.config import engine_from_mapping
from tests.gateway.harness import TOKEN, admin_headers, client_for, engine, make_gateway

pytestmark = pytest.mark.anyio


def transport(served: list[str]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method != "POST":
            return httpx.Response(200, text="")
        served.append(request.url.host)
        return httpx.Response(200, json={"choices": [{"text": "ok"}]})

    return httpx.MockTransport(handler)


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({}, 401, "missing 'Authorization: Bearer <token>' header"),
        ({"Authorization": "Basic abc"}, 401, "the Authorization header must be 'Bearer <token>'"),
        ({"Authorization": "Bearer"}, 401, "the Authorization header must be 'Bearer <token>'"),
        ({"Authorization": "Bearer wrong-token"}, 403, "invalid admin token"),
    ],
    ids=["no_header", "wrong_scheme", "empty_token", "wrong_token"],
)
async def test_admin_auth_rejects(headers: dict[str, str], status: int, message: str) -> None:
    gw = make_gateway([engine("e0", "http://10.0.0.1:8000")], transport=transport([]))
    async with client_for(gw) as client:
        calls = [
            await client.get("/admin/engines", headers=headers),
            await client.post("/admin/engines", headers=headers, json={}),
            await client.post("/admin/engines/e0/drain", headers=headers),
            await client.delete("/admin/engines/e0", headers=headers),
        ]
    for resp in calls:
        assert resp.status_code == status
        assert resp.json()["error"]["message"] == message
        if status == 401:
            assert resp.headers["www-authenticate"] == "Bearer"
    assert InstanceId("e0") in gw.conductor.instances
    assert not gw.conductor.instances[InstanceId("e0")].draining


async def test_admin_disabled_without_token() -> None:
    gw = make_gateway(
        [engine("e0", "http://10.0.0.1:8000")], transport=transport([]), admin_token=None
    )
    async with client_for(gw) as client:
        resp = await client.get("/admin/engines", headers=admin_headers())
    assert resp.status_code == 403
    assert resp.json()["error"]["message"] == (
        "the admin API is disabled; start the gateway with --admin-token"
    )


async def test_list_add_drain_resume_remove() -> None:
    served: list[str] = []
    gw = make_gateway([engine("e0", "http://10.0.0.1:8000")], transport=transport(served))
    auth = admin_headers(TOKEN)
    prompt = {"model": "tiny", "prompt": "hello world", "max_tokens": 2}
    async with client_for(gw) as client:
        listed = (await client.get("/admin/engines", headers=auth)).json()
        assert [e["id"] for e in listed["engines"]] == ["e0"]
        assert listed["engines"][0]["role"] == "both"
        assert listed["engines"][0]["healthy"] is True

        added = await client.post(
            "/admin/engines",
            headers=auth,
            json={"url": "http://10.0.0.2:8000", "role": "both", "id": "e1", "block_size": 4},
        )
        assert added.status_code == 201, added.text
        assert added.json()["id"] == "e1"
        assert InstanceId("e1") in gw.conductor.instances

        duplicate = await client.post(
            "/admin/engines",
            headers=auth,
            json={"url": "http://10.0.0.2:8000", "role": "both", "id": "e1", "block_size": 4},
        )
        assert duplicate.status_code == 409
        assert duplicate.json()["error"]["message"] == "engine 'e1' already exists"

        bad_role = await client.post(
            "/admin/engines", headers=auth, json={"url": "http://10.0.0.3:8000", "role": "x"}
        )
        assert bad_role.status_code == 400
        assert bad_role.json()["error"] == {
            "message": "invalid engine.role='x': must be one of prefill, decode, both",
            "type": "invalid_request_error",
            "param": "engine.role",
            "code": 400,
        }
        bad_block = await client.post(
            "/admin/engines",
            headers=auth,
            json={"url": "http://10.0.0.3:8000", "role": "both", "block_size": 16},
        )
        assert bad_block.status_code == 400
        assert bad_block.json()["error"]["message"] == (
            "invalid engine.block_size=16: must equal the gateway block size 4"
        )

        drained = await client.post("/admin/engines/e0/drain", headers=auth)
        assert drained.status_code == 200
        assert drained.json()["draining"] is True
        for _ in range(3):
            resp = await client.post("/v1/completions", json=prompt)
            assert resp.headers["x-conductor-prefill"] == "e1"
        assert served == ["10.0.0.2"] * 3

        resumed = await client.post("/admin/engines/e0/resume", headers=auth)
        assert resumed.json()["draining"] is False

        removed = await client.delete("/admin/engines/e1", headers=auth)
        assert removed.status_code == 200
        assert removed.json() == {"removed": "e1", "inflight_requests_on_it": 0}
        assert InstanceId("e1") not in gw.conductor.instances
        resp = await client.post("/v1/completions", json=prompt)
        assert resp.headers["x-conductor-prefill"] == "e0"

        unknown = await client.delete("/admin/engines/nope", headers=auth)
        assert unknown.status_code == 404
        assert unknown.json()["error"]["message"] == "no engine 'nope'"
        listed = (await client.get("/admin/engines", headers=auth)).json()
        assert [e["id"] for e in listed["engines"]] == ["e0"]
    assert gw.conductor.inflight() == 0


def test_an_engines_prefill_lanes_reach_the_scheduler() -> None:
    """``prefill_lanes`` (an engine that prefills prompts side by side) is the scheduler's
    ``InstanceSpec.prefill_lanes``; 1 when not given; 0 or a word is a clear error."""
    given = engine_from_mapping(
        {"url": "http://10.0.0.1:8000", "role": "prefill", "id": "e0", "prefill_lanes": "2"},
        default_block_size=16,
    )
    assert given.prefill_lanes == 2 and given.to_json()["prefill_lanes"] == 2
    lanes = replace(engine("e0", "http://10.0.0.1:8000"), prefill_lanes=given.prefill_lanes)
    gw = make_gateway([lanes, engine("e1", "http://10.0.0.2:8000")], transport=transport([]))
    assert gw.conductor.instances[InstanceId("e0")].spec.prefill_lanes == 2
    assert gw.conductor.instances[InstanceId("e1")].spec.prefill_lanes == 1
    for bad, why in ((0, "must be >= 1"), ("two", "must be an integer")):
        with pytest.raises(InvalidInput) as err:
            engine_from_mapping(
                {"url": "http://10.0.0.1:8000", "role": "prefill", "prefill_lanes": bad},
                default_block_size=16,
                where="engines[0]",
            )
        assert (err.value.field, err.value.value) == ("engines[0].prefill_lanes", bad)
        assert why in err.value.why


def test_an_engines_prefill_chunk_reaches_the_scheduler() -> None:
    """``prefill_chunk_tokens`` (its ``--long-prefill-token-threshold``) is the scheduler's
    ``InstanceSpec.prefill_chunk_tokens``; 0 (unknown) when not given; a negative count or a
    word is a clear error naming the key."""
    given = engine_from_mapping(
        {
            "url": "http://10.0.0.1:8000",
            "role": "prefill",
            "id": "e0",
            "prefill_lanes": 2,
            "prefill_chunk_tokens": "2048",
        },
        default_block_size=16,
    )
    assert given.prefill_chunk_tokens == 2048 and given.to_json()["prefill_chunk_tokens"] == 2048
    chunked = replace(
        engine("e0", "http://10.0.0.1:8000"), prefill_lanes=2, prefill_chunk_tokens=2048
    )
    gw = make_gateway([chunked, engine("e1", "http://10.0.0.2:8000")], transport=transport([]))
    assert gw.conductor.instances[InstanceId("e0")].spec.prefill_chunk_tokens == 2048
    assert gw.conductor.instances[InstanceId("e1")].spec.prefill_chunk_tokens == 0
    for bad, why in ((-1, "must be >= 0"), ("big", "must be an integer")):
        with pytest.raises(InvalidInput) as err:
            engine_from_mapping(
                {"url": "http://10.0.0.1:8000", "role": "prefill", "prefill_chunk_tokens": bad},
                default_block_size=16,
                where="engines[0]",
            )
        assert (err.value.field, err.value.value) == ("engines[0].prefill_chunk_tokens", bad)
        assert why in err.value.why


def test_an_engines_kv_capacity_sizes_its_prefix_cache_for_the_scheduler() -> None:
    """``max_blocks`` (the engine's KV capacity) x its block size: the cache size conductor
    prices evictions with; unknown without it."""
    sized = replace(engine("e0", "http://10.0.0.1:8000"), max_blocks=1000)
    gw = make_gateway([sized, engine("e1", "http://10.0.0.2:8000")], transport=transport([]))
    spec = gw.conductor.instances[InstanceId("e0")].spec
    assert spec.cache_capacity_tokens == 1000 * sized.block_size_tokens
    assert gw.conductor.instances[InstanceId("e1")].spec.cache_capacity_tokens is None
