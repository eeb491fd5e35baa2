"""``conductor profile`` against a real vLLM CPU engine (the session's tiny-model engine):
the fit's residuals are reported, the engine's KV facts are read, and the cost file
round-trips."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from conductor.cli.main import app
from conductor.core.cost_file import cost_to_mapping, parse_cost_file, render_cost_file
from tests.engines.fixtures import TINY_MODEL, VllmEngine, profile_args

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
runner = CliRunner()
KV_CACHE_BYTES = 1 << 30
"""VLLM_CPU_KVCACHE_SPACE=1 (GiB), as tests/engines/fixtures.py starts engines."""


def test_profile_a_real_engine(vllm_engine: VllmEngine, tmp_path: Path) -> None:
    out = tmp_path / "cost.toml"
    plan = ["--lengths", "32,256,1024", "--repeats", "2", "--warmup", "2"]
    plan += ["--batch-sizes", "1,4", "--contexts", "64,512", *profile_args()]
    args = ["profile", "--url", vllm_engine.base_url, "--model-path", str(TINY_MODEL)]
    r = runner.invoke(app, [*args, "--out", str(out), *plan])
    assert r.exit_code == 0, r.output
    assert "prefill fit" in r.output and "decode step fit" in r.output
    assert r.output.count("rms error") == 2
    parsed = parse_cost_file(out.read_text())
    cost = parsed.cost
    assert parsed.block_size_tokens == vllm_engine.block_size == 32
    assert cost.kv_capacity_tokens == KV_CACHE_BYTES // cost.kv_bytes_per_token
    assert parsed.measured["kv_capacity_from"] == "vllm:cache_config_info"
    # 32 tokens: new only (no whole block to cache); 256 and 1024: new and two cached shares
    assert len(parsed.measured["prefill_samples"]) == 1 + 3 + 3
    assert parsed.measured["prefill_rms_error"] >= 0
    doc = cost_to_mapping(cost, measured=parsed.measured, block_size_tokens=32)
    again = parse_cost_file(render_cost_file(doc))
    assert again == parsed
    assert cost.prefill_s(1024, 0) > 0 and cost.decode_step_s(4, 2048) > 0
