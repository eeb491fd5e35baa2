"""``--cost-file`` on simulate, compare, capacity and emulate: the file's model is used, the
preset option excludes it, and a bad file is named by option and key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conductor.cli.emulate_cmd import build_config
from conductor.cli.main import app
from conductor.emulator.service import Emulator
from conductor.workload.synth import synthesize
from conductor.workload.trace import write_trace
from tests.engines.costs import COMMITTED, committed_cost

runner = CliRunner()


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    write_trace(synthesize("chat", requests=20, rate_rps=2.0, seed=1), path)
    return path


def test_simulate_uses_the_cost_file(trace: Path, tmp_path: Path) -> None:
    base = ["simulate", "--trace", str(trace), "--prefill", "1", "--decode", "1"]
    runs = {}
    for name, extra in (("file", ["--cost-file", str(COMMITTED)]), ("preset", [])):
        out = tmp_path / f"{name}.json"
        r = runner.invoke(app, [*base, *extra, "--json", str(out)])
        assert r.exit_code == 0, r.output
        runs[name] = json.loads(out.read_text())
    # the tiny CPU model prefills a chat prompt in tens of milliseconds, the 70B preset on
    # 8 A800s in hundreds: the cost file's model is the one simulated
    assert runs["file"]["prefill_compute_s"] < runs["preset"]["prefill_compute_s"]
    cost = committed_cost()
    prompts = synthesize("chat", requests=20, rate_rps=2.0, seed=1)
    fresh = sum(cost.prefill_s(r.input_length, 0) for r in prompts)
    assert runs["file"]["prefill_compute_s"] <= round(fresh, 6) + 1e-6


@pytest.mark.parametrize("command", ["simulate", "compare", "capacity"])
def test_cost_file_excludes_the_preset(command: str, trace: Path) -> None:
    args = [command, "--trace", str(trace), "--cost-file", str(COMMITTED), "--preset", "tiny"]
    r = runner.invoke(app, args)
    assert r.exit_code == 2
    assert "error: invalid --cost-file: --cost-file and --preset exclude each other" in r.output


def test_bad_cost_file_is_named(trace: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(COMMITTED.read_text().replace("capacity_tokens = ", "capacity_tokens = -"))
    r = runner.invoke(app, ["compare", "--trace", str(trace), "--cost-file", str(bad)])
    assert r.exit_code == 2
    assert f"error: invalid --cost-file='{bad}': invalid kv.capacity_tokens=-" in r.output
    r = runner.invoke(app, ["simulate", "--trace", str(trace), "--cost-file", str(tmp_path)])
    assert r.exit_code == 2 and "cannot read" in r.output


def test_emulate_takes_the_cost_file() -> None:
    r = runner.invoke(app, ["emulate", "--cost-file", str(COMMITTED), "--preset", "x"])
    assert r.exit_code == 2 and "exclude each other" in r.output
    r = runner.invoke(app, ["emulate", "--cost-file", "/nonexistent.toml"])
    assert r.exit_code == 2 and "invalid --cost-file='/nonexistent.toml': cannot read" in r.output
    cfg = build_config(
        port=0, host="127.0.0.1", role="both", kv_events_port=None, replay_port=None,
        kv_topic="", preset_name="llama3-8b-h100", speedup=1.0, instant=False, block_size=32,
        cache_blocks=64, max_model_len=512, max_batch_size=8, max_batched_tokens=512,
        model="m", seed=0, engine_id=None, cost=committed_cost(),
    )  # fmt: skip
    assert Emulator(cfg).cost == committed_cost()
