"""FAST Figure 5's ordering on a trimmed bundled trace (the first 2,000 requests, ~10 min):
mean TTFT random > load balancing > local cache-aware > global cache-aware (Algorithm 1)."""

from __future__ import annotations

from conductor.sim import SimConfig, simulate
from conductor.workload.trace import (
    bundled_trace_path,
    generated_tokens,
    read_trace,
    records_to_requests,
)


def test_figure5_ordering_on_trimmed_trace() -> None:
    records = read_trace(bundled_trace_path(), limit=2000).records
    requests, outputs = records_to_requests(records), generated_tokens(records)
    means = {}
    hits = {}
    for policy in ("random", "least_loaded", "cache_aware_local", "mooncake"):
        s = simulate(requests, SimConfig(policy=policy), outputs=outputs).summary
        means[policy] = s["ttft_s"]["mean"]  # type: ignore[index]
        hits[policy] = s["cache_hit_rate"]
    assert means["random"] > means["least_loaded"] > means["cache_aware_local"] > means["mooncake"]
    # global cache awareness reuses more than local, which reuses more than blind placement
    assert hits["mooncake"] > hits["cache_aware_local"] > hits["least_loaded"]  # type: ignore[operator]
