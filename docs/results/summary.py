"""Renders the README's comparison tables from the JSON that make_results.sh wrote.

    .venv/bin/python docs/results/summary.py > docs/results/summary.md
    .venv/bin/python docs/results/summary.py decode_first   # the vLLM P/D protocol's runs

For each workload: the best peer under the same settings (every policy but ``conductor``,
early admission, CPP off), ``conductor`` under those settings, and ``conductor`` with its own
bundle (early + CPP), by goodput (requests meeting both SLOs per second); and the peer with
the lowest mean TTFT under the same settings (issue 13 asks for both).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

R = Path(__file__).parent
WORKLOADS = [
    ("conversation trace, 1x", "compare_1x"),
    ("conversation trace, 2x", "compare_2x"),
    ("conversation trace, 1x, no admission (placement only)", "compare_1x_off"),
    ("conversation trace, 2x, oracle output lengths (ablation)", "compare_2x_oracle"),
    ("docqa, 1x", "compare_synth_docqa"),
    ("mixed, 1x", "compare_synth_mixed"),
    ("chat, 1x", "compare_synth_chat"),
    ("agent, 1x", "compare_synth_agent"),
    ("chat, 16x", "compare_synth_chat_16x"),
    ("agent, 16x", "compare_synth_agent_16x"),
    ("docqa, 2x", "compare_synth_docqa_2x"),
    ("mixed, 2x", "compare_synth_mixed_2x"),
]


def _row(r: dict[str, object]) -> str:
    ttft = r["ttft_s"]
    assert isinstance(ttft, dict)
    return f"{r['goodput_rps']:.3f} (att. {r['slo_attainment']:.3f}, TTFT {ttft['mean']:.2f} s)"


def main() -> None:
    suffix = f"_{sys.argv[1]}" if len(sys.argv) > 1 else ""
    print(
        "| workload | best peer | `conductor`, same settings | margin | `conductor`, own bundle"
        " | lowest peer mean TTFT |"
    )
    print("|---|---|---|---|---|---|")
    for label, stem in WORKLOADS:
        path = R / f"{stem}{suffix}.json"
        if not path.exists():
            continue
        rows = json.loads(path.read_text())
        peers = [r for r in rows if r["policy"] != "conductor"]
        same = [r for r in rows if r["policy"] == "conductor" and not r.get("bundle")]
        own = [r for r in rows if r["policy"] == "conductor" and r.get("bundle")]
        best = max(peers, key=lambda r: r["goodput_rps"])
        fastest = min(peers, key=lambda r: r["ttft_s"]["mean"])
        c = same[0]
        margin = c["goodput_rps"] / best["goodput_rps"] - 1
        own_s = _row(own[0]) if own else "-"
        print(
            f"| {label} | `{best['policy']}` {_row(best)} | {_row(c)} | {margin:+.1%} | {own_s} "
            f"| `{fastest['policy']}` {fastest['ttft_s']['mean']:.2f} s |"
        )


if __name__ == "__main__":
    main()
