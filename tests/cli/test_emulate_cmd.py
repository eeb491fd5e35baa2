"""``conductor emulate``: option validation (exit 2, naming the option) and a real start."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import httpx
import pytest
from typer.testing import CliRunner

from conductor.cli.emulate_cmd import build_config
from conductor.cli.main import app
from conductor.emulator.config import EmulatorConfig
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
        (["--port", "-1"], "--port"),
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


@pytest.mark.parametrize(
    ("args", "option", "message"),
    [
        (["--port", "70000"], "--port", "must be a TCP port in 0..65535, got 70000"),
        (["--kv-events-port", "-5"], "--kv-events-port", "must be a TCP port in 0..65535, got -5"),
        (["--block-size", "0"], "--block-size", "must be > 0, got 0"),
        (["--model", " "], "--model", "must not be empty, got ' '"),
        (["--seed", "-1"], "--seed", "must be >= 0, got -1"),
        (["--role", "router"], "--role", "must be one of: prefill, decode, both, got 'router'"),
        (["--replay-port", "5558"], "--replay-port", "needs a KV events port too, got 5558"),
    ],
)
def test_config_errors_name_the_flag_and_the_value(
    args: list[str], option: str, message: str
) -> None:
    """Validation is the config's; the CLI words its error with the flag's name."""
    result = runner.invoke(app, ["emulate", *args])
    assert result.exit_code == 2
    error = " ".join(result.output.replace("│", " ").split()).split("Invalid value for ")[1]
    assert error.startswith((f"{option}: ", f"'{option}': "))
    assert error.endswith(message)


def test_option_defaults_are_the_configs() -> None:
    cfg = build_config(**{name: opt.default for name, opt in _options().items()})
    default = EmulatorConfig()
    assert replace(cfg, engine_id=default.engine_id) == default
    assert cfg.engine_id == f"emulator-{default.port}"


def test_port_zero_is_a_port() -> None:
    """0 asks the system for a free port (every port check allows 0..65535)."""
    cfg = build_config(**{**{n: o.default for n, o in _options().items()}, "port": 0})
    assert cfg.port == 0


def _options() -> dict[str, inspect.Parameter]:
    """``conductor emulate``'s parameters that ``build_config`` takes, with their defaults."""
    (emulate,) = [c for c in app.registered_commands if c.name == "emulate"]
    assert emulate.callback is not None
    taken = set(inspect.signature(build_config).parameters)
    params = inspect.signature(emulate.callback).parameters
    return {name: p for name, p in params.items() if name in taken}


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
