"""Simulated herding: goodput and mean TTFT of N scheduler replicas whose views of each
other's reservations lag by D ms, against one replica (``conductor simulate --replicas N
--sync-delay-ms D``, same cluster and trace).

    python bench/replicas_herding.py [--replicas 1,2,4,8] [--delays-ms 0,1,10,100]
        [--speeds 1,2] [--limit N] [--trace PATH] [--burst-ms G] [--json PATH]

Each row is one ``conductor simulate`` run with the defaults of that command (the bundled
conversation trace, 8 prefill + 8 decode, the default policy); the ratio columns divide by the
one-replica run at the same speed. ``--burst-ms G`` floors every arrival to a multiple of
``G`` ms of the trace's clock (before the speed-up): a bursty version of a generated trace,
as the conversation trace's arrivals are (1,180 distinct timestamps for 12,031 requests).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from conductor.cli.sim_options import DEFAULT_TBT_SLO_MS, DEFAULTS, ClusterOptions, build_config
from conductor.core.costmodel import DEFAULT_PRESET
from conductor.sim.simulator import simulate
from conductor.workload.trace import (
    bundled_trace_path,
    generated_tokens,
    read_trace,
    records_to_requests,
)


def run(
    requests: list,  # type: ignore[type-arg]
    outputs: list[int],
    speed: float,
    n: int,
    delay_ms: float,
    stagger: bool = True,
) -> dict[str, object]:
    o = ClusterOptions(
        DEFAULTS.n_prefill, DEFAULTS.n_decode, DEFAULT_PRESET, DEFAULTS.scheduler.ttft_slo_s,
        DEFAULT_TBT_SLO_MS, DEFAULTS.seed, replicas=n, sync_delay_ms=delay_ms,
    )  # fmt: skip
    cfg = replace(build_config(o, DEFAULTS.policy), replica_stagger=stagger)
    res = simulate(requests, cfg, outputs=outputs)
    s = res.summary
    return {
        "speed": speed,
        "replicas": n,
        "sync_delay_ms": delay_ms,
        "stagger": stagger,
        "goodput_rps": s["goodput_rps"],
        "slo_attainment": s["slo_attainment"],
        "ttft_mean_s": s["ttft_s"]["mean"],  # type: ignore[index]
        "ttft_p99_s": s["ttft_s"]["p99"],  # type: ignore[index]
        "rejected": s["rejected"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--replicas", default="1,2,4,8")
    ap.add_argument("--delays-ms", default="0,10,100")
    ap.add_argument("--speeds", default="1,2")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--trace", type=Path, default=None)
    ap.add_argument("--burst-ms", type=int, default=0, help="floor arrivals to G ms")
    ap.add_argument("--no-stagger", action="store_true", help="replicas break ties alike")
    ap.add_argument("--json", dest="json_path", type=Path)
    args = ap.parse_args()
    if args.burst_ms < 0:
        ap.error(f"--burst-ms must be >= 0, got {args.burst_ms}")
    records = read_trace(args.trace or bundled_trace_path(), limit=args.limit).records
    if args.burst_ms > 0:
        g = args.burst_ms
        records = [replace(r, timestamp_ms=r.timestamp_ms // g * g) for r in records]
    outputs = generated_tokens(records)  # the trace's output lengths
    rows = []
    print(
        f"{'speed':>5} {'N':>3} {'D ms':>6} {'goodput':>8} {'ratio':>6} {'TTFT s':>7} {'ratio':>6}"
    )
    for speed in (float(x) for x in args.speeds.split(",")):
        requests = records_to_requests(records, speed=speed)
        base = run(requests, outputs, speed, 1, 0.0)
        rows.append(base)
        for n in (int(x) for x in args.replicas.split(",")):
            for d in (float(x) for x in args.delays_ms.split(",")):
                r = base if n == 1 else run(requests, outputs, speed, n, d, not args.no_stagger)
                if n > 1:
                    rows.append(r)
                g = float(r["goodput_rps"]) / float(base["goodput_rps"])  # type: ignore[arg-type]
                t = float(r["ttft_mean_s"]) / float(base["ttft_mean_s"])  # type: ignore[arg-type]
                print(
                    f"{speed:>5g} {n:>3} {d:>6g} {r['goodput_rps']:>8} {g:>6.3f}"
                    f" {r['ttft_mean_s']:>7} {t:>6.3f}",
                    flush=True,
                )
                if n == 1:
                    break
    if args.json_path:
        args.json_path.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
