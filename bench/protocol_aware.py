"""What ``conductor`` gains by knowing the P/D protocol: every workload simulated with the
decode engine's first token (``--first-token decode``, vLLM's P/D proxy and ``conductor
serve``), the scheduler once predicting the prefill's first token (its default, Mooncake's)
and once told (``SchedulerConfig.first_token = "decode"``, what ``conductor serve`` sets).

    python bench/protocol_aware.py [--seed 42] [--json PATH]

Workloads: the bundled conversation trace at 1x and 2x, and ``conductor trace synth --kind K
--requests 2000 --rate 2.5 --seed S`` (42, the reported set; 7 and 11 are the generated
workloads the other parameters were tuned and checked on) at 1x and at the speeds of
docs/results.md (chat and agent 16x, docqa and mixed 2x); 8 prefill + 8 decode, the
default preset, early admission, CPP off, TTFT SLO 30 s, TBT SLO 100 ms. Printed: a
Markdown table of goodput (req/s) and mean TTFT per run; ``--json`` keeps the summaries.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import hold_order

from conductor.cli.sim_options import build_config, load_records
from conductor.sim.simulator import simulate
from conductor.workload.synth import synthesize
from conductor.workload.trace import generated_tokens, records_to_requests
from conductor.workload.trace_format import TraceRecord

SYNTH = (("chat", 1), ("agent", 1), ("docqa", 1), ("mixed", 1),
         ("chat", 16), ("agent", 16), ("docqa", 2), ("mixed", 2))  # fmt: skip
OPTIONS = replace(hold_order.OPTIONS, first_token="decode")


def run(records: list[TraceRecord], speed: float, told: bool) -> dict[str, object]:
    reqs = records_to_requests(records, speed=speed)
    cfg = build_config(OPTIONS, "conductor")  # the simulator and the scheduler: decode
    if not told:
        cfg = replace(cfg, scheduler=replace(cfg.scheduler, first_token="prefill"))
    return simulate(reqs, cfg, outputs=generated_tokens(records)).summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=42, help="the generated workloads' seed")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    _, conv = load_records(None, None, 1.0, False)
    cases = [("conversation trace", conv, 1.0), ("conversation trace", conv, 2.0)]
    for kind, x in SYNTH:
        records = synthesize(kind, requests=2000, rate_rps=2.5, seed=args.seed)
        cases.append((kind, records, float(x)))
    print("| workload | scheduler predicts the prefill's first token | scheduler told |")
    print("|---|---|---|")
    out = []
    for name, records, speed in cases:
        pair = [run(records, speed, told) for told in (False, True)]
        cells = []
        for s in pair:
            ttft = s["ttft_s"]
            assert isinstance(ttft, dict)
            cells.append(f"{s['goodput_rps']:.3f} req/s, TTFT {ttft['mean']:.2f} s")
        print(f"| {name}, {speed:g}x | {cells[0]} | {cells[1]} |", flush=True)
        out.append({"workload": name, "speed": speed, "unaware": pair[0], "told": pair[1]})
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
