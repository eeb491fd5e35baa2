"""Simulator speed: requests simulated per wall-second on the bundled conversation trace.

    python bench/sim_speed.py [--policy mooncake] [--json PATH]

Sweeps the cluster size (prefill = decode = 4, 8, 16, 32) on the full trace, and the trace
length (first 3k, 6k, 12k requests) at 8 + 8, printing a table and writing JSON.
"""

from __future__ import annotations

import argparse
import json
import time

from conductor.core.config import SchedulerConfig
from conductor.core.policies import DEFAULT_POLICY
from conductor.sim import SimConfig, simulate
from conductor.workload.trace import (
    bundled_trace_path,
    generated_tokens,
    read_trace,
    records_to_requests,
)


def run(policy: str, n: int, limit: int | None) -> dict[str, object]:
    records = read_trace(bundled_trace_path(), limit=limit).records
    requests = records_to_requests(records)
    cfg = SimConfig(policy=policy, n_prefill=n, n_decode=n, scheduler=SchedulerConfig())
    t0 = time.perf_counter()
    res = simulate(requests, cfg, outputs=generated_tokens(records))
    wall = time.perf_counter() - t0
    return {
        "policy": policy,
        "instances_each_side": n,
        "requests": len(requests),
        "wall_s": round(wall, 3),
        "requests_per_wall_s": round(len(requests) / wall, 1),
        "slo_attainment": res.summary["slo_attainment"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--policy", default=DEFAULT_POLICY)
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()
    rows = [run(args.policy, n, None) for n in (4, 8, 16, 32)]
    rows += [run(args.policy, 8, k) for k in (3000, 6000)]
    print(f"{'P+D':>7} {'requests':>9} {'wall s':>8} {'req/s':>9}")
    for r in rows:
        n = r["instances_each_side"]
        print(f"{n:>3}+{n:<3} {r['requests']:>9} {r['wall_s']:>8} {r['requests_per_wall_s']:>9}")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
