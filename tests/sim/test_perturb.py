"""Engines that deviate from the scheduler's cost model (sim/perturb.py), and the scheduler
learning the deviation online."""

from __future__ import annotations

import math
import statistics

import pytest

from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import preset
from conductor.core.errors import InvalidInput
from conductor.core.types import InstanceId, RequestId
from conductor.sim import SimConfig, simulate
from conductor.sim.perturb import EngineCost
from conductor.sim.simulator import _Simulation
from conductor.workload.trace import (
    bundled_trace_path,
    generated_tokens,
    read_trace,
    records_to_requests,
)

COST = preset("llama3-70b-a800x8")


def test_exact_engines_run_the_nominal_model() -> None:
    e = EngineCost(COST, bias=0.0, error=0.0, seed=1)
    assert e.exact
    assert e.prefill_s(RequestId("r"), 8192, 512) == COST.prefill_s(8192, 512)
    assert e.decode_step_s(4, 9000, 4.0) == COST.decode_step_s(4, 9000)


def test_bias_scales_every_job() -> None:
    e = EngineCost(COST, bias=0.3, error=0.0, seed=1)
    assert e.prefill_s(RequestId("r"), 8192, 0) == pytest.approx(1.3 * COST.prefill_s(8192, 0))
    assert e.decode_step_s(4, 9000, 4.0) == pytest.approx(1.3 * COST.decode_step_s(4, 9000))
    faster = EngineCost(COST, bias=-0.2, error=0.0, seed=1)
    assert faster.prefill_s(RequestId("r"), 100, 0) == pytest.approx(0.8 * COST.prefill_s(100, 0))


def test_error_is_per_request_seeded_and_mean_preserving() -> None:
    e = EngineCost(COST, bias=0.0, error=0.3, seed=7)
    f = [e.job_factor(RequestId(str(i))) for i in range(20_000)]
    assert f[:3] == [e.job_factor(RequestId(str(i))) for i in range(3)]  # deterministic
    assert EngineCost(COST, bias=0.0, error=0.3, seed=8).job_factor(RequestId("0")) != f[0]
    assert statistics.fmean(f) == pytest.approx(1.0, abs=0.01)  # mean 1 ...
    assert statistics.median(f) == pytest.approx(math.exp(-0.045), abs=0.01)  # median e^-s^2/2
    assert statistics.pstdev([math.log(x) for x in f]) == pytest.approx(0.3, abs=0.01)
    # a decode iteration takes its batch's mean factor
    a, b = e.job_factor(RequestId("0")), e.job_factor(RequestId("1"))
    step = e.decode_step_s(2, 1000, a + b)
    assert step == pytest.approx(COST.decode_step_s(2, 1000) * (a + b) / 2)


def test_bad_values_are_refused() -> None:
    with pytest.raises(InvalidInput, match=r"cost_error=-1"):
        SimConfig(cost_error=-1)
    with pytest.raises(InvalidInput, match=r"cost_bias=-1"):
        SimConfig(cost_bias=-1.0)


def _requests(n: int) -> tuple[list, list[int]]:  # type: ignore[type-arg]
    records = read_trace(bundled_trace_path(), limit=n).records
    return records_to_requests(records), generated_tokens(records)


def test_the_scheduler_learns_a_uniform_bias_exactly() -> None:
    cfg = SimConfig(policy="mooncake", n_prefill=2, n_decode=2, cost_bias=0.3)
    requests, outputs = _requests(300)
    sim = _Simulation(requests, cfg, outputs)
    sim.run(None)
    c = sim.scheduler.correction
    for i in range(2):
        assert c.prefill_factor(InstanceId(f"prefill-{i}")) == 1.3
        assert c.decode_factor(InstanceId(f"decode-{i}")) == 1.3
    assert sim.scheduler.cost.prefill_s(8192, 0) == pytest.approx(1.3 * COST.prefill_s(8192, 0))


def test_exact_engines_leave_the_scheduler_uncorrected() -> None:
    requests, outputs = _requests(300)
    sim = _Simulation(requests, SimConfig(policy="mooncake", n_prefill=2, n_decode=2), outputs)
    sim.run(None)
    assert sim.scheduler.cost is COST
    # without late binding: a prefill that runs alone (as late binding has them) is chunked
    # into more engine steps than the nominal model counts (one per-pass overhead each), a
    # true 1% deviation the correction learns
    alone = {"late_binding": 0.0}
    on_cfg = SimConfig(
        policy="conductor",
        n_prefill=2,
        n_decode=2,
        scheduler=SchedulerConfig(policy_params=alone),
    )
    on = simulate(requests, on_cfg, outputs=outputs).summary
    off_cfg = SimConfig(
        policy="conductor",
        n_prefill=2,
        n_decode=2,
        scheduler=SchedulerConfig(cost_correction=False, policy_params=alone),
    )
    off = simulate(requests, off_cfg, outputs=outputs).summary
    for key in ("ttft_s", "tbt_ms", "slo_attainment", "rejected", "goodput_rps"):
        assert on[key] == off[key], key


def test_correction_lowers_the_ttft_error_of_slow_engines() -> None:
    requests, outputs = _requests(1500)
    runs = {}
    for correction in (True, False):
        cfg = SimConfig(
            policy="mooncake",
            n_prefill=3,
            n_decode=3,
            cost_bias=0.5,
            cost_error=0.2,
            scheduler=SchedulerConfig(cost_correction=correction),
        )
        res = simulate(requests, cfg, outputs=outputs)
        late = [r for r in res.records[500:] if r.ttft_s is not None and r.predicted_ttft_s]
        runs[correction] = statistics.fmean(
            abs(math.log(r.ttft_s / r.predicted_ttft_s))
            for r in late  # type: ignore[operator]
        )
    assert runs[True] < 0.5 * runs[False]
