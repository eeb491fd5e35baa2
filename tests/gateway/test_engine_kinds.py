"""Engine kinds: the registry, the ``kind`` field of an engine (checked once, named in the
error on every way in), and the vLLM kind's prefill/decode legs."""

from __future__ import annotations

import json

import pytest

from conductor.core.errors import InvalidInput
from conductor.core.types import Role
from conductor.gateway.config import EngineConfig, engine_from_mapping
from conductor.gateway.engines.registry import DEFAULT_KIND, KINDS, check_kind, engine_kind
from conductor.gateway.engines.vllm import KV_TRANSFER_PARAMS_PREFILL, VllmKind
from tests.gateway.harness import admin_headers, client_for, engine, make_gateway

URL = "http://10.0.0.1:8000"
WHY = "unknown engine kind; known: vllm"


def test_registry_holds_vllm_by_name() -> None:
    assert DEFAULT_KIND == "vllm"
    assert sorted(KINDS) == ["vllm"]
    assert isinstance(engine_kind("vllm"), VllmKind)
    assert engine_kind("vllm").name == "vllm"
    assert check_kind("vllm") == "vllm"


def test_unknown_kind_is_invalid_input_naming_the_field() -> None:
    with pytest.raises(InvalidInput) as err:
        check_kind("sglang")
    assert (err.value.field, err.value.value, err.value.why) == ("kind", "sglang", WHY)
    with pytest.raises(InvalidInput) as err:
        engine_kind("trt")
    assert (err.value.field, err.value.value) == ("kind", "trt")


def test_engine_config_kind_defaults_to_vllm_and_is_checked() -> None:
    assert EngineConfig("e", URL, Role.BOTH).kind == "vllm"
    with pytest.raises(InvalidInput) as err:
        EngineConfig("e", URL, Role.BOTH, kind="sglang")
    assert (err.value.field, err.value.value, err.value.why) == ("kind", "sglang", WHY)
    assert str(err.value) == f"invalid kind='sglang': {WHY}"


def test_engine_from_mapping_reads_kind_and_prefixes_the_field() -> None:
    given = engine_from_mapping(
        {"url": URL, "role": "both", "kind": "vllm"}, default_block_size=16, where="engines[0]"
    )
    assert given.kind == "vllm"
    assert given.to_json()["kind"] == "vllm"
    absent = engine_from_mapping({"url": URL, "role": "both"}, default_block_size=16)
    assert absent.kind == "vllm"
    with pytest.raises(InvalidInput) as err:
        engine_from_mapping(
            {"url": URL, "role": "both", "kind": "sglang"},
            default_block_size=16,
            where="engines[2]",
        )
    assert (err.value.field, err.value.value) == ("engines[2].kind", "sglang")
    with pytest.raises(InvalidInput) as err:
        engine_from_mapping({"url": URL, "role": "both", "kind": 3}, default_block_size=16)
    assert (err.value.field, err.value.why) == ("engine.kind", "must be a string")


@pytest.mark.anyio
async def test_admin_add_with_unknown_kind_is_400_naming_kind() -> None:
    gw = make_gateway([engine("e0", URL)])
    async with client_for(gw) as client:
        body = {"id": "e1", "url": "http://10.0.0.2:8000", "role": "both", "kind": "sglang"}
        resp = await client.post("/admin/engines", headers=admin_headers(), json=body)
        listed = (await client.get("/admin/engines", headers=admin_headers())).json()
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["param"] == "engine.kind"
    assert error["message"] == f"invalid engine.kind='sglang': {WHY}"
    assert [e["kind"] for e in listed["engines"]] == ["vllm"]


def test_vllm_legs_with_and_without_transfer_params() -> None:
    kind = VllmKind()
    body = {"model": "m", "prompt": "hi", "max_tokens": 9, "stream": True, "n": 2}
    plain = kind.prefill_body(body, "up", transfer_params=False)
    assert plain == {"model": "up", "prompt": "hi", "max_tokens": 1, "stream": False}
    nixl = kind.prefill_body(body, "up", transfer_params=True)
    assert nixl["kv_transfer_params"] == dict(KV_TRANSFER_PARAMS_PREFILL)
    answer = json.dumps({"kv_transfer_params": {"remote_engine_id": "x"}}).encode()
    assert kind.decode_body(body, "dn", answer, transfer_params=True) == {
        **body,
        "model": "dn",
        "kv_transfer_params": {"remote_engine_id": "x"},
    }
    assert kind.decode_body(body, "dn", answer, transfer_params=False) == {**body, "model": "dn"}
    assert kind.decode_body(body, "dn", b"not json", transfer_params=True) == {
        **body,
        "model": "dn",
    }
