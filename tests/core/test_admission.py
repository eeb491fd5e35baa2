"""Admission (arXiv §7): early (current load), reserve (assigned load) and predictive (the
forecast over the decode window), exact decisions on hand-built clusters."""

from __future__ import annotations

import pytest

from conductor.core.costmodel import LinearDecode
from conductor.core.events import PrefillFinished, RequestFinished
from conductor.core.forecast import DecodeForecast
from conductor.core.output_length import LengthHistogram, OutputEstimate
from conductor.core.plan import Plan, Rejection
from conductor.core.scheduler import Scheduler
from conductor.core.types import RequestId

from .helpers import LINEAR_COST, iid, make_conductor, req

# decode step = 10 ms + 10 ms per request; SLO 35 ms -> at most 2 requests per instance
COST = LINEAR_COST.with_(decode=LinearDecode(0.010, 0.010, 0.0))
SLO = 0.0525
TEN = {"output_prior_tokens": 10}  # every request is predicted to generate 10 tokens


def _at(c: Scheduler, name: str, now: float, prefill_end: float | None = None) -> Plan:
    d = c.schedule(req(name, (), 10), now)
    assert isinstance(d, Plan), d
    if prefill_end is not None:
        c.on_event(PrefillFinished(RequestId(name), iid("p0"), prefill_end))
    return d


def test_a_running_request_stays_in_the_forecast_past_its_predicted_end() -> None:
    """Predicted 10 tokens at 0.1 s/token (end 1.0 s); at 5 s it is still decoding, so it is
    still there, for what the distribution says such a request has left."""
    f = DecodeForecast(token_s=0.1)
    lengths = LengthHistogram(prior_tokens=10)
    f.add(RequestId("a"), iid("d0"), 0.0, 100, OutputEstimate(10.0, 10.0, 1000), started=True)
    pool = make_conductor(1, 1).pools()[1]
    (w,) = f.window(5.0, 5.0, 6.0, pool, 50, COST, lengths)
    # 50 tokens produced, more than anything observed: half that again, 2.5 s more; the step
    # reads its mean context over that rest (100 + 50 + 25 / 2), the KV check its end (175)
    assert (w.peak_batch, w.peak_context_tokens, w.max_kv_tokens) == (2, 162, 175)
    assert f.end_s(RequestId("a"), f._entries[RequestId("a")], 5.0, lengths) == pytest.approx(7.5)


def test_window_sees_requests_that_join_later() -> None:
    f = DecodeForecast(token_s=0.1)
    lengths = LengthHistogram(prior_tokens=10)
    f.add(RequestId("a"), iid("d0"), 2.0, 100, OutputEstimate(10.0, 10.0, 1000))
    f.add(RequestId("b"), iid("d0"), 3.5, 100, OutputEstimate(10.0, 10.0, 1000))
    pool = make_conductor(1, 1).pools()[1]
    (w,) = f.window(0.0, 1.0, 3.0, pool, 7, COST, lengths)  # a joins at 2 s; b after the window
    # a's mean context while it decodes: 100 + 10 / 2; its KV at its end: 110
    assert (w.peak_batch, w.peak_context_tokens, w.step_at_t0_s) == (2, 105, 0.0)
    assert w.max_kv_tokens == 110
    (w,) = f.window(0.0, 1.0, 4.0, pool, 7, COST, lengths)  # both overlap (a ends at 3 s: no)
    assert (w.peak_batch, w.max_batch) == (2, 1)


def test_forecast_learns_the_time_per_token() -> None:
    f = DecodeForecast(token_s=0.1, learning_rate=0.5)
    f.add(RequestId("a"), iid("d0"), 0.0, 10, OutputEstimate(10.0, 10.0, 100), started=True)
    f.finished(RequestId("a"), 3.0, 11)  # 10 decode steps in 3 s
    assert f.token_s == pytest.approx(0.2) and len(f) == 0


def test_early_counts_running_requests_reserve_counts_assigned_ones() -> None:
    """Two requests are assigned to d0 but still in prefill: the paper's early rejection
    (current load) admits a third, the reserve-at-arrival variant does not."""
    early = make_conductor(1, 1, cost=COST, admission="early", tbt_slo_s=SLO, **TEN)
    reserve = make_conductor(1, 1, cost=COST, admission="reserve", tbt_slo_s=SLO, **TEN)
    for c in (early, reserve):
        _at(c, "a", 0.0)
        _at(c, "b", 0.0)
    assert isinstance(early.schedule(req("c", (), 10), 0.0), Plan)
    r = reserve.schedule(req("c", (), 10), 0.0)
    assert isinstance(r, Rejection) and r.code == "tbt_slo"
    # once both run, early sees them too
    early2 = make_conductor(1, 1, cost=COST, admission="early", tbt_slo_s=SLO, **TEN)
    _at(early2, "a", 0.0, 0.01)
    _at(early2, "b", 0.0, 0.02)
    r = early2.schedule(req("c", (), 10), 0.03)
    assert isinstance(r, Rejection) and r.code == "tbt_slo"
    assert r.predicted_tbt_s == pytest.approx(0.040 * 1.5)


def test_predictive_counts_the_new_request_from_its_admission() -> None:
    """a and b decode on d0 now and are predicted done (10 tokens x 52.5 ms) before the new
    request's prefill ends behind a 2 s queue. Its decode instance is booked from now, when
    a and b still run: three at once, rejected, as early rejects it (a forecast from its
    decode start on, the rule before, admitted it)."""
    pred = make_conductor(1, 1, cost=COST, admission="predictive", tbt_slo_s=SLO, **TEN)
    early = make_conductor(1, 1, cost=COST, admission="early", tbt_slo_s=SLO, **TEN)
    for c in (pred, early):
        _at(c, "a", 0.0, 0.01)
        _at(c, "b", 0.0, 0.02)
        c.instances[iid("p0")].prefill.assign(RequestId("long"), 2.0, 0, 0.0)
    assert isinstance(early.schedule(req("c", (), 10), 0.05), Rejection)
    r = pred.schedule(req("c", (), 10), 0.05)
    assert isinstance(r, Rejection) and r.code == "tbt_slo"
    assert r.predicted_tbt_s == pytest.approx(0.040 * 1.5)
    assert r.reason.startswith("forecast to t+")


def test_predictive_accepts_when_a_member_leaves_before_the_next_joins() -> None:
    """a decodes on d0 now, predicted done at 0.535 s; b is assigned to d0 but its prefill
    waits behind a 1 s one. Reserve counts all three; the forecast sees at most two at once
    (a and the new request, then b and the new request) and admits."""
    pred = make_conductor(1, 1, cost=COST, admission="predictive", tbt_slo_s=SLO, **TEN)
    reserve = make_conductor(1, 1, cost=COST, admission="reserve", tbt_slo_s=SLO, **TEN)
    for c in (pred, reserve):
        _at(c, "a", 0.0, 0.01)
        c.instances[iid("p0")].prefill.assign(RequestId("long"), 1.0, 0, 0.01)
        _at(c, "b", 0.02)
    assert isinstance(reserve.schedule(req("c", (), 10), 0.05), Rejection)
    plan = pred.schedule(req("c", (), 10), 0.05)
    assert isinstance(plan, Plan) and plan.decode == iid("d0")
    assert pred.instances[iid("d0")].decode.batch_size == 3


def test_predictive_rejects_when_the_window_will_be_full() -> None:
    c = make_conductor(1, 1, cost=COST, admission="predictive", tbt_slo_s=SLO, **TEN)
    _at(c, "a", 0.0)
    _at(c, "b", 0.0)
    r = c.schedule(req("c", (), 10), 0.0)
    assert isinstance(r, Rejection) and r.code == "tbt_slo"
    assert r.predicted_tbt_s == pytest.approx(0.040 * 1.5)
    c.on_event(RequestFinished(RequestId("a"), iid("d0"), 1.0, 10))
    assert isinstance(c.schedule(req("c", (), 10), 1.0), Plan)


def test_predictive_commits_to_the_instance_it_checked() -> None:
    """d0 holds two requests whose prefills end at 5 s, long after the new one is done; d1
    runs one now. The decode policy alone (assigned load) would take d1; the forecast sees
    d0 empty over the new request's life and takes it -- and the plan commits to d0."""
    c = make_conductor(1, 2, cost=COST, admission="predictive", tbt_slo_s=SLO, **TEN)
    ten = OutputEstimate(10.0, 10.0, 1000)
    for name, inst, start, running in (("x1", "d0", 5.0, False), ("x2", "d0", 5.0, False),
                                       ("y", "d1", 0.01, True)):  # fmt: skip
        c.instances[iid(inst)].decode.admit(RequestId(name), 10, 10, started=running)
        c.forecast.add(RequestId(name), iid(inst), start, 10, ten, started=running)
    ctx = c.context(req("c", (), 10), 0.05)
    assert ctx is not None
    plain = c.decode_policy.choose_decode(ctx, ctx.local_choice(c.instances[iid("p0")]))
    assert plain.instance == iid("d1")
    plan = c.schedule(req("c", (), 10), 0.05)
    assert isinstance(plan, Plan) and plan.decode == iid("d0")
    assert plan.predicted_tbt_s == pytest.approx(0.020 * 1.5)
    assert c.instances[iid("d0")].decode.batch_size == 3
