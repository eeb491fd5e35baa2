"""What the decode engines' own prefix cache does (``SimConfig.decode_cache``,
docs/simulator.md): every policy with it off and on, on the bundled conversation trace and
the generated workloads of docs/results.md.

    python bench/decode_cache.py [--seed 42] [--policies a,b,...] [--json PATH]
    python bench/decode_cache.py --from-json PATH   # only the per-workload summary

8 prefill + 8 decode, the default preset, early admission for every policy, CPP off, no
output lengths given, TTFT SLO 30 s, TBT SLO 100 ms (``conductor compare``'s defaults);
workloads: the bundled trace at 1x and 2x, ``conductor trace synth --kind K --requests 2000
--rate 2.5 --seed S`` at 1x and at docs/results.md's speeds (chat and agent 16x, docqa and
mixed 2x). Printed per workload and policy: goodput (req/s), TBT misses (completed requests
whose TBT is over the SLO) and the prompt tokens hand-offs did not carry, off -> on;
then per workload the best other policy (by goodput, each setting on its own) and
``conductor``, and ``conductor``'s margin. ``--json`` keeps the rows.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import hold_order

from conductor.cli.sim_cmd import default_compare_policies
from conductor.cli.sim_options import build_config, load_records
from conductor.sim.simulator import SimResult, simulate
from conductor.workload.synth import synthesize
from conductor.workload.trace import generated_tokens, records_to_requests
from conductor.workload.trace_format import TraceRecord

SYNTH = (("chat", 1), ("agent", 1), ("docqa", 1), ("mixed", 1),
         ("chat", 16), ("agent", 16), ("docqa", 2), ("mixed", 2))  # fmt: skip


def tbt_misses(result: SimResult) -> int:
    slo = result.config.scheduler.tbt_slo_s
    return sum(1 for r in result.records if r.completed and r.tbt_s is not None and r.tbt_s > slo)


def run(records: list[TraceRecord], speed: float, policy: str, on: bool) -> dict[str, object]:
    cfg = build_config(replace(hold_order.OPTIONS, decode_cache=on), policy)
    result = simulate(
        records_to_requests(records, speed=speed), cfg, outputs=generated_tokens(records)
    )
    s = result.summary
    return {
        "goodput_rps": s["goodput_rps"],
        "tbt_misses": tbt_misses(result),
        "handoff_held_tokens": s["handoff_held_tokens"],
        "ttft_mean_s": s["ttft_s"]["mean"],  # type: ignore[index]
    }


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """Per workload: the best other policy and ``conductor``, decode caches off -> on."""
    out = [
        "| workload | best peer, off | best peer, on | `conductor` off -> on | margin off -> on |",
        "|---|---|---|---|---|",
    ]
    workloads = list(dict.fromkeys((r["workload"], r["speed"]) for r in rows))
    for name, speed in workloads:
        here = [r for r in rows if (r["workload"], r["speed"]) == (name, speed)]
        ours = next((r for r in here if r["policy"] == "conductor"), None)
        peers = [r for r in here if r["policy"] != "conductor"]
        if ours is None or not peers:
            continue
        cells, margins = [], []
        for side in ("off", "on"):
            best = max(peers, key=lambda r: r[side]["goodput_rps"])
            g = best[side]["goodput_rps"]
            cells.append(f"`{best['policy']}` {g:.3f} ({best[side]['tbt_misses']} TBT misses)")
            margins.append(f"{ours[side]['goodput_rps'] / g - 1:+.1%}")
        o, n = ours["off"], ours["on"]
        mine = (
            f"{o['goodput_rps']:.3f} ({o['tbt_misses']}) -> {n['goodput_rps']:.3f} "
            f"({n['tbt_misses']})"
        )
        out.append(f"| {name}, {speed:g}x | {cells[0]} | {cells[1]} | {mine} | "
                   f"{margins[0]} -> {margins[1]} |")  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=42, help="the generated workloads' seed")
    p.add_argument("--policies", default=",".join(default_compare_policies()))
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--from-json", type=Path, default=None, help="summarise a run's JSON")
    args = p.parse_args()
    if args.from_json is not None:
        print("\n".join(summary(json.loads(args.from_json.read_text()))))
        return
    _, conv = load_records(None, None, 1.0, False)
    cases = [("conversation trace", conv, 1.0), ("conversation trace", conv, 2.0)]
    for kind, x in SYNTH:
        cases.append((kind, synthesize(kind, requests=2000, rate_rps=2.5, seed=args.seed), x))
    print("| workload | policy | goodput off -> on | TBT misses off -> on | tokens not carried |")
    print("|---|---|---|---|---|")
    out: list[dict[str, Any]] = []
    for name, records, speed in cases:
        for policy in args.policies.split(","):
            off, on = (run(records, float(speed), policy, v) for v in (False, True))
            print(
                f"| {name}, {speed:g}x | {policy} | {off['goodput_rps']:.3f} -> "
                f"{on['goodput_rps']:.3f} | {off['tbt_misses']} -> {on['tbt_misses']} | "
                f"{on['handoff_held_tokens']:,} |",
                flush=True,
            )
            out.append({"workload": name, "speed": speed, "policy": policy, "off": off, "on": on})
    print()
    print("\n".join(summary(out)))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
