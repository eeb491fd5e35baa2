"""Tables, JSON and plots of simulation results (shell-side: files and terminals)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from conductor.sim.simulator import SimResult

SUMMARY_KEYS = (
    "policy",
    "admission",
    "requests",
    "completed",
    "rejected",
    "rejected_after_prefill",
    "ttft_s",
    "tbt_ms",
    "slo_attainment",
    "goodput_rps",
    "goodput_tokens_per_s",
    "rejected_by_prompt",
    "cache_hit_rate",
    "prefill_compute_s",
    "sim_wall_s",
)


def to_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=False) + "\n"


def write_json(path: str | Path, obj: Any) -> None:
    Path(path).write_text(to_json(obj))


def _f(v: object, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def row_label(s: dict[str, Any]) -> str:
    """``policy (admission, cpp)``; a policy's own bundle is labelled as such."""
    name = str(s["policy"])
    if s.get("bundle"):
        return f"{name} (own bundle: {s['admission']}{'+cpp' if s.get('cpp') else ''})"
    parts = [str(s["admission"])] if s["admission"] != "off" else []
    if s.get("cpp"):
        parts.append("cpp")
    if s.get("oracle_lengths"):
        parts.append("oracle lengths")
    return f"{name} ({', '.join(parts)})" if parts else name


def table_rows(results: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    head = [
        "policy",
        "TTFT mean s",
        "p50",
        "p90",
        "p99",
        "TBT mean ms",
        "p99",
        "SLO att.",
        "goodput r/s",
        "tok/s",
        "rejected",
        "rej. by prompt",
        "hit rate",
        "prefill s",
    ]
    rows = []
    for s in results:
        t, b = s["ttft_s"], s["tbt_ms"]
        label = row_label(s)
        bands = s.get("rejected_by_prompt", {})
        rej = str(s["rejected"])
        if s["rejected_after_prefill"]:
            rej += f" ({s['rejected_after_prefill']} late)"
        rows.append(
            [
                label,
                _f(t["mean"], ".2f"),
                _f(t["p50"], ".2f"),
                _f(t["p90"], ".2f"),
                _f(t["p99"], ".2f"),
                _f(b["mean"], ".1f"),
                _f(b["p99"], ".1f"),
                _f(s["slo_attainment"], ".3f"),
                _f(s["goodput_rps"], ".3f"),
                _f(s.get("goodput_tokens_per_s"), ".0f"),
                rej,
                "/".join(str(v) for v in bands.values()) or "-",
                _f(s["cache_hit_rate"], ".3f"),
                _f(s["prefill_compute_s"], ".0f"),
            ]
        )
    return head, rows


def markdown_table(results: Sequence[dict[str, Any]]) -> str:
    head, rows = table_rows(results)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def plot_comparison(
    results: Sequence[SimResult], path: str | Path, *, ttft_slo_s: float, tbt_slo_ms: float
) -> None:
    """TTFT CDF, TBT CDF and SLO-attainment bars per policy, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.8))
    for res in results:
        name = str(res.summary["policy"])
        ttft = np.sort([r.ttft_s for r in res.records if r.completed and r.ttft_s is not None])
        tbt = np.sort([r.tbt_s * 1e3 for r in res.records if r.completed and r.tbt_s is not None])
        if ttft.size:
            ax1.plot(ttft, np.arange(1, ttft.size + 1) / ttft.size, label=name)
        if tbt.size:
            ax2.plot(tbt, np.arange(1, tbt.size + 1) / tbt.size, label=name)
    ax1.axvline(ttft_slo_s, color="grey", linestyle="--", linewidth=1)
    ax1.set_xscale("symlog", linthresh=1.0)
    ax1.set_xlim(left=0)
    ax1.set_xlabel("TTFT (s)")
    ax1.set_ylabel("fraction of completed requests")
    ax1.set_title("TTFT CDF (dashed: SLO)")
    ax1.legend(fontsize=8)
    ax2.axvline(tbt_slo_ms, color="grey", linestyle="--", linewidth=1)
    ax2.set_xlabel("TBT, mean of longest 10% intervals (ms)")
    ax2.set_title("TBT CDF (dashed: SLO)")
    ax2.legend(fontsize=8)
    names = [row_label(r.summary) for r in results]
    att = [r.slo_attainment for r in results]
    bars = ax3.bar(range(len(names)), att, color="tab:blue")
    ax3.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax3.set_ylim(0, 1.05)
    ax3.set_title("SLO attainment (rejections count as misses)")
    for bar, a in zip(bars, att, strict=True):
        ax3.text(bar.get_x() + bar.get_width() / 2, a + 0.01, f"{a:.3f}", ha="center", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_load(result: SimResult, path: str | Path) -> None:
    """Prefill vs decode load over time (arXiv Fig. 9) and, when sampled, the replica count
    of the blocks ranked 10th/100th/1000th by use (FAST Fig. 11)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    if result.load_samples:
        t, pre, dec = zip(*result.load_samples, strict=True)
        tm = [x / 60 for x in t]
        ax1.plot(tm, pre, label="prefill load (queue / TTFT SLO)")
        ax1.plot(tm, dec, label="decode load (step time / TBT SLO)")
        ax1.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax1.set_ylabel("load")
        ax1.legend(fontsize=8)
    s = result.summary
    ax1.set_title(
        f"{s['policy']} admission={s['admission']}: rejected {s['rejected']}"
        f" ({s['rejected_after_prefill']} after prefill)"
    )
    if result.replica_samples:
        t2 = [x / 60 for x, _ in result.replica_samples]
        for k, rank in enumerate(result.config.replica_ranks):
            ys = [c[k] if k < len(c) else 0 for _, c in result.replica_samples]
            ax2.step(t2, ys, where="post", label=f"block ranked {rank}")
        ax2.set_ylabel("prefill caches holding it")
        ax2.set_ylim(0, result.config.n_prefill + 0.5)
        ax2.legend(fontsize=8)
    ax2.set_xlabel("time (min)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
