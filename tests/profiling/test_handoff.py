"""The hand-off's fit and its reading as the cost model's transfer
(:mod:`conductor.profiling.handoff`), and the profile options that ask for it."""

from __future__ import annotations

import pytest

from conductor.core.costmodel import preset
from conductor.core.errors import InvalidInput
from conductor.profiling.config import ProfileConfig
from conductor.profiling.handoff import (
    HandoffFit,
    HandoffSample,
    fit_handoff,
    kv_moves,
    per_length_medians,
    transfer_of,
)
from conductor.profiling.measure import planned_steps


def test_the_fit_is_the_line_through_the_samples() -> None:
    fit = fit_handoff([(100, 0.012), (100, 0.012), (1100, 0.112), (600, 0.062)])
    assert fit.latency_s == pytest.approx(0.002)
    assert fit.s_per_token == pytest.approx(1e-4)
    assert (fit.n, fit.max_residual_s) == (4, pytest.approx(0.0, abs=1e-12))
    assert fit.at(2000) == pytest.approx(0.202)
    with pytest.raises(ValueError, match="two prompt lengths"):
        fit_handoff([(64, 0.1), (64, 0.2)])


def test_the_transfer_is_a_tokens_kv_bytes_over_the_slope() -> None:
    # 1,024 KV bytes a token moved in 0.1 ms: 10.24 MB/s, latency the intercept
    assert transfer_of(HandoffFit(0.002, 1e-4, 4, 0.0), 1024) == pytest.approx((1.024e7, 0.002))
    assert transfer_of(HandoffFit(0.002, -1e-6, 4, 0.0), 1024) is None
    # below zero (whole blocks move, the last partial one is computed on decode): latency 0
    assert transfer_of(HandoffFit(-0.001, 1e-4, 4, 0.0), 1024) == pytest.approx((1.024e7, 0.0))


def test_a_sample_is_the_gateway_ttft_less_the_prefill_engines() -> None:
    assert HandoffSample(256, 0.030, 0.045).handoff_s == pytest.approx(0.015)


def test_the_line_goes_through_the_median_of_each_length() -> None:
    """A one-second stall of one P/D request moves its sample, not the median."""
    samples = [
        HandoffSample(512, 0.03, 0.09),
        HandoffSample(64, 0.02, 0.03),
        HandoffSample(512, 0.03, 1.09),
        HandoffSample(64, 0.02, 0.04),
        HandoffSample(64, 0.02, 0.035),
        HandoffSample(512, 0.03, 0.10),
    ]
    medians = per_length_medians(samples)
    assert medians == [(64, pytest.approx(0.015)), (512, pytest.approx(0.07))]
    fit = fit_handoff(medians)
    assert fit.s_per_token == pytest.approx(0.055 / 448)


def test_the_hand_off_options_are_checked() -> None:
    base = "http://127.0.0.1:1"
    with pytest.raises(InvalidInput, match="handoff_url"):
        ProfileConfig(base, handoff_url="https://gw")
    with pytest.raises(InvalidInput, match="handoff_lengths"):
        ProfileConfig(base, handoff_url=base, handoff_lengths=(64, 64))
    with pytest.raises(InvalidInput, match="handoff_lengths"):
        ProfileConfig(base, handoff_lengths=(0, 64))
    with pytest.raises(InvalidInput, match="handoff_samples"):
        ProfileConfig(base, handoff_samples=0)
    plain = ProfileConfig(base)
    asked = ProfileConfig(base, handoff_url=base, handoff_lengths=(64, 256), handoff_samples=2)
    # one unmeasured round and two measured, per length
    assert planned_steps(asked) - planned_steps(plain) == 3 * 2


def test_the_kv_move_is_the_hand_off_less_the_profiled_decode_step() -> None:
    """The simulator (``--first-token decode``) and the scheduler add the decode engine's
    first step themselves, so the transfer fitted is the hand-off without it."""
    cost = preset("llama3-8b-h100")
    medians = [(64, 0.05), (1024, 0.2)]
    moves = kv_moves(medians, cost)
    assert moves == [
        (64, 0.05 - cost.decode_step_s(1, 64)),
        (1024, 0.2 - cost.decode_step_s(1, 1024)),
    ]
