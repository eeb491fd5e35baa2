"""Decision benchmark script: one cluster size, or a sweep over sizes and prompt lengths.

    python bench/decision.py --prefill 16 --decode 16 [--policy NAME] [--json out.json]
    python bench/decision.py --sweep [--sizes 4,8,16,32,64,128] [--json sweep.json]

The measuring itself lives in :mod:`conductor.perf.decision` (also behind
``conductor bench decision``); this script adds the sweep and its table. Figures only:
nothing here passes or fails on a timing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from conductor.core.policies import DEFAULT_POLICY
from conductor.perf.decision import (
    BUCKETS,
    DEFAULT_REQUESTS,
    DEFAULT_WARMUP,
    DecisionBenchResult,
    format_result,
    load_trace,
    run_repeated,
)

DEFAULT_SIZES = (4, 8, 16, 32, 64, 128)


def sweep_table(results: list[DecisionBenchResult]) -> str:
    names = [name for name, _ in BUCKETS]
    head = f"{'P+D':>9} {'p50 us':>8} {'p99 us':>8} {'mean us':>8} {'ingest ev/s':>12}"
    head += "".join(f" {n + ' p50/p99':>17}" for n in names) + "  p99 of each run"
    lines = [head]
    for r in results:
        per = {b.bucket: b for b in r.by_blocks}
        row = (
            f"{f'{r.prefill}+{r.decode}':>9} {r.p50_us:>8.1f} {r.p99_us:>8.1f} "
            f"{r.mean_us:>8.1f} {r.ingest_block_events_per_s:>12,.0f}"
        )
        for n in names:
            b = per.get(n)
            cell = f"{b.p50_us:.0f}/{b.p99_us:.0f}" if b else "-"
            row += f" {cell:>17}"
        row += "  " + "/".join(f"{p:.0f}" for p in r.p99_us_runs)
        lines.append(row)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--prefill", type=int, default=16)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--policy", default=DEFAULT_POLICY)
    ap.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help="timed requests per run")
    ap.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed requests first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--repeat", type=int, default=None, help="runs per size, median-p99 run kept (1; sweep 3)"
    )
    ap.add_argument("--sweep", action="store_true", help="sweep sizes (same count each side)")
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    ap.add_argument("--json", type=Path, default=None, help="write the result(s) as JSON")
    args = ap.parse_args(argv)

    rows = load_trace()
    repeat = args.repeat or (3 if args.sweep else 1)
    if not args.sweep:
        result = run_repeated(
            args.prefill,
            args.decode,
            repeat=repeat,
            policy=args.policy,
            requests=args.requests,
            warmup=args.warmup,
            seed=args.seed,
            rows=rows,
        )
        print(format_result(result))
        if args.json:
            args.json.write_text(json.dumps(result.to_json(), indent=2) + "\n")
        return 0

    results: list[DecisionBenchResult] = []
    t0 = time.perf_counter()
    for n in (int(s) for s in args.sizes.split(",")):
        results.append(
            run_repeated(
                n,
                n,
                repeat=repeat,
                policy=args.policy,
                requests=args.requests,
                warmup=args.warmup,
                seed=args.seed,
                rows=rows,
            )
        )
        print(f"  {n}+{n} done ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    print(
        f"decision benchmark sweep: policy {args.policy}, {args.requests} timed requests per "
        f"run after {args.warmup} untimed, seed {args.seed}, the median-p99 run of {repeat} per "
        "size; buckets are prompt lengths in 512-token blocks"
    )
    print(sweep_table(results))
    if args.json:
        args.json.write_text(json.dumps([r.to_json() for r in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
