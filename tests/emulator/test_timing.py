"""Cost-model pacing (lower bounds only, so the tests never flake on a slow machine) and
client disconnects aborting the request."""

from __future__ import annotations

import time

import httpx

from conductor.core.costmodel import preset
from conductor.emulator.config import EmulatorConfig
from tests.emulator.helpers import metric, running_emulator


def test_steps_take_the_cost_models_time_divided_by_the_speedup() -> None:
    cost = preset("llama3-70b-a800x8")
    speedup = 4.0
    prompt_tokens, max_tokens = 2000, 5
    expected = cost.prefill_s(prompt_tokens, 0) + sum(
        cost.decode_step_s(1, prompt_tokens + k) for k in range(1, max_tokens)
    )
    cfg = EmulatorConfig(preset="llama3-70b-a800x8", speedup=speedup)
    with (
        running_emulator(cfg, kv_events=False) as emu,
        httpx.Client(base_url=emu.base_url, timeout=30) as client,
    ):
        start = time.perf_counter()
        r = client.post(
            "/v1/completions", json={"prompt": "x" * prompt_tokens, "max_tokens": max_tokens}
        )
        elapsed = time.perf_counter() - start
        assert r.status_code == 200
        assert elapsed >= 0.95 * expected / speedup
        busy = metric(client, "conductor_emulator_busy_seconds_total")
        assert abs(busy - expected) < 1e-6


def test_client_disconnect_aborts_a_streaming_request() -> None:
    cfg = EmulatorConfig(speedup=1.0)  # about 10 ms per decode step: 2000 tokens take 20 s
    with (
        running_emulator(cfg, kv_events=False) as emu,
        httpx.Client(base_url=emu.base_url, timeout=30) as client,
    ):
        body = {"prompt": "abort me " * 20, "max_tokens": 2000, "stream": True}
        with client.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            assert metric(client, "vllm:num_requests_running") == 1
        deadline = time.monotonic() + 5
        while metric(client, "vllm:num_requests_running") != 0:
            assert time.monotonic() < deadline, "the aborted request kept running"
            time.sleep(0.05)
        assert metric(client, "vllm:kv_cache_usage_perc") == 0
        assert metric(client, "vllm:generation_tokens_total") < 2000
