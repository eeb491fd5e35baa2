"""Simulator speed: requests simulated per wall-second on the bundled conversation trace.

    python bench/sim_speed.py [--policy mooncake] [--sizes 4,8,16,32] [--limits 3000,6000]
                              [--builds pure,compiled] [--rounds N] [--json PATH]

Sweeps the cluster size (prefill = decode = 4, 8, 16, 32) on the full trace, and the trace
length (first 3k, 6k requests) at 8 + 8, printing a table and writing JSON. Each build runs
in its own process, side by side, the rounds alternating: ``pure`` the sources
(``CONDUCTOR_PURE=1``), ``compiled`` the ``conductor compile`` (mypyc) build; both by default
where a build exists. The time is the ``simulate()`` call alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import conductor
from conductor import native
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
        "build": conductor.NATIVE_MODE,
        "policy": policy,
        "instances_each_side": n,
        "requests": len(requests),
        "wall_s": round(wall, 3),
        "requests_per_wall_s": round(len(requests) / wall, 1),
        "slo_attainment": res.summary["slo_attainment"],
    }


def child(policy: str, sizes: list[int], limits: list[int]) -> list[dict[str, object]]:
    rows = [run(policy, n, None) for n in sizes]
    return rows + [run(policy, 8, k) for k in limits]


def _ints(ap: argparse.ArgumentParser, flag: str, text: str) -> list[int]:
    """Comma-separated positive integers (none: an empty list), or a usage error naming
    ``flag`` and the value."""
    try:
        out = [int(x) for x in text.split(",") if x]
    except ValueError:
        out = [0]
    if any(n < 1 for n in out):
        ap.error(f"{flag}: {text!r} is not a comma-separated list of positive integers")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--policy", default=DEFAULT_POLICY)
    ap.add_argument("--sizes", default="4,8,16,32", help="instances on each side, full trace")
    ap.add_argument("--limits", default="3000,6000", help="first N requests, at 8 + 8")
    ap.add_argument("--builds", default=None, help="pure,compiled (default: what exists)")
    ap.add_argument("--rounds", type=int, default=1, help="alternating rounds (>= 1)")
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes, limits = _ints(ap, "--sizes", args.sizes), _ints(ap, "--limits", args.limits)
    if args.rounds < 1:
        ap.error(f"--rounds: {args.rounds} is not >= 1")
    if args.child:
        print(json.dumps(child(args.policy, sizes, limits)))
        return
    default = "pure,compiled" if native.read_manifest() is not None else "pure"
    builds = (args.builds or default).split(",")
    for b in builds:
        if b not in ("pure", "compiled"):
            ap.error(f"--builds: {b!r} is not pure or compiled")
    rows: list[dict[str, object]] = []
    for r in range(args.rounds):
        for b in builds:
            env = dict(os.environ, CONDUCTOR_PURE="1" if b == "pure" else "0")
            cmd = [sys.executable, __file__, "--child", "--policy", args.policy]
            cmd += ["--sizes", args.sizes, "--limits", args.limits]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            got = json.loads(out.stdout)
            if b == "compiled" and any(g["build"] != "compiled" for g in got):
                sys.exit(f"no current compiled build ({got[0]['build']}): run `conductor compile`")
            rows += [{**g, "round": r + 1} for g in got]
    print(f"{'build':>11} {'round':>5} {'P+D':>7} {'requests':>9} {'wall s':>8} {'req/s':>9}")
    for row in rows:
        n = row["instances_each_side"]
        print(
            f"{row['build']:>11} {row['round']:>5} {n:>3}+{n:<3} {row['requests']:>9} "
            f"{row['wall_s']:>8} {row['requests_per_wall_s']:>9}"
        )
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
