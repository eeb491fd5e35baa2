"""``conductor profile`` over real HTTP against an emulated engine: the plan's requests, exact
cached prefixes (the engine's own count), the residual tables, a cost file that round-trips
and that ``simulate --cost-file`` runs with."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conductor.cli.main import app
from conductor.core.cost_file import parse_cost_file
from conductor.emulator.config import EmulatorConfig
from conductor.hf.tokenizer import HfTokenizer
from conductor.profiling.measure import cached_prefix
from tests.emulator.helpers import EmulatorThread, running_emulator
from tests.profiling.tiny_model import KV_BYTES_PER_TOKEN, write_model_dir

runner = CliRunner()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def emu(model_dir: Path) -> Iterator[EmulatorThread]:
    cfg = EmulatorConfig(preset="llama3-8b-h100", block_size_tokens=32, cache_blocks=8192)
    with running_emulator(cfg, kv_events=False, tokenizer=HfTokenizer.load(model_dir)) as e:
        yield e


PLAN = [
    "--lengths", "64,160,256", "--cached-fractions", "0.5", "--repeats", "1",
    "--warmup", "1", "--batch-sizes", "1,2", "--contexts", "32,64", "--decode-tokens", "8",
]  # fmt: skip


def test_profile_writes_a_cost_file_that_round_trips(
    emu: EmulatorThread, model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "cost.toml"
    args = ["profile", "--url", emu.base_url, "--model-path", str(model_dir), "--out", str(out)]
    r = runner.invoke(app, [*args, *PLAN, "--name", "emu-profiled"])
    assert r.exit_code == 0, r.output
    assert "prefill fit" in r.output and "decode step fit" in r.output
    assert r.output.count("rms error") == 2
    text = out.read_text()
    assert text.startswith("# Cost model measured by `conductor profile` at ")
    parsed = parse_cost_file(text)
    assert parsed.cost.name == "emu-profiled"
    assert parsed.block_size_tokens == 32
    assert parsed.cost.model.kv_bytes_per_token == KV_BYTES_PER_TOKEN
    m = parsed.measured
    assert m["served_model"] == "emulated"
    assert m["cached_tokens_from"] == "engine usage"
    # one new and one half-cached prompt per length; the cached counts are the engine's own
    assert [s[:2] for s in m["prefill_samples"]] == [
        [n, p] for n in (64, 160, 256) for p in (0, cached_prefix(n, 0.5, 32))
    ]
    assert [s[0] for s in m["decode_samples"]] == [1, 2, 1, 2]
    # 1 warm-up + 3 x (new + prefix + cached) + decode points (warm + run per stream)
    assert m["requests"] >= 1 + 3 * 3 + 2 * (1 + 2 + 1 + 2)
    sim = runner.invoke(
        app,
        ["simulate", "--limit", "50", "--prefill", "1", "--decode", "1", "--cost-file", str(out)],
    )
    assert sim.exit_code == 0, sim.output


def test_profile_bad_input_names_the_option(model_dir: Path, tmp_path: Path) -> None:
    base = ["profile", "--model-path", str(model_dir), "--out", str(tmp_path / "c.toml")]
    r = runner.invoke(app, [*base, "--url", "ftp://x"])
    assert r.exit_code == 2 and "invalid --url='ftp://x': must be an http:// URL" in r.output
    r = runner.invoke(app, [*base, "--url", "http://x", "--lengths", "1,a"])
    assert r.exit_code == 2 and "--lengths" in r.output
    r = runner.invoke(app, [*base, "--url", "http://x", "--repeats", "0"])
    assert r.exit_code == 2 and "invalid --repeats=0: must be >= 1" in r.output
    r = runner.invoke(app, [*base, "--url", "http://127.0.0.1:9", "--model", "m"])
    assert r.exit_code == 1 and "error: profiling http://127.0.0.1:9" in r.output
