"""``conductor emulate``: option validation (exit 2, naming the option) and a real start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from typer.testing import CliRunner

from conductor.cli.main import app
from tests.engines.fixtures import REPO_ROOT, free_ports

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--role", "router"], "--role"),
        (["--preset", "gpt-9"], "--preset"),
        (["--speedup", "0"], "--speedup"),
        (["--speedup", "-3"], "--speedup"),
        (["--speedup", "inf"], "--speedup"),
        (["--port", "0"], "--port"),
        (["--port", "70000"], "--port"),
        (["--kv-events-port", "99999"], "--kv-events-port"),
        (["--replay-port", "5558"], "--replay-port"),
        (["--port", "5557", "--kv-events-port", "5557"], "--kv-events-port"),
        (["--kv-events-port", "5557", "--replay-port", "5557"], "--replay-port"),
        (["--block-size", "0"], "--block-size"),
        (["--cache-blocks", "-1"], "--cache-blocks"),
        (["--max-model-len", "0"], "--max-model-len"),
        (["--max-batch-size", "0"], "--max-batch-size"),
        (["--max-batched-tokens", "0"], "--max-batched-tokens"),
        (["--seed", "-1"], "--seed"),
        (["--model", " "], "--model"),
        (["--model-path", "/nonexistent/tokenizer"], "--model-path"),
        (["--log-level", "loud"], "--log-level"),
        (["--port", "abc"], "--port"),
    ],
)
def test_bad_values_exit_2_naming_the_option(args: list[str], option: str) -> None:
    result = runner.invoke(app, ["emulate", *args])
    assert result.exit_code == 2, result.output
    assert option in result.output


def test_emulate_serves_until_terminated() -> None:
    port, kv, replay = free_ports(3)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "conductor.cli.main",
            "emulate",
            "--port",
            str(port),
            "--kv-events-port",
            str(kv),
            "--replay-port",
            str(replay),
            "--role",
            "prefill",
            "--instant",
            "--model",
            "tiny",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "emulator did not become healthy"
            time.sleep(0.1)
        info = httpx.get(f"http://127.0.0.1:{port}/emulator/info", timeout=5).json()
        assert (info["role"], info["model"], info["instant"]) == ("prefill", "tiny", True)
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": "tiny", "prompt": "hello", "max_tokens": 2},
            timeout=5,
        )
        assert r.json()["usage"]["completion_tokens"] == 2
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        # the server shuts down gracefully and exits 0
        assert proc.wait(timeout=10) == 0
        if proc.stderr is not None:
            proc.stderr.close()
