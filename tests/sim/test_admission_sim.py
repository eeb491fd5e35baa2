"""Overload-oriented admission in the simulator (arXiv §7): the first 3,000 requests of the
bundled trace at 2x speed on 8 prefill + 3 decode instances, where decode is the bottleneck."""

from __future__ import annotations

import pytest

from conductor.core.config import SchedulerConfig
from conductor.sim import SimConfig, simulate
from conductor.workload.trace import bundled_trace_path, read_trace, records_to_requests


@pytest.fixture(scope="module")
def summaries() -> dict[str, dict[str, object]]:
    reqs = records_to_requests(read_trace(bundled_trace_path(), limit=3000).records, speed=2.0)
    out = {}
    for mode in ("baseline", "early", "predictive"):
        cfg = SimConfig(policy="mooncake", n_decode=3, scheduler=SchedulerConfig(admission=mode))
        out[mode] = simulate(reqs, cfg).summary
    return out


def test_baseline_wastes_prefill_on_late_rejections(
    summaries: dict[str, dict[str, object]],
) -> None:
    b = summaries["baseline"]
    assert b["rejected_after_prefill"] > 0 and b["wasted_prefill_s"] > 0  # type: ignore[operator]
    for mode in ("early", "predictive"):
        assert summaries[mode]["rejected_after_prefill"] == 0
        assert summaries[mode]["wasted_prefill_s"] == 0


def test_early_rejection_keeps_as_many_requests_within_slo_without_waste(
    summaries: dict[str, dict[str, object]],
) -> None:
    """Early and baseline admission meet the SLOs for the same share of requests to within a
    point (with the vLLM-like engines early is 0.5 points behind here, 0.746 vs 0.752; with
    the FCFS engines it was 0.5 ahead), and early's admitted requests miss the TBT SLO less
    often, while baseline's late rejections waste prefill (above)."""
    early, base = summaries["early"], summaries["baseline"]
    assert early["slo_attainment"] >= base["slo_attainment"] - 0.01  # type: ignore[operator]
    assert early["tbt_ms"]["p90"] < base["tbt_ms"]["p90"]  # type: ignore[index]


def test_predictive_rejects_fewer_than_early(summaries: dict[str, dict[str, object]]) -> None:
    # ... but, in our model, at the price of TBT misses (see docs/results.md section 4)
    assert summaries["predictive"]["rejected"] < summaries["early"]["rejected"]  # type: ignore[operator]
