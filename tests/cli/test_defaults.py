"""One source of defaults: the config dataclasses. The library, the simulator, the benchmark
and every command agree on them, and a bad value is reported under the option's name."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from conductor.cli.fields import field_default, renamed
from conductor.cli.main import app
from conductor.cli.serve_config import DEFAULTS, KEYS, ServeOptions
from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import DEFAULT_PRESET, PRESETS, preset
from conductor.core.errors import InvalidInput
from conductor.core.policies import DEFAULT_POLICY
from conductor.core.scheduler import Scheduler
from conductor.gateway.config import GatewayConfig, MonitorConfig, UpstreamConfig
from conductor.perf.decision import run_decision_bench
from conductor.sim.config import SimConfig
from conductor.workload.synth import synthesize
from conductor.workload.trace import write_trace

runner = CliRunner()


def _defaults(*path: str) -> dict[str, object]:
    """Option name -> default of the command at ``path`` (e.g. ``bench decision``)."""
    command: Any = typer.main.get_command(app)
    for name in path:
        command = command.get_command(None, name)
        assert command is not None, name
    return {
        opt: p.default for p in command.params if p.param_type_name == "option" for opt in p.opts
    }


def test_default_policy_is_the_same_everywhere(tmp_path: Path) -> None:
    assert Scheduler(preset(DEFAULT_PRESET)).policy_name == DEFAULT_POLICY
    assert SimConfig().policy == DEFAULT_POLICY
    bench = inspect.signature(run_decision_bench).parameters["policy"].default
    assert bench == DEFAULT_POLICY
    assert _defaults("bench", "decision")["--policy"] == DEFAULT_POLICY
    assert DEFAULTS["policy"] == ServeOptions().policy == DEFAULT_POLICY
    trace = tmp_path / "t.jsonl"
    write_trace(synthesize("chat", requests=10, rate_rps=2.0, seed=1), trace)
    out = tmp_path / "r.json"
    args = ["simulate", "--trace", str(trace), "--prefill", "1", "--decode", "1"]
    result = runner.invoke(app, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["policy"] == DEFAULT_POLICY


def test_simulation_options_default_to_the_config_fields() -> None:
    sim, sched = SimConfig(), SchedulerConfig()
    for command in ("simulate", "compare", "capacity"):
        got = _defaults(command)
        assert got["--prefill"] == sim.n_prefill
        assert got["--decode"] == sim.n_decode
        assert got["--preset"] == DEFAULT_PRESET == sim.cost.name
        assert got["--ttft-slo-s"] == sched.ttft_slo_s
        assert got["--seed"] == sim.seed
        if command != "capacity":
            assert got["--tbt-slo-ms"] == sched.tbt_slo_s * 1e3
            assert got["--kv-event-delay-s"] == sim.kv_event_delay_s
        assert got["--cost-error"] == sim.cost_error == 0.0
        assert got["--cost-bias"] == sim.cost_bias == 0.0
        assert got["--correction"] is sched.cost_correction is True
    assert _defaults("trace", "stats")["--lru-tokens"] == sim.cache_capacity_tokens
    assert _defaults("bench", "decision")["--preset"] == DEFAULT_PRESET


def test_serve_keys_default_to_the_config_fields() -> None:
    for key, k in KEYS.items():
        default = field_default(k.config, k.field)
        assert DEFAULTS[key] == (default * 1e3 if key == "tbt_slo_ms" else default), key
    assert DEFAULTS["port"] == field_default(GatewayConfig, "port")
    assert DEFAULTS["read_timeout_s"] == UpstreamConfig().read_timeout_s
    assert DEFAULTS["kv_queue_size"] == MonitorConfig().kv_queue_size
    assert DEFAULTS["tbt_slo_ms"] == 100.0
    assert DEFAULTS["preset"] == DEFAULT_PRESET


def test_one_preset_table_serves_simulator_and_gateway() -> None:
    assert {"llama3-8b-h100", DEFAULT_PRESET} <= set(PRESETS)
    assert preset("llama3-8b-h100").name == "llama3-8b-h100"
    cfg = SimConfig(cost=preset("llama3-8b-h100"))
    assert cfg.cost is PRESETS["llama3-8b-h100"]


def test_field_default_and_renamed() -> None:
    assert field_default(SimConfig, "scheduler") == SchedulerConfig()
    with pytest.raises(KeyError, match="no field"):
        field_default(SimConfig, "nope")
    with pytest.raises(KeyError, match="no default"):
        field_default(GatewayConfig, "model_name")
    exc = InvalidInput("tbt_slo_s", -0.005, "must be > 0")
    assert str(renamed(exc, {"tbt_slo_s": "--tbt-slo-ms"}, {"tbt_slo_s": -5.0})) == (
        "invalid --tbt-slo-ms=-5.0: must be > 0"
    )
    assert renamed(exc, {}) is exc


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["simulate", "--ttft-slo-s", "-1"], "invalid --ttft-slo-s=-1.0: must be > 0"),
        (["simulate", "--tbt-slo-ms", "0"], "invalid --tbt-slo-ms=0.0: must be > 0"),
        (["simulate", "--policy", "x"], "invalid --policy='x': unknown policy; known: "),
        (["compare", "--policies", "mooncake,y"], "invalid --policies='y': unknown policy;"),
        (["capacity", "--policies", "z"], "invalid --policies='z': unknown policy;"),
        (["simulate", "--prefill", "0"], "invalid --prefill=0: must be >= 1"),
        (["compare", "--decode", "-2"], "invalid --decode=-2: must be >= 1"),
        (["simulate", "--cache-tokens", "-5"], "invalid --cache-tokens=-5: must be >= 0"),
        (["simulate", "--kv-event-delay-s", "-1"], "invalid --kv-event-delay-s=-1.0: must be"),
        (["simulate", "--cost-error", "-1"], "invalid --cost-error=-1.0: must be >= 0"),
        (["compare", "--cost-bias", "-1"], "invalid --cost-bias=-1.0: must be > -1"),
        (["capacity", "--cost-error", "-0.5"], "invalid --cost-error=-0.5: must be >= 0"),
        (["simulate", "--admission", "maybe"], "invalid --admission='maybe': must be one of: "),
        (["simulate", "--preset", "gpt5"], "invalid --preset='gpt5': unknown; known: "),
        (["bench", "decision", "--policy", "x"], "invalid --policy='x': unknown policy;"),
        (["bench", "decision", "--preset", "y"], "invalid --preset='y': unknown; known: "),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_values_name_the_option_and_the_value(args: list[str], message: str) -> None:
    limit = ["--limit", "5"] if args[0] != "bench" else []
    result = runner.invoke(app, [*args, *limit])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: {message}"), result.stderr


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    return d


@pytest.mark.parametrize(
    ("args", "toml", "message"),
    [
        (["--port", "70000"], "", "invalid --port=70000: must be a TCP port in 0..65535"),
        ([], "port = 70000", "invalid gateway.port=70000: must be a TCP port in 0..65535"),
        (["--ttft-slo-s", "-1"], "", "invalid --ttft-slo-s=-1.0: must be > 0"),
        ([], "tbt_slo_ms = -5", "invalid gateway.tbt_slo_ms=-5: must be > 0"),
        (["--tbt-slo-ms", "-5"], "tbt_slo_ms = 1", "invalid --tbt-slo-ms=-5.0: must be > 0"),
        (["--policy", "x"], "", "invalid --policy='x': unknown policy; known: "),
        ([], 'policy = "x"', "invalid gateway.policy='x': unknown policy; known: "),
        (["--log-level", "loud"], "", "invalid --log-level='loud': must be one of: critical"),
        ([], 'port = "80"', "invalid gateway.port='80': must be an integer"),
        (["--block-size", "0"], "", "invalid --block-size=0: must be > 0"),
        (["--health-interval-s", "0"], "", "invalid --health-interval-s=0.0: must be > 0"),
    ],
)
def test_serve_names_the_option_or_key_of_a_bad_value(
    model_dir: Path, tmp_path: Path, args: list[str], toml: str, message: str
) -> None:
    config = tmp_path / "gw.toml"
    config.write_text(f"[gateway]\n{toml}\n")
    engine = "http://127.0.0.1:8100,role=both,block_size=16"
    base = ["serve", "--check", "--model-path", str(model_dir), "--engine", engine]
    result = runner.invoke(app, [*base, "--config", str(config), *args])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {message}"), result.stderr
