"""Early rejection based on prediction (arXiv §7.4): exact decisions on hand-built clusters."""

from __future__ import annotations

import pytest

from conductor.core.admission import DecodeForecast
from conductor.core.costmodel import LinearDecode
from conductor.core.events import PrefillFinished, RequestFinished
from conductor.core.plan import Plan, Rejection
from conductor.core.types import RequestId

from .helpers import LINEAR_COST, iid, make_conductor, req

# decode step = 10 ms + 10 ms per request; SLO 35 ms -> at most 2 requests per instance
COST = LINEAR_COST.with_(decode=LinearDecode(0.010, 0.010, 0.0))


def test_forecast_membership_and_load() -> None:
    f = DecodeForecast()
    f.add(RequestId("a"), iid("d0"), start_s=1.0, duration_s=10.0, context_tokens=100)
    f.add(RequestId("b"), iid("d0"), start_s=5.0, duration_s=10.0, context_tokens=50)
    assert f.membership_at(0.5) == {}
    assert f.membership_at(6.0) == {iid("d0"): (2, 150)}
    assert f.membership_at(12.0) == {iid("d0"): (1, 50)}
    f.started(RequestId("b"), 3.0)  # prefill ended earlier than predicted
    assert f.membership_at(12.5) == {iid("d0"): (1, 50)}
    assert f.membership_at(13.5) == {}
    f.remove(RequestId("a"))
    assert len(f) == 1


def test_predictive_accepts_what_early_rejects() -> None:
    """Two requests already hold decode d0 but finish (t_d = 1 s) before the new request's
    prefill ends; early rejection counts them, the prediction does not."""
    early = make_conductor(1, 1, cost=COST, admission="early", tbt_slo_s=0.0525, decode_time_s=1.0)
    pred = make_conductor(
        1, 1, cost=COST, admission="predictive", tbt_slo_s=0.0525, decode_time_s=1.0
    )
    for c in (early, pred):
        for name in ("a", "b"):
            d = c.schedule(req(name, (), 10), 0.0)  # 10 ms prefill each
            assert isinstance(d, Plan)
            c.on_event(PrefillFinished(RequestId(name), iid("p0"), 0.02))
        c.instances[iid("p0")].prefill.assign(RequestId("long"), 2.0, 0, 0.0)
    # new request: TTFT = 2 s queue + 10 ms; a and b are predicted gone after 1.02 s
    r_early = early.schedule(req("c", (), 10), 0.05)
    r_pred = pred.schedule(req("c", (), 10), 0.05)
    assert isinstance(r_early, Rejection) and r_early.code == "tbt_slo"
    assert isinstance(r_pred, Plan)
    assert r_pred.predicted_ttft_s == pytest.approx(1.97 + 0.01)


def test_predictive_rejects_when_decode_will_be_full() -> None:
    c = make_conductor(
        1, 1, cost=COST, admission="predictive", tbt_slo_s=0.0525, decode_time_s=100.0
    )
    for name in ("a", "b"):
        assert isinstance(c.schedule(req(name, (), 10), 0.0), Plan)
    r = c.schedule(req("c", (), 10), 0.0)
    assert isinstance(r, Rejection) and r.code == "tbt_slo"
    assert r.predicted_tbt_s == pytest.approx(0.060)
    c.on_event(RequestFinished(RequestId("a"), iid("d0"), 1.0))
    assert isinstance(c.schedule(req("c", (), 10), 1.0), Plan)
