"""Smoke tests of bench/gateway_load.py (its load generator against a real emulator, its
gateway detection and command line); the benchmark's figures are not asserted."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from conductor.emulator.config import EmulatorConfig
from tests.emulator.helpers import metric, running_emulator
from tests.engines.fixtures import REPO_ROOT

BENCH_DIR = REPO_ROOT / "bench"
sys.path.insert(0, str(BENCH_DIR))  # as running bench/gateway_load.py does: `loadgen` imports

from loadgen import cli, cluster, drive, measure, report, spec  # noqa: E402


def load(url: str, client: str, n: int = 30) -> spec.LoadSpec:
    return spec.LoadSpec(
        url=url,
        requests=n,
        duration_s=20.0,
        concurrency=4,
        max_tokens=3,
        prompt_tokens=80,
        shared_prefix_tokens=40,
        prefix_groups=2,
        warmup=2,
        timeout_s=10.0,
        client=client,
    )


@pytest.mark.parametrize("client", ["raw", "httpx"])
def test_load_generator_against_an_emulator(client: str) -> None:
    with running_emulator(EmulatorConfig(instant=True, model_name="bench"), kv_events=False) as emu:
        samples = asyncio.run(drive.run_load_async(load(emu.base_url, client)))
    assert (len(samples.e2e_s), samples.errors, samples.tokens) == (30, 0, 90)
    assert all(0 < t <= e for t, e in zip(samples.ttft_s, samples.e2e_s, strict=True))
    summary = report.summarize(samples)
    assert summary["ok"] == 30 and summary["requests_per_s"] > 0
    assert summary["ttft_p50_ms"] <= summary["e2e_p99_ms"]


@pytest.mark.parametrize("client", ["raw", "httpx"])
def test_load_generator_counts_http_errors(client: str) -> None:
    cfg = EmulatorConfig(instant=True, model_name="not-bench")
    with running_emulator(cfg, kv_events=False) as emu:
        samples = asyncio.run(drive.run_load_async(load(emu.base_url, client, n=5)))
    assert samples.errors == 5 and not samples.e2e_s
    assert "404" in samples.error_examples[0]


@pytest.mark.skipif(
    shutil.which("wrk") is None, reason="wrk is not installed (.ci/run installs it)"
)
def test_wrk_client_against_an_emulator() -> None:
    args = argparse.Namespace(procs=1)
    good = EmulatorConfig(instant=True, model_name="bench")
    with running_emulator(good, kv_events=False) as emu:
        run = replace(load(emu.base_url, "wrk"), duration_s=1.0)
        out = measure.measure(run, args)
        with httpx.Client(base_url=emu.base_url) as client:
            queries = metric(client, "vllm:prefix_cache_queries_total")
    assert out["client"] == "wrk" and out["errors"] == 0 and out["ok"] > 0
    # every prompt has 80 tokens; wrk does not count the (<= 4) answers cut by its end
    assert queries % 80 == 0 and out["ok"] <= queries // 80 <= out["ok"] + 4
    assert 0 < out["e2e_p50_ms"] <= out["e2e_p99_ms"]
    assert out["ttft_p50_ms"] is None  # wrk sees whole answers only
    with running_emulator(EmulatorConfig(instant=True, model_name="x"), kv_events=False) as emu:
        bad = measure.measure(replace(load(emu.base_url, "wrk"), duration_s=1.0), args)
    assert bad["ok"] == 0 and bad["errors"] > 0


def test_prompts_share_group_prefixes() -> None:
    s = load("http://127.0.0.1:1", "raw")
    a, b, c = (spec.prompt_for(i, s) for i in (0, 2, 1))
    assert len(a) == len(b) == 80
    assert a[:40] == b[:40] != c[:40] and a != b


def test_only_loopback_targets() -> None:
    spec.check_loopback("http://127.0.0.1:8000")
    spec.check_loopback("http://localhost:8000")
    for url in ("http://10.0.0.5:8000", "http://example.com", "http://192.168.1.2:80"):
        with pytest.raises(SystemExit):
            spec.check_loopback(url)


def test_gateway_detection_and_command_line() -> None:
    missing, why = cluster.find_serve([sys.executable, "-c", "import sys; sys.exit(2)"])
    assert missing is None and "no `conductor serve`" in why
    silent, _ = cluster.find_serve([sys.executable, "-c", "pass"])  # exits 0, prints no help
    assert silent is None
    serve, _ = cluster.find_serve([sys.executable, "-c", "print('--engine TEXT --model-path P')"])
    assert serve is not None and serve.has("--model-path") and not serve.has("--model")
    engines = [{"url": "http://127.0.0.1:1", "kv_events": "tcp://127.0.0.1:2"}]
    cmd = cluster.gateway_args(
        serve,
        engines,
        9,
        "conductor",
        model_path=Path("/tok"),
        max_model_len=100,
        extra=["--admission", "off"],
    )
    assert cmd[len(serve.prefix) :] == [
        "serve",
        "--engine",
        "http://127.0.0.1:1,role=both,kv_events=tcp://127.0.0.1:2",
        "--port",
        "9",
        "--policy",
        "conductor",
        "--model-path",
        "/tok",
        "--admission",
        "off",
    ]


def test_direct_run_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    code = cli.main(
        [
            "--engines",
            "1",
            "--requests",
            "20",
            "--warmup",
            "2",
            "--concurrency",
            "4",
            "--no-gateway",
            "--log-dir",
            str(tmp_path / "logs"),
            "--json",
            str(out),
        ]
    )
    assert code == 0
    result = json.loads(out.read_text())
    assert result["direct"]["ok"] == 20 and result["direct"]["errors"] == 0
    assert result["direct"]["engines"]["prefix_cache_queries"] == 20 * 256  # no warm-up
    assert result["gateway"] == {"skipped": "--no-gateway"}


def test_paired_run_through_the_gateway_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    args = ["--engines", "1", "--paired", "--requests", "20", "--warmup", "2"]
    args += ["--concurrency", "1", "--log-dir", str(tmp_path / "logs"), "--json", str(out)]
    assert cli.main(args) == 0
    result = json.loads(out.read_text())
    direct, through = result["direct"], result["gateway"]
    assert (direct["ok"], direct["errors"], through["ok"], through["errors"]) == (20, 0, 20, 0)
    assert direct["paired"] and through["paired"]
    # both paths reached the one engine: 2 x (20 + 2 warm-up) completions of 8 tokens
    assert through["engines"]["generation_tokens"] == 44 * 8
    assert set(result["added_latency_ms"]) == {
        "ttft_p50_ms",
        "ttft_p99_ms",
        "e2e_p50_ms",
        "e2e_p99_ms",
    }
    assert set(result["targets"]) == {
        "added_e2e_p50_ms_at_most",
        "added_e2e_p50_met",
        "gateway_requests_per_s_at_least",
        "gateway_requests_per_s_met",
    }


def test_paired_needs_the_raw_client_at_concurrency_1() -> None:
    with pytest.raises(SystemExit):
        cli.parse_args(["--paired", "--concurrency", "4"])
    with pytest.raises(SystemExit):
        cli.parse_args(["--paired", "--client", "wrk"])


def test_the_script_runs_the_command_line() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH_DIR / "gateway_load.py"), "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert done.stdout.startswith("usage: gateway_load.py")
    assert "Load test: completions straight to an emulated engine" in done.stdout
    assert "--paired" in done.stdout
