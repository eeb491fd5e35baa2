"""The hold queue's order (docs/policies.md): ``conductor`` at several age weights beside every
peer, on generated workloads, all under early admission with CPP off and no output lengths.

    python bench/hold_order.py [--seed 7] [--weights inf,0,0.05,0.2,1] [--peers]
        [--workloads chat:16,agent:16,docqa:2,mixed:2,docqa:1,mixed:1] [--json PATH]

Each workload is ``conductor trace synth --kind K --requests 2000 --rate 2.5 --seed S``
replayed at the speed given, 8 prefill + 8 decode, the default preset, TTFT SLO 30 s, TBT
SLO 100 ms (``conductor compare``'s defaults). ``--weights`` sets
``policy_params["late_binding_age_weight"]`` for ``conductor`` (``inf``: deadline order;
``default``: the policy's own, 0.2); ``--peers`` adds every other policy once. Printed:
goodput req/s and mean TTFT s per run; ``--json`` keeps the summaries. The age weight was
chosen with ``--seed 7``; ``--seed 11 --weights inf,default --peers`` is the held-out check.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from conductor.cli.sim_cmd import default_compare_policies
from conductor.cli.sim_options import ClusterOptions, build_config
from conductor.core.costmodel import DEFAULT_PRESET
from conductor.sim.simulator import simulate
from conductor.workload.synth import KINDS, synthesize
from conductor.workload.trace import generated_tokens, records_to_requests

REQUESTS = 2000
RATE_RPS = 2.5
OPTIONS = ClusterOptions(
    prefill=8,
    decode=8,
    preset_name=DEFAULT_PRESET,
    ttft_slo_s=30.0,
    tbt_slo_ms=100.0,
    seed=0,
    admission="early",
    cpp=False,
)
"""``conductor compare``'s defaults: 8P+8D, the default preset, SLOs 30 s / 100 ms, early
admission for every policy, CPP off."""


def _run(
    policy: str, kind: str, speed: float, seed: int, weight: float | None
) -> dict[str, object]:
    records = synthesize(kind, requests=REQUESTS, rate_rps=RATE_RPS, seed=seed)
    cfg = build_config(OPTIONS, policy)
    if weight is not None:
        params = {"late_binding_age_weight": weight}
        cfg = replace(cfg, scheduler=replace(cfg.scheduler, policy_params=params))
    reqs = records_to_requests(records, speed=speed)
    summary = simulate(reqs, cfg, outputs=generated_tokens(records)).summary
    ttft = summary["ttft_s"]
    assert isinstance(ttft, dict)
    return {
        "policy": policy,
        "kind": kind,
        "speed": speed,
        "seed": seed,
        "age_weight": weight,
        "goodput_rps": summary["goodput_rps"],
        "slo_attainment": summary["slo_attainment"],
        "ttft_mean_s": ttft["mean"],
        "rejected": summary["rejected"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--weights", default="inf,0,0.05,0.2,1", help="comma-separated; 'default': the policy's"
    )
    p.add_argument("--peers", action="store_true", help="also every other policy")
    p.add_argument("--workloads", default="chat:16,agent:16,docqa:2,mixed:2,docqa:1,mixed:1")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    try:
        workloads = [(k, float(x)) for k, x in (w.split(":") for w in args.workloads.split(","))]
    except ValueError:
        p.error(f"--workloads: {args.workloads!r} is not KIND:SPEED[,KIND:SPEED...]")
    bad = [k for k, _ in workloads if k not in KINDS]
    if bad:
        p.error(f"--workloads: unknown kind {bad[0]!r} (one of {', '.join(KINDS)})")
    try:
        weights = [None if w == "default" else float(w) for w in args.weights.split(",") if w]
    except ValueError:
        p.error(f"--weights: {args.weights!r} is not numbers, inf or default, comma-separated")
    if any(w is not None and not w >= 0 for w in weights):
        p.error(f"--weights: {args.weights!r}: an age weight must be >= 0")
    runs: list[tuple[str, float | None]] = [("conductor", w) for w in weights]
    if args.peers:
        runs += [(name, None) for name in default_compare_policies() if name != "conductor"]
    rows = []
    print(f"seed {args.seed}: goodput req/s / mean TTFT s")
    for kind, speed in workloads:
        for policy, weight in runs:
            row = _run(policy, kind, speed, args.seed, weight)
            rows.append(row)
            label = policy if weight is None else f"{policy} (age weight {weight:g})"
            print(
                f"{kind:>6} {speed:>4g}x  {label:32s} "
                f"{row['goodput_rps']:.3f} / {row['ttft_mean_s']:.2f}",
                flush=True,
            )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
