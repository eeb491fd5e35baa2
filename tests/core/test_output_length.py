"""The output-length predictor: prior, learning, caps, conditional remaining length, decay."""

from __future__ import annotations

import pytest

from conductor.core.config import SchedulerConfig
from conductor.core.errors import InvalidInput
from conductor.core.events import PrefillFinished, RequestFinished
from conductor.core.output_length import LengthHistogram, OracleLengths, output_cap
from conductor.core.plan import Plan
from conductor.core.types import Request, RequestId

from .helpers import iid, make_conductor, req

R = RequestId("r")


def test_prior_then_observations() -> None:
    h = LengthHistogram(prior_tokens=256, prior_weight=4.0)
    assert h.mean() == 256 and h.quantile(0.9) == 256
    for _ in range(4):
        h.observe(R, 100)
    assert h.mean() == pytest.approx((4 * 256 + 4 * 100) / 8)
    assert h.quantile(0.25) == 100 and h.quantile(0.9) == 256


def test_the_cap_bounds_the_mean_and_quantile() -> None:
    h = LengthHistogram(prior_tokens=10, prior_weight=1.0)
    h.observe(R, 1000)  # weights: 10 (1), 1000 (1)
    assert h.mean() == pytest.approx(505)
    assert h.mean(cap=100) == pytest.approx((10 + 100) / 2)
    assert h.quantile(0.9, cap=100) == 100
    est = h.estimate(Request(R, 5, (), max_tokens=50), cap=50)
    assert (est.mean, est.high, est.cap) == (pytest.approx(30.0), 50, 50)


def test_remaining_is_conditional_on_what_was_generated() -> None:
    h = LengthHistogram(prior_tokens=10, prior_weight=1.0)
    h.observe(R, 1000)
    assert h.remaining(R, 5, cap=10_000) == pytest.approx(((10 + 1000) / 2) - 5)
    assert h.remaining(R, 200, cap=10_000) == pytest.approx(800)  # only the 1000 is left
    assert h.remaining(R, 200, cap=500) == pytest.approx(300)  # ... but capped
    assert h.remaining(R, 4000, cap=100_000) == pytest.approx(2000)  # past all: half again


def test_history_halves_at_the_window_so_memory_is_bounded() -> None:
    h = LengthHistogram(prior_tokens=10, prior_weight=1.0, max_weight=8.0)
    for _ in range(100):
        h.observe(R, 500)
    assert h.weight <= 8.0
    assert h.mean() == pytest.approx(500, rel=0.01)  # the prior has faded


def test_oracle_knows_each_request() -> None:
    o = OracleLengths({R: 42}, LengthHistogram())
    assert o.estimate(Request(R, 5, ()), cap=1000).mean == 42
    assert o.estimate(Request(R, 5, ()), cap=10).mean == 10
    assert o.remaining(R, 40, cap=1000) == 2
    assert o.estimate(Request(RequestId("other"), 5, ()), cap=1000).mean == 256


def test_output_cap_is_max_tokens_within_the_context() -> None:
    assert output_cap(Request(R, 100, ()), 1000) == 900
    assert output_cap(Request(R, 100, (), max_tokens=50), 1000) == 50
    assert output_cap(Request(R, 100, (), max_tokens=5000), 1000) == 900


def test_scheduler_learns_from_request_finished() -> None:
    c = make_conductor(1, 1, output_prior_tokens=10, output_prior_weight=1.0)
    plan = c.schedule(req("a", (), 8), 0.0)
    assert isinstance(plan, Plan)
    c.on_event(PrefillFinished(RequestId("a"), iid("p0"), 0.01))
    c.on_event(RequestFinished(RequestId("a"), iid("d0"), 1.0, 1000))
    ctx = c.context(req("b", (), 8), 1.0)
    assert ctx is not None and ctx.output.mean == pytest.approx(505)
    # a request's max_tokens caps its prediction
    ctx = c.context(req("c", (), 8, max_tokens=20), 1.0)
    assert ctx is not None and ctx.output.mean == pytest.approx(15)


def test_bad_predictor_settings_are_named() -> None:
    with pytest.raises(InvalidInput, match=r"output_high_quantile=1\.5"):
        SchedulerConfig(output_high_quantile=1.5)
    with pytest.raises(InvalidInput, match="context_tokens=1"):
        SchedulerConfig(context_tokens=1)


def test_tables_kept_by_each_observation_answer_after_a_halving() -> None:
    # prior 2 tokens x 2; then 4, 16, 16, 64, 64, 64, 256 (weight 9 > 8: every bucket
    # halves to 2:1, 4:0.5, 16:1, 64:1.5, 256:0.5), then 256 again (256:1.5); total 5.5
    h = LengthHistogram(prior_tokens=2, prior_weight=2.0, max_weight=8.0)
    for tokens in (4, 16, 16, 64, 64, 64, 256, 256):
        h.observe(R, tokens)
    assert h.weight == 5.5
    assert h.mean() == 500 / 5.5  # 2*1 + 4*0.5 + 16*1 + 64*1.5 + 256*1.5
    assert h.mean(cap=16) == (2 + 2 + 16 * 4) / 5.5
    # cumulative weights 1, 1.5, 2.5, 4, 5.5: each quantile is the first bucket reaching it
    qs = (0.0, 0.1, 0.2, 0.4, 0.7, 0.8, 1.0)
    assert [h.quantile(q) for q in qs] == [2, 2, 4, 16, 64, 256, 256]
    assert h.remaining(R, 20, cap=100_000) == 480 / 3 - 20  # the 64s and 256s are left
