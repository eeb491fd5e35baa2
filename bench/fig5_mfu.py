"""How the FAST Fig. 5 table moves with the prefill MFU of the A800 preset.

    .venv/bin/python bench/fig5_mfu.py [--out docs/results] [--mfus 0.35,0.42,0.5]

For each MFU, ``conductor compare --admission off --policies
random,least_loaded,cache_aware_local,mooncake`` on the bundled conversation trace at 1x on 8 prefill + 8 decode instances (the defaults), with
the preset's prefill at that MFU (``CostModel.with_prefill_mfu``; everything else as fitted).
Writes ``fig5_mfu_<mfu>.json`` / ``.md`` per MFU (the compare table) and ``fig5_mfu.md``
(mean TTFT per policy and MFU beside the paper's). The preset's own fit to Splitwise's A100
profile is MFU 0.375 (``conductor compare --admission off`` without this script).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from conductor.cli.sim_options import DEFAULT_TBT_SLO_MS, DEFAULTS, ClusterOptions, build_config
from conductor.core.costmodel import DEFAULT_PRESET, preset
from conductor.sim import simulate
from conductor.sim.report import markdown_table, write_json
from conductor.workload.trace import (
    bundled_trace_path,
    generated_tokens,
    read_trace,
    records_to_requests,
)

POLICIES = ("random", "least_loaded", "cache_aware_local", "mooncake")
PAPER_TTFT_S = {"random": 19.65, "least_loaded": 5.27, "cache_aware_local": 3.58, "mooncake": 3.07}
"""FAST'25 Fig. 5: average TTFT on the conversation trace, 16 x 8xA800."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/results"))
    ap.add_argument("--mfus", default="0.35,0.42,0.5")
    args = ap.parse_args()
    mfus = [float(x) for x in args.mfus.split(",")]
    records = read_trace(bundled_trace_path()).records
    requests = records_to_requests(records)
    outputs = generated_tokens(records)  # the engines' truth; the scheduler predicts
    base = preset(DEFAULT_PRESET)
    options = ClusterOptions(
        DEFAULTS.n_prefill,
        DEFAULTS.n_decode,
        DEFAULT_PRESET,
        DEFAULTS.scheduler.ttft_slo_s,
        DEFAULT_TBT_SLO_MS,
        DEFAULTS.seed,
        admission="off",  # Fig. 5 compares placement alone, as the paper does
    )
    table: dict[str, dict[float, float | None]] = {p: {} for p in POLICIES}
    for mfu in mfus:
        cost = base.with_prefill_mfu(mfu)
        rows = []
        for policy in POLICIES:
            cfg = replace(build_config(options, policy), cost=cost)  # = conductor compare
            s = simulate(requests, cfg, outputs=outputs).summary
            s["prefill_mfu"] = mfu
            rows.append(s)
            ttft = s["ttft_s"]
            assert isinstance(ttft, dict)
            table[policy][mfu] = ttft["mean"]
            print(f"mfu {mfu:g} {policy:>18s}: mean TTFT {ttft['mean']}", flush=True)
        stem = args.out / f"fig5_mfu_{mfu:.3f}".rstrip("0").replace(".", "")
        write_json(stem.with_suffix(".json"), rows)
        stem.with_suffix(".md").write_text(markdown_table(rows))
    head = "| policy | paper | " + " | ".join(f"MFU {m:g}" for m in mfus) + " |\n"
    head += "|---" * (len(mfus) + 2) + "|\n"
    body = "".join(
        f"| {p} | {PAPER_TTFT_S[p]:.2f} s | "
        + " | ".join("-" if (v := table[p][m]) is None else f"{v:.2f} s" for m in mfus)
        + " |\n"
        for p in POLICIES
    )
    (args.out / "fig5_mfu.md").write_text(
        "Mean TTFT on the conversation trace, 1x, 8P+8D (bench/fig5_mfu.py)\n\n" + head + body
    )


if __name__ == "__main__":
    main()
