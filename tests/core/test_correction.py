"""Online cost correction: exact factors from hand-made observations."""

from __future__ import annotations

import pytest

from conductor.core.correction import (
    FACTOR_BOUNDS,
    CostCorrection,
    ScaledDecode,
    ScaledPrefill,
    apply_engine_load,
)
from conductor.core.events import DecodeStepsObserved, EngineLoad, PrefillFinished
from conductor.core.plan import Plan
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceSpec
from conductor.core.types import RequestId, Role

from .helpers import LINEAR_COST, hashes, iid, make_conductor, req


def test_factor_is_the_ewma_ratio_of_observed_to_nominal_seconds() -> None:
    c = CostCorrection(LINEAR_COST, weight=0.5)
    p0 = iid("p0")
    c.observe_prefill(p0, 1000, 0, 1.3)  # nominal 1.0 s (1 ms per new token)
    assert c.prefill_factor(p0) == pytest.approx(1.3)
    c.observe_prefill(p0, 2000, 0, 2.0)  # nominal 2.0 s: S_obs = 1.65, S_nom = 1.5
    assert c.prefill_factor(p0) == pytest.approx(1.1)
    assert isinstance(c.cost.prefill, ScaledPrefill)
    assert c.cost.prefill_s(1000, 0) == pytest.approx(1.1)
    assert c.cost.decode is LINEAR_COST.decode  # decode not observed: unchanged


def test_cached_tokens_are_priced_as_reused() -> None:
    c = CostCorrection(LINEAR_COST)
    c.observe_prefill(iid("p0"), 1000, 600, 0.4)  # 400 new tokens: nominal 0.4 s
    assert c.prefill_factor(iid("p0")) == 1.0
    assert c.cost is LINEAR_COST


def test_observations_and_factors_are_clamped_and_rounded() -> None:
    c = CostCorrection(LINEAR_COST, weight=1.0)
    c.observe_prefill(iid("p0"), 1000, 0, 100.0)
    assert c.prefill_factor(iid("p0")) == FACTOR_BOUNDS[1]
    c.observe_prefill(iid("p0"), 1000, 0, 1.0034)  # 0.34% off: below the 1% step
    assert c.prefill_factor(iid("p0")) == 1.0
    assert c.cost is not LINEAR_COST  # ... but a new model object only when it changed


def test_decode_factor_from_iteration_statistics() -> None:
    c = CostCorrection(LINEAR_COST)
    d0 = iid("d0")
    # 4 iterations at batch 2, context 0: nominal 4 x (10 + 2) ms = 48 ms; observed 60 ms
    c.observe_decode(DecodeStepsObserved(d0, 4, 0.060, 8, 0, 1.0))
    assert c.decode_factor(d0) == 1.25
    assert isinstance(c.cost.decode, ScaledDecode)
    assert c.cost.decode_step_s(2, 0) == pytest.approx(0.015)


def test_pool_factor_is_the_geometric_mean_of_instances() -> None:
    c = CostCorrection(LINEAR_COST)
    c.observe_prefill(iid("p0"), 1000, 0, 2.0)
    c.observe_prefill(iid("p1"), 1000, 0, 0.5)
    assert (c.prefill_factor(iid("p0")), c.prefill_factor(iid("p1"))) == (2.0, 0.5)
    assert c.cost.prefill_s(1000, 0) == pytest.approx(1.0)


def _place(s: Scheduler, rid: str, tokens: int, now: float = 0.0) -> Plan:
    plan = s.schedule(req(rid, hashes(), tokens), now)
    assert isinstance(plan, Plan)
    return plan


def test_scheduler_learns_from_prefill_finished_and_predicts_with_it() -> None:
    s = make_conductor(1, 1, policy="least_loaded")
    plan = _place(s, "a", 1000)
    assert plan.prefill_s == pytest.approx(1.0)
    s.on_event(PrefillFinished(RequestId("a"), plan.prefill, 1.5, 1.5, 0))
    assert s.correction.prefill_factor(plan.prefill) == 1.5
    assert _place(s, "b", 1000).prefill_s == pytest.approx(1.5)
    # a report without the duration teaches nothing
    s.on_event(PrefillFinished(RequestId("b"), plan.prefill, 3.0))
    assert s.correction.prefill_factor(plan.prefill) == 1.5


def test_no_correction_keeps_the_nominal_model() -> None:
    s = make_conductor(1, 1, policy="least_loaded", cost_correction=False)
    plan = _place(s, "a", 1000)
    s.on_event(PrefillFinished(RequestId("a"), plan.prefill, 1.5, 1.5, 0))
    s.on_event(DecodeStepsObserved(iid("d0"), 4, 1.0, 8, 0, 2.0))
    assert s.cost is LINEAR_COST
    assert _place(s, "b", 1000).prefill_s == pytest.approx(1.0)


def test_removed_instances_leave_the_pool_mean() -> None:
    s = make_conductor(2, 1, policy="least_loaded")
    s.correction.observe_prefill(iid("p0"), 1000, 0, 2.0)
    s.correction.observe_prefill(iid("p1"), 1000, 0, 1.0)
    assert s.correction.cost.prefill_s(1000, 0) == pytest.approx(1.41)
    s.remove_instance(iid("p0"))
    s.on_event(PrefillFinished(RequestId("x"), iid("p1"), 1.0))  # any event prunes
    assert s.cost.prefill_s(1000, 0) == pytest.approx(1.0)


def test_engine_load_reanchors_or_raises_the_prefill_queue() -> None:
    s = make_conductor(1, 1, policy="least_loaded", cost_correction=False)
    p0 = s.instances[iid("p0")]
    p0.prefill.busy_until_s = 5.0  # a stale estimate: no request left, time still queued
    s.on_event(EngineLoad(iid("p0"), 0, 0, 0.0, 2.0))
    assert p0.prefill.queue_s(2.0) == 0.0
    _place(s, "a", 1000, now=2.0)  # 1 s queued
    s.on_event(EngineLoad(iid("p0"), 1, 2, 0.5, 2.0))  # the engine has 3 requests: 3 x 1 s
    assert p0.prefill.queue_s(2.0) == pytest.approx(3.0)
    s.on_event(EngineLoad(iid("p0"), 1, 2, 0.5, 2.0))  # idempotent
    assert p0.prefill.queue_s(2.0) == pytest.approx(3.0)
    d0 = s.instances[iid("d0")]
    before = (d0.decode.batch_size, d0.decode.kv_reserved_tokens)
    apply_engine_load(d0, EngineLoad(iid("d0"), 9, 9, 0.9, 0.0), LINEAR_COST)
    assert (d0.decode.batch_size, d0.decode.kv_reserved_tokens) == before


def test_engine_load_of_an_engine_that_also_decodes_counts_only_waiting() -> None:
    s = make_conductor(0, 0, policy="least_loaded", cost_correction=False)
    s.add_instance(InstanceSpec(iid("b0"), Role.BOTH))
    b0 = s.instances[iid("b0")]
    s.on_event(EngineLoad(iid("b0"), 7, 0, 0.5, 1.0))  # 7 decoding, none waiting
    assert b0.prefill.queue_s(1.0) == 0.0
    s.on_event(EngineLoad(iid("b0"), 7, 2, 0.5, 1.0))
    assert b0.prefill.queue_s(1.0) == pytest.approx(2 * LINEAR_COST.prefill_s(2048, 0))
