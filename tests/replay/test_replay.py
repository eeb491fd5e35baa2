"""``conductor replay`` over real HTTP against emulated engines: exact request counts, the
trace's shared prefixes as the engine's own cache hits, the JSON schema of ``simulate``,
Ctrl-C keeping what finished, and bad input named by its option."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from conductor.cli.main import app
from conductor.emulator.config import EmulatorConfig
from conductor.replay.runner import _header_ms
from conductor.workload.trace import write_trace
from conductor.workload.trace_format import TraceRecord
from tests.emulator.helpers import EmulatorThread, metric, running_emulator

runner = CliRunner()
SCALE = ["--token-scale", "0.0625", "--output-scale", "0.1"]
"""512-token trace blocks become 32-token blocks: one emulator block per hash id."""

# (timestamp ms, input tokens, output tokens, hash ids); scaled: 64, 96, 64, 96, 38 tokens
RECORDS = [
    (0, 1024, 40, (1, 2)),
    (1000, 1536, 40, (1, 2, 3)),  # shares blocks 1, 2 with the first: 64 cached tokens
    (2000, 1024, 40, (4, 5)),
    (3000, 1536, 40, (4, 5, 6)),  # 64 cached
    (4000, 600, 40, (1, 2)),  # 38 tokens: one whole block (32) cached
]
PROMPT_TOKENS = 64 + 96 + 64 + 96 + 38
CACHED_TOKENS = 64 + 64 + 32


def _trace(path: Path, records: list[tuple[int, int, int, tuple[int, ...]]]) -> Path:
    write_trace([TraceRecord(t, n, o, h) for t, n, o, h in records], path)
    return path


@pytest.fixture
def emu() -> Iterator[EmulatorThread]:
    cfg = EmulatorConfig(instant=True, block_size_tokens=32, model_name="emu")
    with running_emulator(cfg, kv_events=False) as e:
        yield e


def _finished(emu: EmulatorThread) -> int:
    with httpx.Client(base_url=emu.base_url) as client:
        text = client.get("/metrics").text
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total{")
    )


def test_replay_sends_every_request_and_shares_prefixes(
    emu: EmulatorThread, tmp_path: Path
) -> None:
    trace = _trace(tmp_path / "t.jsonl", RECORDS)
    out = tmp_path / "replay.json"
    args = ["replay", "--trace", str(trace), "--url", emu.base_url, "--speed", "10", *SCALE]
    rows_out = tmp_path / "rows.json"
    r = runner.invoke(
        app, [*args, "--json", str(out), "--label", "emu", "--requests-json", str(rows_out)]
    )
    assert r.exit_code == 0, r.output
    got = json.loads(out.read_text())
    rows = json.loads(rows_out.read_text())
    assert [row["request_id"] for row in rows] == ["r0", "r1", "r2", "r3", "r4"]
    assert [row["prompt_tokens"] for row in rows] == [64, 96, 64, 96, 38]
    assert [row["cached_tokens"] for row in rows] == [0, 64, 0, 64, 32]
    assert [row["tokens"] for row in rows] == [4] * 5
    # an engine, not the gateway: no hold time, no predicted TTFT
    assert [(row["queued_s"], row["predicted_ttft_s"]) for row in rows] == [(None, None)] * 5
    assert got["policy"] == "emu" and got["admission"] == "endpoint"
    assert (got["requests"], got["completed"], got["rejected"]) == (5, 5, 0)
    assert got["cache_hit_rate"] == round(CACHED_TOKENS / PROMPT_TOKENS, 6)
    assert _finished(emu) == 5
    with httpx.Client(base_url=emu.base_url) as client:
        assert metric(client, "vllm:prefix_cache_hits_total") == CACHED_TOKENS
        assert metric(client, "vllm:prefix_cache_queries_total") == PROMPT_TOKENS
        assert metric(client, "vllm:generation_tokens_total") == 5 * 4
    # the schema of simulate --json, field for field
    sim_out = tmp_path / "sim.json"
    sim = runner.invoke(
        app,
        [
            "simulate",
            "--trace",
            str(trace),
            "--prefill",
            "1",
            "--decode",
            "1",
            "--json",
            str(sim_out),
        ],
    )
    assert sim.exit_code == 0, sim.output
    expected = json.loads(sim_out.read_text())
    assert list(got) == list(expected)
    for key, value in expected.items():
        if isinstance(value, dict):
            assert list(got[key]) == list(value), key


def test_limit_and_max_tokens(emu: EmulatorThread, tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", RECORDS)
    args = ["replay", "--trace", str(trace), "--url", emu.base_url, "--speed", "10", *SCALE]
    out = tmp_path / "r.json"
    r = runner.invoke(app, [*args, "--limit", "2", "--max-output-tokens", "2", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["completed"] == 2
    with httpx.Client(base_url=emu.base_url) as client:
        assert metric(client, "vllm:generation_tokens_total") == 2 * 2


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_writes_what_finished(
    emu: EmulatorThread, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    # two requests now, the third in 1000 s: interrupted while waiting for it
    records = [*RECORDS[:2], (1_000_000, 1024, 40, (7, 8))]
    trace = _trace(tmp_path / "t.jsonl", records)
    out = tmp_path / "r.json"
    # started as a non-interactive shell starts a background job: SIGINT ignored on entry
    cmd = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", sys.executable, "-m", "conductor.cli.main"]
    cmd += ["replay", "--trace", str(trace), "--url", emu.base_url, *SCALE, "--json", str(out)]
    # PYTHONFAULTHANDLER: should it ever hang after the signal, SIGABRT makes it print where
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 60
        while _finished(emu) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the first two requests did not finish"
            time.sleep(0.1)
        os.kill(proc.pid, sig)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=30)
            pytest.fail(f"replay still running 60 s after {sig.name}; its stacks:\n{err.decode()}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, err
    assert f"interrupted ({sig.name}): 2 of 3 requests finished".encode() in err
    got = json.loads(out.read_text())
    assert (got["requests"], got["completed"]) == (2, 2)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--url", "ftp://x"], "invalid --url='ftp://x': must be an http:// URL"),
        (["--speed", "0"], "invalid --speed=0.0: must be a finite number > 0"),
        (["--token-scale", "0.0001"], "invalid --token-scale=0.0001: scales a trace block below"),
        (["--block-size", "0"], "invalid --block-size=0: must be >= 1"),
        (["--limit", "0"], "invalid --limit=0: must be >= 1"),
        (["--tbt-slo-ms", "0"], "--tbt-slo-ms"),
        (["--trace", "/nonexistent.jsonl"], "no such file: /nonexistent.jsonl"),
        (["--url", "http://127.0.0.1:9"], "cannot list the models at http://127.0.0.1:9"),
    ],
)
def test_bad_input_is_named(extra: list[str], message: str) -> None:
    args = ["replay", "--url", "http://127.0.0.1:9", "--limit", "3"]
    r = runner.invoke(app, [*args, *extra])
    assert r.exit_code == 2, r.output
    assert message in r.output


def test_refused_requests_count_as_rejected(tmp_path: Path) -> None:
    cfg = EmulatorConfig(instant=True, block_size_tokens=32, max_model_len=80)
    trace = _trace(tmp_path / "t.jsonl", RECORDS)
    out, rows_out = tmp_path / "r.json", tmp_path / "rows.json"
    with running_emulator(cfg, kv_events=False) as emu:
        args = ["replay", "--trace", str(trace), "--url", emu.base_url, "--speed", "10", *SCALE]
        r = runner.invoke(app, [*args, "--json", str(out), "--requests-json", str(rows_out)])
    assert r.exit_code == 0, r.output
    assert "2 request(s) failed, e.g. HTTP 400: " in r.output
    got = json.loads(out.read_text())
    assert (got["requests"], got["completed"], got["rejected"]) == (5, 3, 2)
    rows = json.loads(rows_out.read_text())
    assert [row["status"] for row in rows] == [200, 400, 200, 400, 200]
    assert [row["ttft_s"] is None for row in rows] == [False, True, False, True, False]


def test_the_gateways_millisecond_headers_read_as_seconds() -> None:
    headers = {"a": "401.0", "b": "0.0", "c": "", "d": "soon", "e": "-1", "f": "nan"}
    got = {k: _header_ms(headers, k) for k in (*headers, "absent")}
    assert got == {
        "a": 0.401,
        "b": 0.0,
        "c": None,
        "d": None,
        "e": None,
        "f": None,
        "absent": None,
    }
