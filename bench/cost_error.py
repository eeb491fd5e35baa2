"""What an imperfect cost model costs, and what online correction wins back.

    .venv/bin/python bench/cost_error.py [--out docs/results] [--speeds 1,1.5]
        [--error 0.3] [--bias 0.3] [--policy conductor]

On the bundled conversation trace (8P+8D, the policy's own admission and CPP), per speed:

* ``exact engines``: the engines run the scheduler's model exactly (``conductor simulate``);
* ``mean-exact model``: engines ``(1 + bias)x`` the preset with per-request lognormal error
  ``sigma``, and the scheduler told the engines' mean model (the preset scaled by ``1 + bias``,
  no correction) — the best a scheduler can do without seeing each job's noise;
* ``corrected``: the scheduler starts from the nominal preset and corrects itself online
  (``conductor simulate --cost-error S --cost-bias B``);
* ``uncorrected``: the same with ``--no-correction``.

Writes ``cost_error.json`` (every summary) and ``cost_error.md`` (goodput, SLO attainment,
rejections, and goodput as a fraction of both references).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from conductor.cli.sim_options import DEFAULT_TBT_SLO_MS, DEFAULTS, ClusterOptions, build_config
from conductor.core.correction import ScaledDecode, ScaledPrefill
from conductor.core.costmodel import DEFAULT_PRESET
from conductor.sim import simulate
from conductor.sim.report import write_json
from conductor.workload.trace import (
    bundled_trace_path,
    generated_tokens,
    read_trace,
    records_to_requests,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/results"))
    ap.add_argument("--speeds", default="1,1.5")
    ap.add_argument("--error", type=float, default=0.3)
    ap.add_argument("--bias", type=float, default=0.3)
    ap.add_argument("--policy", default="conductor")
    args = ap.parse_args()
    records = read_trace(bundled_trace_path()).records
    base = ClusterOptions(
        DEFAULTS.n_prefill,
        DEFAULTS.n_decode,
        DEFAULT_PRESET,
        DEFAULTS.scheduler.ttft_slo_s,
        DEFAULT_TBT_SLO_MS,
        DEFAULTS.seed,
    )
    noisy = replace(base, cost_error=args.error, cost_bias=args.bias)
    rows: list[dict[str, Any]] = []
    lines = [
        f"`{args.policy}`, conversation trace, 8P+8D; engines: sigma {args.error:g}, "
        f"bias {args.bias:+g} (bench/cost_error.py)\n",
        "| speed | scheduler's model | goodput r/s | SLO att. | rejected "
        "| vs exact engines | vs mean-exact model |",
        "|---|---|---|---|---|---|---|",
    ]
    for speed in [float(x) for x in args.speeds.split(",")]:
        requests = records_to_requests(records, speed=speed)
        outputs = generated_tokens(records)  # the engines' truth; the scheduler predicts
        exact = build_config(base, args.policy)
        c = exact.cost
        k = 1.0 + args.bias
        mean_cost = replace(
            c, prefill=ScaledPrefill(c.prefill, k), decode=ScaledDecode(c.decode, k)
        )
        mean_exact = replace(
            build_config(replace(noisy, cost_bias=0.0, correction=False), args.policy),
            cost=mean_cost,
        )
        runs = {
            "exact engines": exact,
            "mean-exact model": mean_exact,
            "corrected": build_config(noisy, args.policy),
            "uncorrected": build_config(replace(noisy, correction=False), args.policy),
        }
        got: dict[str, dict[str, Any]] = {}
        for label, cfg in runs.items():
            s = simulate(requests, cfg, outputs=outputs).summary
            s.update(speed=speed, model=label)
            got[label] = s
            rows.append(s)
            print(f"x{speed:g} {label:>17s}: goodput {s['goodput_rps']}", flush=True)
        ref_exact = got["exact engines"]["goodput_rps"]
        ref_mean = got["mean-exact model"]["goodput_rps"]
        for label, s in got.items():
            g = s["goodput_rps"]
            lines.append(
                f"| {speed:g}x | {label} | {g:.3f} | {s['slo_attainment']:.3f} | {s['rejected']}"
                f" | {g / ref_exact:.1%} | {g / ref_mean:.1%} |"
            )
    write_json(args.out / "cost_error.json", rows)
    (args.out / "cost_error.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
