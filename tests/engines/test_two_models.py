"""Two real vLLM CPU engines serving two different tiny models behind one gateway.

``.tiny-model`` (2 layers, hidden 256) is served as ``tiny``, ``.tiny-model-b`` (``make
tiny-model-b``: another seed, 1 layer, hidden 128) as ``tiny-b``. The gateway is built as
``conductor serve --config`` builds it, from ``[[models]]`` tables: the second engine's
entry names no model, so its model is discovered from its ``/v1/models``. Both engines
start once for the module (in parallel); the test that stops one runs last.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conductor.cli.serve_cmd import build_gateway
from conductor.cli.serve_config import build_settings
from conductor.gateway.service import Gateway
from tests.engines.fixtures import (
    BLOCK_SIZE_TOKENS,
    REPO_ROOT,
    SERVED_MODEL_NAME,
    TINY_MODEL,
    VllmEngine,
    free_port,
    missing_prerequisites,
    start_vllm_engine,
)
from tests.gateway.harness import TOKEN, admin_headers, client_for, eventually

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.anyio]

TINY_MODEL_B = REPO_ROOT / ".tiny-model-b"
MODEL_B = "tiny-b"
LEN_A, LEN_B = 2048, 1024
FAST_START = ["--enforce-eager"]  # no torch.compile warm-up
COMPLETIONS = "/v1/completions"
PROMPT = "Alpha beta gamma delta one two three four five six seven eight nine ten."


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VllmEngine, VllmEngine]]:
    reason = missing_prerequisites()
    if reason is None and not (TINY_MODEL_B / ".generated").exists():
        reason = f"no second tiny model at {TINY_MODEL_B} (run `make tiny-model-b`)"
    if reason is not None:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("two-models")
    started: list[VllmEngine] = []
    try:
        started.append(
            start_vllm_engine(
                free_port(), None, FAST_START, max_model_len=LEN_A, log_path=tmp / "a.log"
            )
        )
        started.append(
            start_vllm_engine(
                free_port(),
                None,
                [*FAST_START, "--served-model-name", MODEL_B],  # the last one counts
                model=TINY_MODEL_B,
                max_model_len=LEN_B,
                log_path=tmp / "b.log",
            )
        )
        for engine in started:
            engine.wait_healthy()
        yield started[0], started[1]
    finally:
        for engine in started:
            engine.stop()


def config(tmp: Path, a: VllmEngine, b: VllmEngine) -> Path:
    path = tmp / "serve.toml"
    path.write_text(
        f"""
[gateway]
block_size = {BLOCK_SIZE_TOKENS}
admin_token = "{TOKEN}"
health_interval_s = 0.2
load_interval_s = 0.5

[[models]]
name = "{SERVED_MODEL_NAME}"
path = "{TINY_MODEL}"
max_model_len = {LEN_A}
cost_file = "{REPO_ROOT / "tests/engines/tiny-cpu.cost.toml"}"

[[models]]
name = "{MODEL_B}"
path = "{TINY_MODEL_B}"
max_model_len = {LEN_B}
ttft_slo_s = 20.0

[[engines]]
id = "a"
url = "{a.base_url}"
role = "both"
model = "{SERVED_MODEL_NAME}"

[[engines]]
id = "b"
url = "{b.base_url}"
role = "both"
"""
    )
    return path


def gateway(tmp: Path, engines: tuple[VllmEngine, VllmEngine]) -> Gateway:
    settings = build_settings({}, [], config(tmp, *engines))
    return build_gateway(settings)


def ask(model: str, **extra: object) -> dict[str, object]:
    return {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0.0, **extra}


async def test_requests_reach_the_engine_of_their_model(
    engines: tuple[VllmEngine, VllmEngine], tmp_path: Path
) -> None:
    gw = gateway(tmp_path, engines)
    assert gw.handle("b").config.model == MODEL_B  # discovered from its /v1/models
    async with client_for(gw) as client:
        listed = (await client.get("/v1/models")).json()
        a = await client.post(COMPLETIONS, json=ask(SERVED_MODEL_NAME, ignore_eos=True))
        b = await client.post(COMPLETIONS, json=ask(MODEL_B, ignore_eos=True))
        chat = await client.post(
            "/v1/chat/completions",
            json={"model": MODEL_B, "messages": [{"role": "user", "content": PROMPT}],
                  "max_tokens": 4},
        )  # fmt: skip
        metrics = (await client.get("/metrics")).text
    assert [(m["id"], m["max_model_len"]) for m in listed["data"]] == [
        (SERVED_MODEL_NAME, LEN_A),
        (MODEL_B, LEN_B),
    ]
    assert a.status_code == b.status_code == chat.status_code == 200, (a.text, b.text, chat.text)
    assert (a.headers["x-conductor-prefill"], a.json()["model"]) == ("a", SERVED_MODEL_NAME)
    assert (b.headers["x-conductor-prefill"], b.json()["model"]) == ("b", MODEL_B)
    assert chat.headers["x-conductor-prefill"] == "b"
    assert a.json()["usage"]["completion_tokens"] == b.json()["usage"]["completion_tokens"] == 8
    # the same greedy prompt, two different models: two different continuations
    assert a.json()["choices"][0]["text"] != b.json()["choices"][0]["text"]
    # each pool's tokenizer (and chat template) counts the prompts as its engine does
    usage = [r.json()["usage"]["prompt_tokens"] for r in (a, b, chat)]
    for model, tokens in ((SERVED_MODEL_NAME, usage[0]), (MODEL_B, usage[1] + usage[2])):
        line = f'conductor_prompt_tokens_total{{model="{model}",policy="conductor"}}'
        assert f"{line} {float(tokens)}" in metrics, (line, usage)
    assert (
        'conductor_decisions_total{model="tiny-b",outcome="accepted",policy="conductor"} 2.0'
        in (metrics)
    )


async def test_an_engine_claiming_the_other_model_is_kept_out(
    engines: tuple[VllmEngine, VllmEngine], tmp_path: Path
) -> None:
    gw = gateway(tmp_path, engines)
    async with client_for(gw) as client:
        added = await client.post(
            "/admin/engines",
            json={"id": "liar", "url": engines[1].base_url, "role": "both",
                  "model": SERVED_MODEL_NAME, "block_size": BLOCK_SIZE_TOKENS},
            headers=admin_headers(),
        )  # fmt: skip
        assert added.status_code == 201, added.text
        await eventually(lambda: gw.handle("liar").model_error is not None, timeout_s=20.0)
        listed = (await client.get("/admin/engines", headers=admin_headers())).json()
        answers = [
            await client.post(COMPLETIONS, json=ask(SERVED_MODEL_NAME, prompt=f"{i} {PROMPT}"))
            for i in range(3)
        ]
        metrics = (await client.get("/metrics")).text
    liar = next(e for e in listed["engines"] if e["id"] == "liar")
    assert liar["healthy"] is False
    assert liar["model_error"] == f"it serves ['{MODEL_B}'], its config says '{SERVED_MODEL_NAME}'"
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert {r.headers["x-conductor-prefill"] for r in answers} == {"a"}
    assert 'conductor_engine_model_mismatch{engine="liar",model="tiny",role="both"} 1.0' in metrics


async def test_one_model_down_leaves_the_other_served(
    engines: tuple[VllmEngine, VllmEngine], tmp_path: Path
) -> None:
    """Runs last: stops the second engine."""
    gw = gateway(tmp_path, engines)
    async with client_for(gw) as client:
        assert (await client.post(COMPLETIONS, json=ask(MODEL_B))).status_code == 200
        engines[1].stop()
        await eventually(lambda: not gw.pools.get(MODEL_B).can_serve(), timeout_s=20.0)
        down = await client.post(COMPLETIONS, json=ask(MODEL_B))
        up = await client.post(COMPLETIONS, json=ask(SERVED_MODEL_NAME))
        ready = await client.get("/ready")
    assert down.status_code == 503
    assert down.headers["retry-after"] == "1"
    assert up.status_code == 200, up.text
    assert ready.status_code == 200
    assert ready.json()["models"] == {SERVED_MODEL_NAME: "ready", MODEL_B: "unavailable"}
