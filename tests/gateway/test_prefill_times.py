"""The prefill durations the gateway observes (``gateway/prefill_times.py``) and what the
scheduler's online correction learns from them through a flight's ``PrefillFinished``."""

from __future__ import annotations

import pytest

from conductor.core.config import SchedulerConfig
from conductor.core.plan import Plan
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceSpec
from conductor.core.types import InstanceId, Request, RequestId, Role
from conductor.gateway.flight import Flight, Mode
from conductor.gateway.metrics import GatewayMetrics
from conductor.gateway.prefill_times import PrefillTimes
from tests.engines.costs import committed_cost
from tests.gateway.test_gateway_hold import MODEL, ManualClock

E = InstanceId("e")


def test_a_prefill_counts_from_its_dispatch_or_the_engines_previous_end() -> None:
    t = PrefillTimes()
    assert t.duration_s(E, 0.0, 0.1) == pytest.approx(0.1)  # alone on the engine
    assert t.duration_s(E, 0.05, 0.25) == pytest.approx(0.15)  # queued behind the first
    assert t.duration_s(E, 1.0, 1.2) == pytest.approx(0.2)  # the engine was idle since 0.25
    assert t.duration_s(E, 0.5, 1.1) == 0.0  # ended before the engine's last end: no time
    assert t.duration_s(InstanceId("other"), 0.5, 0.6) == pytest.approx(0.1)


def _flight(clock: ManualClock, times: PrefillTimes) -> tuple[Scheduler, Flight]:
    s = Scheduler(committed_cost(), policy="conductor", config=SchedulerConfig())
    s.add_instance(InstanceSpec(InstanceId("p"), Role.PREFILL, pulls_kv=False))
    s.add_instance(InstanceSpec(InstanceId("d"), Role.DECODE, pulls_kv=False))
    plan = s.schedule(Request(RequestId("a"), 400, (), 4, arrival_s=clock()), clock())
    assert isinstance(plan, Plan)
    metrics = GatewayMetrics().pool(MODEL)
    flight = Flight(
        s, plan, Mode.DISAGGREGATED, clock=clock, metrics=metrics, scheduled_at_s=clock(),
        prefill_times=times, dispatched_at_s=clock(),
    )  # fmt: skip
    return s, flight


def test_an_observed_prefill_twice_as_slow_as_the_model_doubles_its_prediction() -> None:
    clock, times = ManualClock(), PrefillTimes()
    s, flight = _flight(clock, times)
    nominal = s.cost.prefill_s(400, 0)
    clock.now_s += 2 * nominal
    flight.first_token()
    assert s.correction.prefill_factor(InstanceId("p")) == pytest.approx(2.0)
    assert s.cost.prefill_s(400, 0) == pytest.approx(2 * nominal)


def test_an_assumed_prefill_end_teaches_nothing() -> None:
    """A non-streamed aggregated answer's prefill end is assumed at its predicted time: it
    frees the engine's queue but is no observation."""
    clock, times = ManualClock(), PrefillTimes()
    s, flight = _flight(clock, times)
    clock.now_s += 5.0
    flight._assumed_prefill_end()
    assert flight.prefill_done
    assert s.correction.prefill_factor(InstanceId("p")) == 1.0
