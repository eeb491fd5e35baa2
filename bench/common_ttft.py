"""Mean TTFT on the requests two policies both served (issue 13's "lowest mean TTFT").

    python bench/common_ttft.py [--seed 42] [--json docs/results/common_ttft.json]

A policy's mean TTFT counts only the requests it completed, so one that rejects the slow
ones (long prompts under load) shows a lower mean than one that serves them. This compares
``conductor`` with a peer on the requests *both* completed, on the generated workloads where
a peer has the lower plain mean (docs/results.md): each pair runs under ``conductor
compare``'s defaults (8P+8D, early admission for both, CPP off; ``bench/hold_order.py
OPTIONS``) on ``conductor trace synth --kind K --requests 2000 --rate 2.5 --seed S`` at the
speed given. Printed: completed counts, the plain means, and mean and p50 TTFT on the
common set.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable
from pathlib import Path

from hold_order import OPTIONS, RATE_RPS, REQUESTS

from conductor.cli.sim_options import build_config
from conductor.sim.simulator import simulate
from conductor.workload.synth import synthesize
from conductor.workload.trace import generated_tokens, records_to_requests

PAIRS = (("docqa", 2.0, "sglang"), ("chat", 16.0, "weighted"), ("chat", 16.0, "llmd"))
"""(workload, speed, peer): the peer with the lowest plain mean TTFT (docqa 2x, chat 16x)
and chat 16x's best peer by goodput."""


def _completed(policy: str, kind: str, speed: float, seed: int) -> dict[str, float]:
    """TTFT by request id of the requests ``policy`` completed."""
    records = synthesize(kind, requests=REQUESTS, rate_rps=RATE_RPS, seed=seed)
    reqs = records_to_requests(records, speed=speed)
    res = simulate(reqs, build_config(OPTIONS, policy), outputs=generated_tokens(records))
    return {
        str(r.request_id): r.ttft_s for r in res.records if r.completed and r.ttft_s is not None
    }


def _mean(ttft: dict[str, float], ids: Iterable[str]) -> float:
    return round(statistics.mean(ttft[i] for i in ids), 3)


def _p50(ttft: dict[str, float], ids: Iterable[str]) -> float:
    return round(statistics.median(ttft[i] for i in ids), 3)


def compare_sets(ours: dict[str, float], theirs: dict[str, float], peer: str) -> dict[str, object]:
    """Counts, plain means and the common set's mean and p50 of two TTFT maps (by request
    id); ``conductor`` is ``ours``."""
    both = sorted(set(ours) & set(theirs))
    if not both:
        raise ValueError("the two policies completed no request in common")
    return {
        "completed": {"conductor": len(ours), peer: len(theirs), "both": len(both)},
        "mean_ttft_s": {"conductor": _mean(ours, ours), peer: _mean(theirs, theirs)},
        "common_mean_ttft_s": {"conductor": _mean(ours, both), peer: _mean(theirs, both)},
        "common_p50_ttft_s": {"conductor": _p50(ours, both), peer: _p50(theirs, both)},
    }


def pair(kind: str, speed: float, peer: str, seed: int) -> dict[str, object]:
    ours = _completed("conductor", kind, speed, seed)
    theirs = _completed(peer, kind, speed, seed)
    head: dict[str, object] = {"workload": kind, "speed": speed, "seed": seed, "peer": peer}
    return head | compare_sets(ours, theirs, peer)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rows = [pair(kind, speed, peer, args.seed) for kind, speed, peer in PAIRS]
    print(
        f"{'workload':>10} {'peer':>9} {'served (c/p/both)':>18} {'mean c/p':>13} "
        f"{'common mean c/p':>16} {'common p50 c/p':>15}"
    )
    for r in rows:
        peer = str(r["peer"])
        n, m = r["completed"], r["mean_ttft_s"]
        cm, cp = r["common_mean_ttft_s"], r["common_p50_ttft_s"]
        assert isinstance(n, dict) and isinstance(m, dict)
        assert isinstance(cm, dict) and isinstance(cp, dict)
        print(
            f"{r['workload']!s:>6} {r['speed']:>3g}x {peer:>9} "
            f"{n['conductor']:>6}/{n[peer]}/{n['both']:<6} "
            f"{m['conductor']:>6.2f}/{m[peer]:<6.2f} "
            f"{cm['conductor']:>8.2f}/{cm[peer]:<7.2f} {cp['conductor']:>7.2f}/{cp[peer]:<7.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
