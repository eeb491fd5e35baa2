"""The pure parts of the fidelity runs (bench/fidelity_parts.py): no engines, exact values."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conductor.core.cost_file import parse_cost_file
from conductor.profiling.handoff import HandoffFit, fit_handoff
from tests.engines.costs import COMMITTED
from tests.engines.fixtures import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

from fidelity_parts import (
    EngineShape,
    Scaling,
    busy_fraction,
    compare,
    ordering,
    pd_intervals,
    row_intervals,
    scale_records,
    sim_config,
    sim_rows,
    with_transfer,
)

from conductor.sim.simulator import simulate
from conductor.workload.max_tokens import MaxTokens
from conductor.workload.trace import generated_tokens, records_to_requests
from conductor.workload.trace_format import TraceRecord


def test_scaling_keeps_one_hash_id_per_engine_block_and_fits_the_context() -> None:
    s = Scaling(max_model_len=2048, max_output_tokens=64)
    long = TraceRecord(5, 40_000, 900, tuple(range(79)))
    short = TraceRecord(7, 1000, 3, (1, 2))
    a, b = scale_records([long, short], s)
    assert (a.timestamp_ms, a.input_length, a.output_length) == (5, 2048 - 64, 64)
    assert a.hash_ids == tuple(range(62))  # ceil(1984 / 32)
    assert (b.input_length, b.output_length, b.hash_ids) == (63, 1, (1, 2))


def test_scaling_refuses_a_block_mismatch() -> None:
    with pytest.raises(ValueError, match="not the engine block 32"):
        Scaling(token_scale=1 / 8)


def test_busy_fraction_is_the_union_of_intervals_in_the_window() -> None:
    spans = [("a", 0.0, 2.0), ("a", 1.0, 3.0), ("a", 6.0, 20.0), ("b", -5.0, 1.0)]
    assert busy_fraction(spans, (0.0, 10.0)) == {"a": 0.7, "b": 0.1}


def test_compare_matches_requests_by_id() -> None:
    ref = [
        {"request_id": "r0", "ttft_s": 1.0, "tbt_s": 0.1},
        {"request_id": "r1", "ttft_s": 2.0, "tbt_s": None},
        {"request_id": "r2", "ttft_s": None, "tbt_s": None},
    ]
    pred = [
        {"request_id": "r1", "ttft_s": 3.0, "tbt_s": 0.5},
        {"request_id": "r0", "ttft_s": 0.5, "tbt_s": 0.2},
    ]
    c = compare(pred, ref)
    assert c["requests_compared"] == 2
    assert c["ttft_mean_error"] == round((1.75 - 1.5) / 1.5, 4)
    assert c["ttft_per_request_abs_error"] == {"mean": 0.5, "p50": 0.5, "p90": 0.5}
    assert c["ttft_per_request_signed_mean"] == 0.0
    assert c["tbt_mean_error"] == 1.0
    assert c["pairs"] == [["r0", 0.5, 1.0], ["r1", 3.0, 2.0]]
    assert ordering({"x": 2.0, "y": 1.0, "a": 2.0}) == ["y", "a", "x"]


def test_the_simulated_slice_uses_the_engines_shape() -> None:
    cost = parse_cost_file(COMMITTED.read_text()).cost
    shape = EngineShape(2, 1024, 8, 32, 65536)
    cfg = sim_config("round_robin", cost, shape, admission="off", ttft_slo_s=30, tbt_slo_s=1)
    assert (cfg.n_both, cfg.n_prefill, cfg.n_decode) == (2, 0, 0)
    assert cfg.scheduler.block_size_tokens == 32 and cfg.engine.block_size_tokens == 32
    assert cfg.engine.max_num_seqs == 8 and cfg.engine.kv_capacity_tokens == 65536
    assert cfg.cache_capacity_tokens == 65536 and not cfg.scheduler.cpp_enabled
    assert not cfg.kv_fetch  # behind conductor serve engines reuse their own caches only
    # Two requests sharing their first block, one second apart, alternate engines; the
    # second hits nothing (round robin sent it to the other engine), TTFT = the prefill.
    records = [TraceRecord(0, 64, 4, (1, 2)), TraceRecord(1000, 64, 4, (1, 3))]
    mt = MaxTokens.parse("trace")
    reqs = records_to_requests(records, block_size_tokens=32, max_tokens=mt)
    res = simulate(reqs, cfg, outputs=generated_tokens(records, mt))
    rows = sim_rows(res.records)
    assert [r["decode"] for r in rows] == ["both-0", "both-1"]
    assert [r["prefill"] for r in rows] == ["both-0", "both-1"]  # decoded where prefilled
    assert [r["cached_tokens"] for r in rows] == [0, 0]
    assert rows[0]["ttft_s"] == pytest.approx(cost.prefill_s(64, 0), rel=1e-9)
    assert [e for e, _, _ in row_intervals(rows)] == ["both-0", "both-1"]


def test_the_pd_slice_is_one_prefill_and_one_decode_engine_and_hands_kv_over() -> None:
    cost = parse_cost_file(COMMITTED.read_text()).cost.with_(
        transfer_latency_s=0.5, transfer_bytes_per_s=1e12
    )
    shape = EngineShape(0, 1024, 8, 32, 65536, n_prefill=1, n_decode=1)
    cfg = sim_config("conductor", cost, shape, admission="off", ttft_slo_s=30, tbt_slo_s=1)
    assert (cfg.n_both, cfg.n_prefill, cfg.n_decode) == (0, 1, 1)
    records = [TraceRecord(0, 64, 4, (1, 2)), TraceRecord(5000, 64, 4, (1, 3))]
    mt = MaxTokens.parse("trace")
    reqs = records_to_requests(records, block_size_tokens=32, max_tokens=mt)
    res = simulate(reqs, cfg, outputs=generated_tokens(records, mt))
    rows = sim_rows(res.records)
    assert [(r["prefill"], r["decode"]) for r in rows] == [("prefill-0", "decode-0")] * 2
    assert [r["cached_tokens"] for r in rows] == [0, 32]  # the shared block, on prefill-0
    # the TTFT ends with the prefill; the 0.5 s transfer delays the decode, not the TTFT
    assert rows[0]["ttft_s"] == pytest.approx(cost.prefill_s(64, 0), rel=1e-9)
    rec = res.records[0]
    assert rec.decode_join_s is not None and rec.prefill_end_s is not None
    assert rec.decode_join_s == pytest.approx(rec.prefill_start_s + cost.transfer_s(64))


def test_pd_intervals_split_a_request_at_its_first_token() -> None:
    rows = [
        {"prefill": "p0", "decode": "d0", "arrival_s": 1.0, "sent_s": 1.5, "ttft_s": 2.0,
         "done_s": 6.0},
        {"prefill": "p0", "decode": "d0", "arrival_s": 2.0, "sent_s": 2.0, "ttft_s": None,
         "done_s": None},
    ]  # fmt: skip
    assert pd_intervals(rows) == [("p0", 1.5, 3.0), ("d0", 3.0, 6.0)]
    assert busy_fraction(pd_intervals(rows), (0.0, 10.0)) == {"d0": 0.3, "p0": 0.15}


def test_the_handoff_fit_sets_the_transfer() -> None:
    fit = fit_handoff([(100, 0.03), (100, 0.05), (1100, 0.14), (1100, 0.14)])
    assert fit.latency_s == pytest.approx(0.03, abs=1e-12)
    assert fit.s_per_token == pytest.approx(1e-4, rel=1e-9)
    assert (fit.n, round(fit.max_residual_s, 9)) == (4, 0.01)
    cost = parse_cost_file(COMMITTED.read_text()).cost
    moved = with_transfer(cost, fit)
    assert moved is not None
    assert moved.transfer_latency_s == pytest.approx(0.03)
    assert moved.transfer_bytes_per_s == pytest.approx(cost.kv_bytes_per_token * 1e4)
    assert moved.transfer_s(1100) == pytest.approx(fit.at(1100), rel=1e-9)
    assert with_transfer(cost, HandoffFit(0.01, -1e-5, 3, 0.0)) is None
    clamped = with_transfer(cost, HandoffFit(-0.01, 1e-5, 3, 0.0))  # whole blocks move
    assert clamped is not None and clamped.transfer_latency_s == 0.0
    with pytest.raises(ValueError, match="two prompt lengths"):
        fit_handoff([(64, 0.1), (64, 0.2)])


def test_output_scaling_defaults_by_scenario_and_names_a_bad_option() -> None:
    import types

    import fidelity

    def ns(scenario: str, scale: float | None = None, cap: int | None = None) -> object:
        return types.SimpleNamespace(scenario=scenario, output_scale=scale, max_output_tokens=cap)

    both = fidelity.output_scaling(ns("both"), 2048)
    assert (both.output_scale, both.max_output_tokens) == (0.1, 64)
    pd = fidelity.output_scaling(ns("pd"), 2048)
    assert (pd.output_scale, pd.max_output_tokens) == (0.25, 160)
    given = fidelity.output_scaling(ns("pd", 0.5, 200), 1024)
    assert (given.output_scale, given.max_output_tokens, given.max_model_len) == (0.5, 200, 1024)
    with pytest.raises(ValueError, match=r"--output-scale must be > 0, got 0"):
        fidelity.output_scaling(ns("both", 0.0), 2048)
    with pytest.raises(ValueError, match=r"--max-output-tokens must be in 1\.\.2047, got 2048"):
        fidelity.output_scaling(ns("pd", None, 2048), 2048)


def test_profile_both_in_pd_takes_the_decode_step_of_the_decode_engine(tmp_path: Path) -> None:
    """``--scenario pd --profile-both``: the prefill engine's cost file with the ``[decode]``
    fit (and its samples) of the decode engine's profile, everything else kept."""
    import tomllib

    import fidelity

    from conductor.core.cost_file import render_cost_file

    doc = tomllib.loads(COMMITTED.read_text())
    theirs = dict(doc)
    theirs["decode"] = {"form": "linear", "c0": 0.02, "c1": 0.001, "c2": 1e-6}
    theirs["measured"] = {**doc["measured"], "decode_rms_error": 0.5}
    decode_file = tmp_path / "cost-d0.toml"
    decode_file.write_text(render_cost_file(theirs))
    out = fidelity.decode_step_from(decode_file, COMMITTED, tmp_path)
    mine, got = parse_cost_file(COMMITTED.read_text()).cost, parse_cost_file(out.read_text()).cost
    assert got.decode_step_s(4, 1000) == pytest.approx(0.02 + 0.004 + 0.001)
    assert got.prefill_s(1000, 200) == mine.prefill_s(1000, 200)
    assert got.kv_capacity_tokens == mine.kv_capacity_tokens
    measured = tomllib.loads(out.read_text())["measured"]
    assert measured["decode_rms_error"] == 0.5
    assert "decode engine's own profile" in measured["decode"]
