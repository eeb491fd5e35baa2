"""Several models behind one gateway, over emulated engines (``conductor emulate``'s
emulator, real HTTP): routing by ``model``, one scheduler per pool, isolation when one
pool's engines die, per-model metrics, engines serving another model than their config
says, and the admin API's pools."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import replace

import pytest

from conductor.core.errors import InvalidInput
from conductor.core.plan import Rejection
from conductor.core.types import BlockHash, Request, RequestId
from conductor.emulator.config import EmulatorConfig
from conductor.gateway.config import GatewayConfig
from conductor.gateway.model_config import ModelConfig
from conductor.gateway.service import Gateway
from tests.emulator.helpers import EmulatorThread, running_emulator
from tests.gateway.harness import (
    BLOCK,
    FakeTokenizer,
    admin_headers,
    client_for,
    closed_port_url,
    engine,
    eventually,
    make_gateway,
    make_models_gateway,
)

pytestmark = pytest.mark.anyio
COMPLETIONS = "/v1/completions"
ALPHA = ModelConfig("alpha", max_model_len=256, block_size_tokens=BLOCK)
BETA = ModelConfig("beta", max_model_len=64, block_size_tokens=BLOCK)


class DoubleTokenizer(FakeTokenizer):
    """Two tokens per character: another model's tokenizer."""

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        ids = super().encode(text, add_special_tokens=False)
        doubled = [t for i in ids for t in (i, i + 1)]
        return [1, *doubled] if add_special_tokens else doubled


@contextlib.contextmanager
def emulators(models: Sequence[str]) -> Iterator[list[EmulatorThread]]:
    """One instant emulator per entry of ``models``, serving that model name."""
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(
                running_emulator(
                    EmulatorConfig(instant=True, model_name=name, max_model_len=4096),
                    kv_events=False,
                )
            )
            for name in models
        ]


def two_pools(ems: list[EmulatorThread], *, beta_engine_model: str = "beta") -> Gateway:
    """alpha on engines a0, a1; beta on b0 (configured as ``beta_engine_model``)."""
    a0, a1, b0 = ems
    return make_models_gateway(
        [(ALPHA, FakeTokenizer()), (BETA, DoubleTokenizer())],
        [
            engine("a0", a0.base_url, model="alpha"),
            engine("a1", a1.base_url, model="alpha"),
            engine("b0", b0.base_url, model=beta_engine_model),
        ],
    )


def body(model: str, prompt: str = "hello there", **extra: object) -> dict[str, object]:
    return {"model": model, "prompt": prompt, "max_tokens": 2, **extra}


async def test_requests_go_to_their_model_pool_with_its_own_scheduler() -> None:
    with emulators(["alpha", "alpha", "beta"]) as ems:
        gw = two_pools(ems)
        alpha, beta = gw.pools.get("alpha"), gw.pools.get("beta")
        async with client_for(gw) as client:
            answers = [
                await client.post(COMPLETIONS, json=body(m, f"prompt {i} for {m}"))
                for i, m in enumerate(["alpha", "beta", "alpha", "alpha", "beta"])
            ]
            models = (await client.get("/v1/models")).json()
    for resp in answers:
        assert resp.status_code == 200, resp.text
    placed = [(r.json()["model"], r.headers["x-conductor-prefill"]) for r in answers]
    assert [m for m, _ in placed] == ["alpha", "beta", "alpha", "alpha", "beta"]
    assert {e for m, e in placed if m == "alpha"} <= {"a0", "a1"}
    assert {e for m, e in placed if m == "beta"} == {"b0"}
    assert alpha.conductor is not beta.conductor
    assert sorted(alpha.conductor.instances) == ["a0", "a1"]
    assert sorted(beta.conductor.instances) == ["b0"]
    assert [(m["id"], m["max_model_len"]) for m in models["data"]] == [
        ("alpha", 256),
        ("beta", 64),
    ]
    assert alpha.conductor.inflight() == beta.conductor.inflight() == 0


async def test_each_pool_tokenizes_and_bounds_with_its_own_model() -> None:
    """The same 40-character prompt: 41 tokens for alpha, 81 for beta (whose tokenizer
    doubles), over beta's max_model_len of 64."""
    with emulators(["alpha", "alpha", "beta"]) as ems:
        gw = two_pools(ems)
        async with client_for(gw) as client:
            ok = await client.post(COMPLETIONS, json=body("alpha", "x" * 40))
            too_long = await client.post(COMPLETIONS, json=body("beta", "x" * 40))
    assert ok.status_code == 200, ok.text
    assert too_long.status_code == 400
    assert too_long.json()["error"]["message"].startswith(
        "This model's maximum context length is 64 tokens. However, your request has 81 "
        "input tokens."
    )


async def test_unknown_model_is_a_404_naming_the_known_ones() -> None:
    with emulators(["alpha", "alpha", "beta"]) as ems:
        gw = two_pools(ems)
        async with client_for(gw) as client:
            resp = await client.post(COMPLETIONS, json=body("gamma"))
            metrics = (await client.get("/metrics")).text
    assert resp.status_code == 404
    assert resp.json() == {
        "error": {
            "message": "The model `gamma` does not exist. Known models: `alpha`, `beta`.",
            "type": "not_found_error",
            "param": "model",
            "code": 404,
        }
    }
    assert 'conductor_http_responses_total{endpoint="completions",model="",status="404"} 1.0' in (
        metrics
    )


async def test_a_pool_whose_engines_are_all_down_does_not_touch_the_other() -> None:
    with emulators(["alpha", "alpha", "beta"]) as ems:
        gw = two_pools(ems)
        beta = gw.pools.get("beta")
        async with client_for(gw) as client:
            assert (await client.post(COMPLETIONS, json=body("beta"))).status_code == 200
            ems[2].stop()  # beta's only engine dies
            await eventually(lambda: not beta.can_serve())
            down = await client.post(COMPLETIONS, json=body("beta"))
            alive = [await client.post(COMPLETIONS, json=body("alpha", f"p{i}")) for i in range(3)]
            ready = await client.get("/ready")
            metrics = (await client.get("/metrics")).text
    assert down.status_code == 503
    assert down.headers["retry-after"] == "1"
    assert "no_instance" in down.json()["error"]["message"]
    assert [r.status_code for r in alive] == [200, 200, 200]
    assert ready.status_code == 200  # alpha can still be served
    assert ready.json()["models"] == {"alpha": "ready", "beta": "unavailable"}
    assert ready.json()["unhealthy"] == ["b0"]
    assert (
        'conductor_http_responses_total{endpoint="completions",model="beta",status="503"} 1.0'
        in (metrics)
    )
    assert 'conductor_engine_healthy{engine="b0",model="beta",role="both"} 0.0' in metrics
    assert 'conductor_engine_healthy{engine="a0",model="alpha",role="both"} 1.0' in metrics


async def test_metrics_are_labelled_by_model() -> None:
    with emulators(["alpha", "alpha", "beta"]) as ems:
        gw = two_pools(ems)
        async with client_for(gw) as client:
            for i, model in enumerate(["alpha", "alpha", "beta"]):
                resp = await client.post(COMPLETIONS, json=body(model, f"request {i}"))
                assert resp.status_code == 200, resp.text
            metrics = (await client.get("/metrics")).text
    for line in [
        'conductor_decisions_total{model="alpha",outcome="accepted",policy="conductor"} 2.0',
        'conductor_decisions_total{model="beta",outcome="accepted",policy="conductor"} 1.0',
        'conductor_requests_finished_total{model="alpha",outcome="completed"} 2.0',
        'conductor_requests_finished_total{model="beta",outcome="completed"} 1.0',
        'conductor_http_responses_total{endpoint="completions",model="alpha",status="200"} 2.0',
        'conductor_http_responses_total{endpoint="completions",model="beta",status="200"} 1.0',
        'conductor_inflight_requests{model="alpha"} 0.0',
        'conductor_inflight_requests{model="beta"} 0.0',
        'conductor_engine_queued_requests{engine="b0",model="beta",role="both"} 0.0',
        'conductor_engine_model_mismatch{engine="a1",model="alpha",role="both"} 0.0',
    ]:
        assert line in metrics, line
    # "request 2" is 9 characters: 1 + 9 tokens for alpha, 1 + 18 for beta
    assert 'conductor_prompt_tokens_total{model="beta",policy="conductor"} 19.0' in metrics


async def test_an_engine_serving_another_model_is_kept_out_with_the_reason() -> None:
    with emulators(["alpha", "alpha", "alpha"]) as ems:  # b0 serves alpha, config says beta
        gw = two_pools(ems)
        beta = gw.pools.get("beta")
        async with client_for(gw) as client:
            await eventually(lambda: gw.handle("b0").model_error is not None)
            resp = await client.post(COMPLETIONS, json=body("beta"))
            admin = (await client.get("/admin/engines", headers=admin_headers())).json()
            metrics = (await client.get("/metrics")).text
            await eventually(lambda: gw.handle("a0").model_checked)
    why = "it serves ['alpha'], its config says 'beta'"
    assert not beta.conductor.instances["b0"].healthy
    assert resp.status_code == 503
    by_id = {e["id"]: e for e in admin["engines"]}
    assert by_id["b0"]["healthy"] is False
    assert by_id["b0"]["model_error"] == why
    assert by_id["b0"]["pool"] == "beta"
    assert by_id["a0"]["model_error"] is None
    assert 'conductor_engine_model_mismatch{engine="b0",model="beta",role="both"} 1.0' in metrics
    assert 'conductor_engine_failures_total{engine="b0",model="beta",reason="model"} 1.0' in (
        metrics
    )
    assert gw.handle("a0").model_error is None


async def test_admin_lists_pools_and_discovers_an_added_engines_model() -> None:
    with emulators(["alpha", "alpha", "beta", "beta"]) as ems:
        gw = two_pools(ems[:3])
        async with client_for(gw) as client:
            added = await client.post(
                "/admin/engines",
                json={"url": ems[3].base_url, "role": "both", "id": "b1"},
                headers=admin_headers(),
            )
            pools = (await client.get("/admin/models", headers=admin_headers())).json()
    assert added.status_code == 201, added.text
    assert added.json()["model"] == "beta"
    assert added.json()["pool"] == "beta"
    assert sorted(gw.pools.get("beta").conductor.instances) == ["b0", "b1"]
    assert [(p["name"], p["engines"], p["max_model_len"]) for p in pools["models"]] == [
        ("alpha", ["a0", "a1"], 256),
        ("beta", ["b0", "b1"], 64),
    ]
    assert pools["models"][1]["policy"] == "conductor"
    assert pools["models"][1]["served_name"] == "beta"


async def test_served_name_is_what_the_engines_are_sent() -> None:
    chat = ModelConfig("chat", 256, BLOCK, served_name="alpha")
    with emulators(["alpha"]) as ems:
        gw = make_models_gateway(
            [(chat, FakeTokenizer()), (BETA, FakeTokenizer())],
            [engine("c0", ems[0].base_url, model="alpha")],
        )
        async with client_for(gw) as client:
            resp = await client.post(COMPLETIONS, json=body("chat"))
            wrong = await client.post(COMPLETIONS, json=body("alpha"))
    assert resp.status_code == 200, resp.text  # the emulator checks the name it is sent
    assert resp.json()["model"] == "alpha"
    assert wrong.status_code == 404  # clients use the model's name, not its served one


def test_model_config_edge_cases() -> None:
    url = "http://127.0.0.1:9"
    with pytest.raises(InvalidInput, match=r"models\[1\].name.*also the name of models\[0\]"):
        GatewayConfig.for_models((ALPHA, replace(BETA, name="alpha")))
    with pytest.raises(InvalidInput, match=r"models\[1\].served_name.*also served by models"):
        GatewayConfig.for_models((ALPHA, replace(BETA, served_name="alpha")))
    with pytest.raises(InvalidInput, match=r"engines\[0\].model.*no model serves it"):
        GatewayConfig.for_models((ALPHA, BETA), engines=(engine("x", url, model="gamma"),))
    with pytest.raises(InvalidInput, match=r"engines\[0\].model.*is required"):
        GatewayConfig.for_models((ALPHA, BETA), engines=(engine("x", url),))
    with pytest.raises(InvalidInput, match=r"engines\[1\].id.*duplicate engine id"):
        GatewayConfig.for_models(
            (ALPHA, BETA),
            engines=(engine("x", url, model="alpha"), engine("x", url, model="beta")),
        )
    wide = replace(BETA, block_size_tokens=2 * BLOCK)
    with pytest.raises(InvalidInput, match=r"engines\[0\].block_size.*must equal"):
        GatewayConfig.for_models((ALPHA, wide), engines=(engine("x", url, model="beta"),))
    with pytest.raises(InvalidInput, match=r"pools.*must be one per model"):
        Gateway(GatewayConfig.for_models((ALPHA, BETA)), pools={})


async def test_one_model_shorthand_keeps_its_unlabelled_metrics() -> None:
    """The shorthand (no ``[[models]]``): the same answers and metric names as before."""
    with emulators(["tiny"]) as ems:
        gw = make_gateway([engine("e0", ems[0].base_url, model="tiny")])
        async with client_for(gw) as client:
            resp = await client.post(COMPLETIONS, json=body("tiny"))
            unknown = await client.post(COMPLETIONS, json=body("gamma"))
            metrics = (await client.get("/metrics")).text
    assert resp.status_code == 200, resp.text
    assert unknown.json()["error"]["message"] == "The model `gamma` does not exist."
    assert 'conductor_decisions_total{outcome="accepted",policy="conductor"} 1.0' in metrics
    assert "conductor_inflight_requests 0.0" in metrics
    assert 'model="' not in metrics.replace('model_name="', "")


def test_a_hot_model_does_not_starve_the_others_admission() -> None:
    """alpha's scheduler is loaded until its TTFT SLO refuses a request; the same request
    for beta, on its own scheduler (its own queues, index and predictor), is placed."""
    url = "http://127.0.0.1:9"
    gw = make_models_gateway(
        [(ALPHA, FakeTokenizer()), (BETA, FakeTokenizer())],
        [engine("a0", url, model="alpha"), engine("b0", url, model="beta")],
        ttft_slo_s=1.0,
    )
    alpha, beta = gw.pools.get("alpha").conductor, gw.pools.get("beta").conductor

    def request(i: int) -> Request:
        hashes = tuple(BlockHash(i * 1000 + j) for j in range(50))
        return Request(RequestId(f"r{i}"), 200, hashes, 16, 0.0)

    placed = 0
    while not isinstance(decision := alpha.schedule(request(placed), 0.0), Rejection):
        placed += 1
    assert decision.code == "ttft_slo"
    assert placed > 10
    assert not isinstance(beta.schedule(request(placed), 0.0), Rejection)
    assert (alpha.inflight(), beta.inflight()) == (placed, 1)


async def test_admin_engine_without_model_that_cannot_be_asked_is_a_400() -> None:
    refused = closed_port_url()
    with emulators(["alpha", "alpha", "beta"]) as ems:
        gw = two_pools(ems)
        async with client_for(gw) as client:
            answers = [
                await client.post(
                    "/admin/engines", json={"url": url, "role": "both"}, headers=admin_headers()
                )
                for url in (refused, "not a url")
            ]
    assert [r.status_code for r in answers] == [400, 400]
    why = "invalid engine.model=None: not given and not discovered: GET {}/v1/models gave no "
    why += "model list"
    assert [r.json()["error"]["message"] for r in answers] == [
        why.format(refused),
        why.format("not a url"),
    ]
    assert sorted(gw.engines) == ["a0", "a1", "b0"]
