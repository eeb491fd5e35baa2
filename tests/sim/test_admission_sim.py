"""Overload-oriented admission in the simulator (arXiv §7), scheduler without oracle lengths:
the bundled trace at 2x speed on 8 prefill instances and few decode instances, where decode
is the bottleneck."""

from __future__ import annotations

import pytest

from conductor.core.config import SchedulerConfig
from conductor.sim import SimConfig, simulate
from conductor.workload.synth import synthesize
from conductor.workload.trace import (
    bundled_trace_path,
    generated_tokens,
    read_trace,
    records_to_requests,
)
from conductor.workload.trace_format import TraceRecord

Summaries = dict[str, dict[str, object]]
ADMISSION_ONLY = {"late_binding": 0.0, "first_interval": 0.0}


def _run(limit: int | None, n_decode: int, modes: tuple[str, ...]) -> Summaries:
    return _sim(read_trace(bundled_trace_path(), limit=limit).records, 2.0, n_decode, modes)


def _sim(
    records: list[TraceRecord], speed: float, n_decode: int, modes: tuple[str, ...]
) -> Summaries:
    reqs = records_to_requests(records, speed=speed)
    outputs = generated_tokens(records)
    out = {}
    for mode in modes:
        # admission alone: conductor's late binding (which holds a request until decode
        # has room) and its first-interval decode choice would blur the modes' differences
        sched = SchedulerConfig(admission=mode, policy_params=ADMISSION_ONLY)
        cfg = SimConfig(policy="conductor", n_decode=n_decode, scheduler=sched)
        out[mode] = simulate(reqs, cfg, outputs=outputs).summary
    return out


@pytest.fixture(scope="module")
def small() -> Summaries:
    """The first 3,000 requests on 8P+2D."""
    return _run(3000, 2, ("baseline", "early", "reserve", "predictive"))


@pytest.fixture(scope="module")
def issue_11() -> Summaries:
    """Issue 11's setting: the whole trace on 8P+3D (about 15 s of CPU)."""
    return _run(None, 3, ("early", "predictive"))


def test_baseline_wastes_prefill_on_late_rejections(small: dict[str, dict[str, object]]) -> None:
    b = small["baseline"]
    assert b["rejected_after_prefill"] > 0 and b["wasted_prefill_s"] > 0  # type: ignore[operator]
    for mode in ("early", "reserve", "predictive"):
        assert small[mode]["rejected_after_prefill"] == 0
        assert small[mode]["wasted_prefill_s"] == 0


def test_reserving_at_arrival_keeps_more_requests_within_slo_than_baseline(
    small: dict[str, dict[str, object]],
) -> None:
    assert small["reserve"]["slo_attainment"] > small["baseline"]["slo_attainment"]  # type: ignore[operator]


def test_early_counting_only_running_requests_overloads_decode(
    small: dict[str, dict[str, object]],
) -> None:
    """The paper's early rejection sees the decode load at arrival, not the requests still
    in prefill that will join it: it admits too much (arXiv §7.3, Fig. 9)."""
    assert small["early"]["slo_attainment"] < small["reserve"]["slo_attainment"]  # type: ignore[operator]


def test_predictive_rejects_fewer_than_early_and_keeps_its_slo(issue_11: Summaries) -> None:
    """Issue 11's target at 8P+3D, 2x: predictive rejects about as many as early (within
    5%) with its SLO attainment within 2 points or better. Since the NIC book books each
    hand-off when its prefill really ends (2026-12-07, `core/nic.py`), 1721 against 1667
    (+3.2%) with attainment 0.742 against 0.515 and goodput 5.047 against 3.500 req/s;
    1675 against 1758 just before it (1661 vs 1659 and 1713 vs 1718 earlier): the TBT
    rejections of both modes move by 3-5% with the bookings on this overloaded 3-instance
    decode pool. The generated workloads below keep the strict relation."""
    early, pred = issue_11["early"], issue_11["predictive"]
    assert pred["rejected"] <= 1.05 * early["rejected"]  # type: ignore[operator]
    assert pred["slo_attainment"] >= early["slo_attainment"] - 0.02  # type: ignore[operator]


def test_predictive_keeps_more_requests_within_slo_than_early(issue_11: Summaries) -> None:
    """On the bundled trace at 8P+3D, 2x, predictive's forecast keeps 10+ points more of all
    requests within both SLOs than early's current load, and more goodput."""
    early, pred = issue_11["early"], issue_11["predictive"]
    assert pred["slo_attainment"] >= early["slo_attainment"] + 0.10  # type: ignore[operator]
    assert pred["goodput_rps"] > early["goodput_rps"]  # type: ignore[operator]


@pytest.mark.parametrize(("kind", "speed"), [("chat", 2.0), ("mixed", 1.5)])
def test_predictive_rejects_fewer_than_early_on_generated_workloads(
    kind: str, speed: float
) -> None:
    """Issue 11's relation on generated workloads (4,000 requests at 6 req/s x speed, seed
    1, 8P+3D: decode-bound, about a quarter rejected): predictive rejects fewer than early
    and keeps more requests within both SLOs."""
    records = synthesize(kind, requests=4000, rate_rps=6.0, seed=1)
    out = _sim(records, speed, 3, ("early", "predictive"))
    early, pred = out["early"], out["predictive"]
    assert pred["rejected"] < early["rejected"]  # type: ignore[operator]
    assert pred["slo_attainment"] >= early["slo_attainment"]  # type: ignore[operator]
