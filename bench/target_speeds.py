"""Issue 13's target speeds, found rather than picked: for each generated workload, the
replay speed at which the best peer drops to 90% SLO attainment, and every policy there.

    python bench/target_speeds.py [--kinds chat,agent,docqa,mixed] [--seeds 42]
                                  [--bisect-steps 5] [--json PATH]

Issue 13 asks for ``conductor``'s goodput and mean TTFT on every ``conductor trace synth``
kind "at 1x and at the speed where the best peer drops to 90% SLO attainment". The tables
elsewhere (docs/results.md section 2) use fixed speeds (16x for chat and agent, 2x for
docqa and mixed), some past that point and some short of it. Here, per workload
(``conductor trace synth --kind K --requests 2000 --rate 2.5 --seed S``, as
``bench/heldout.py``):

1. every peer's capacity (:func:`~conductor.sim.capacity.find_capacity`: the largest tested
   replay speed keeping >= 90% attainment; start at 1x, double or halve, then
   ``--bisect-steps`` bisections), under ``conductor compare``'s defaults (8P+8D, TTFT SLO
   30 s, TBT SLO 100 ms, early admission for every policy, CPP off, no output lengths);
2. ``S*`` = the best peer's capacity: the fastest replay at which some peer still holds 90%;
3. every policy replayed at ``S*`` (``bench/heldout.py``'s case and verdict: ``conductor``'s
   goodput against the best peer's, its mean TTFT against the lowest peer's).

Nothing is tuned here; seed 42 is the workload the parameters were chosen on (docs/policies.md),
so other seeds are the held-out check. Printed per workload: the peers' capacities, ``S*``,
and the verdict line; ``--json`` keeps everything.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from heldout import Case, run_case, tally, verdict
from hold_order import OPTIONS, RATE_RPS, REQUESTS

from conductor.cli.sim_cmd import default_compare_policies
from conductor.cli.sim_options import build_config
from conductor.sim.capacity import find_capacity
from conductor.workload.synth import KINDS, synthesize
from conductor.workload.trace import generated_tokens, records_to_requests

TARGET = 0.9
"""Issue 13: the speed where the best peer drops to 90% SLO attainment."""


def peer_capacities(kind: str, seed: int, bisect_steps: int) -> dict[str, dict[str, object]]:
    """Each peer's capacity point on the workload: speed, attainment there, speeds tried."""
    records = synthesize(kind, requests=REQUESTS, rate_rps=RATE_RPS, seed=seed)
    reqs = records_to_requests(records, speed=1.0)
    outputs = generated_tokens(records)
    points: dict[str, dict[str, object]] = {}
    for policy in default_compare_policies():
        if policy == "conductor":
            continue
        cfg = build_config(replace(OPTIONS), policy)
        p = find_capacity(reqs, cfg, outputs=outputs, target=TARGET, bisect_steps=bisect_steps)
        points[policy] = {"speed": p.speed, "attainment": p.attainment, "tested": p.tested}
    return points


def parse_list(text: str, flag: str, allowed: tuple[str, ...] | None = None) -> list[str]:
    """Comma-separated items; ValueError naming ``flag`` and a bad item."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ValueError(f"{flag}: nothing given")
    for x in items:
        if allowed is not None and x not in allowed:
            raise ValueError(f"{flag}: unknown {x!r} (one of {', '.join(allowed)})")
    return items


def parse_seeds(text: str) -> list[int]:
    """``--seeds``: comma-separated integers; ValueError naming a bad one."""
    seeds = []
    for x in parse_list(text, "--seeds"):
        try:
            seeds.append(int(x))
        except ValueError:
            raise ValueError(f"--seeds: {x!r} is not an integer") from None
    return seeds


def target_speed(caps: dict[str, dict[str, object]]) -> tuple[str, float]:
    """``S*``: the peer with the largest capacity and that speed (the first such peer in
    ``caps``' order on a tie)."""
    best, speed = "", -1.0
    for policy, point in caps.items():
        s = point["speed"]
        assert isinstance(s, float)
        if s > speed:
            best, speed = policy, s
    return best, speed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--seeds", default="42")
    p.add_argument("--bisect-steps", type=int, default=5)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    try:
        kinds = parse_list(args.kinds, "--kinds", tuple(KINDS))
        seeds = parse_seeds(args.seeds)
    except ValueError as exc:
        p.error(str(exc))
    if args.bisect_steps < 0:
        p.error(f"--bisect-steps must be >= 0, got {args.bisect_steps}")
    if args.json is not None and not args.json.parent.is_dir():  # not after minutes of runs
        p.error(f"--json: no folder {str(args.json.parent)!r} to write {args.json.name!r} in")
    policies = default_compare_policies()
    results = []
    for seed in seeds:
        for kind in kinds:
            caps = peer_capacities(kind, seed, args.bisect_steps)
            best, speed = target_speed(caps)
            listed = ", ".join(f"{k} x{v['speed']:.3g}" for k, v in caps.items())
            print(f"{kind} seed {seed}: peers' capacity {listed}", flush=True)
            case = Case(kind, speed, seed, "base")
            rows = run_case(case, policies)
            v = verdict(rows)
            ours = rows["conductor"]
            fast = str(v["fastest_peer"])
            margin = v["goodput_margin"]
            assert isinstance(margin, float)
            print(
                f"  at S* = x{speed:.4g} (best peer {best}): conductor {ours['goodput_rps']:.3f}"
                f" / {ours['ttft_mean_s']:.2f} s (att. {ours['slo_attainment']:.3f}) | best"
                f" peer {v['best_peer']} {rows[str(v['best_peer'])]['goodput_rps']:.3f}"
                f" ({100 * margin:+.1f}%) | lowest-TTFT peer {fast}"
                f" {rows[fast]['ttft_mean_s']:.2f} s at {rows[fast]['goodput_rps']:.3f}",
                flush=True,
            )
            results.append(
                {
                    "kind": kind,
                    "seed": seed,
                    "capacities": caps,
                    "speed": speed,
                    "capacity_peer": best,
                    "rows": rows,
                    **v,
                }
            )
    top, fastest, _ = tally(results)
    print(
        f"conductor at S*: highest goodput (or tied at 3 decimals) in {top} of {len(results)},"
        f" lowest mean TTFT (or tied at 2 decimals) in {fastest} of {len(results)}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
