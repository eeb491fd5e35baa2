"""Simulate saved ``bench/gateway_goodput.py`` runs again with today's simulator, beside what
the gateway measured then and what the simulator predicted then.

    python bench/gateway_resimulate.py docs/results/gateway_goodput_*_epyc.json [--policies P,Q]
        [--json OUT]

Each saved JSON names its workload (``conductor trace synth`` kind, requests, rate, seed, and
the gap that spread its simultaneous arrivals) and its cluster; the trace is generated again
from them (the generator is seeded, so it is the trace the gateway replayed) and every saved
policy (or those of ``--policies``) is simulated on it with the bench's own settings
(``gateway_goodput.simulated``: early admission, ``--handoff load --first-token decode``, CPP
off, no output lengths). Printed per run and policy: goodput req/s / mean TTFT s / mean TBT ms
/ prefix hit rate, for the gateway, the saved simulation and the one made now (the gateway's
hit rate is the prefill-capable engines' own counters, which is what the simulator's
``cache_hit_rate`` measures); then the mean absolute errors of the simulation made now against
the gateway. This is how docs/fidelity.md's re-simulation table is made again after a change
to the simulator. Figures only: nothing passes or fails on them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gateway_goodput as gg

WORKLOAD_KEYS = ("kind", "requests", "rate_rps", "seed", "speed", "tie_gap_ms")
CLUSTER_KEYS = ("prefill", "decode", "preset", "block_tokens")
CLUSTER_DEFAULTS = {"both": 0, "prefill_cache_tokens": None}
"""Options added to the bench later: runs saved before them ran with these values."""


def load_run(path: Path) -> dict[str, Any]:
    """A saved run, checked for the fields re-simulation reads (a clear error naming the
    file and the field otherwise)."""
    try:
        run = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: {path}: not a readable JSON file ({exc})") from exc
    if not isinstance(run, dict):
        raise SystemExit(f"error: {path}: not a gateway_goodput run (a JSON object)")
    for part, keys in (("workload", WORKLOAD_KEYS), ("cluster", CLUSTER_KEYS)):
        section = run.get(part)
        missing = [k for k in keys if not isinstance(section, dict) or k not in section]
        if missing:
            raise SystemExit(f"error: {path}: no {part}.{missing[0]} (not a gateway_goodput run?)")
    policies = run.get("policies")
    if not isinstance(policies, dict) or not policies:
        raise SystemExit(f"error: {path}: no policies")
    for name, saved in policies.items():
        if not isinstance(saved, dict) or not all(
            isinstance(saved.get(k), dict) for k in ("gateway", "sim")
        ):
            raise SystemExit(f"error: {path}: policies.{name} has no gateway and sim figures")
    if run["cluster"]["block_tokens"] != gg.BLOCK:
        raise SystemExit(
            f"error: {path}: cluster.block_tokens is {run['cluster']['block_tokens']}, "
            f"this bench's engines use {gg.BLOCK}"
        )
    return dict(run)


def trace_of(run: dict[str, Any], work: Path) -> Path:
    """The run's trace, written again (``load_run`` checked its block size is the bench's)."""
    w = run["workload"]
    path = work / "trace.jsonl"
    gg.write_workload(path, w["kind"], w["requests"], w["rate_rps"], w["seed"], w["tie_gap_ms"])
    return path


def cells(s: dict[str, Any], hit: float | None) -> str:
    ttft = s["ttft_s"]["mean"]
    ttft_s = "-" if ttft is None else f"{ttft:.2f}"
    hit_s = "-" if hit is None else f"{hit:.3f}"
    return f"{s['goodput_rps']:.3f} / {ttft_s} / {s['tbt_ms']['mean']:.0f} / {hit_s}"


def prefill_hit_rate(gateway: dict[str, Any]) -> float | None:
    """The prefill-capable engines' own prefix hit rate (``prefill``, else ``both``); None
    for runs saved before the bench read the engines' counters."""
    engines = gateway.get("engines", {})
    role = engines.get(gg.prefill_role(engines), {})
    return None if role.get("prefix_hit_rate") is None else float(role["prefix_hit_rate"])


def rel(a: float, b: float) -> float:
    return abs(a - b) / b if b else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("runs", type=Path, nargs="+", help="saved bench/gateway_goodput.py JSON")
    ap.add_argument("--policies", default=None, help="only these saved policies")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    only = None if args.policies is None else {p for p in args.policies.split(",") if p}
    if only is not None and not only:
        ap.error(f"--policies names no policy: {args.policies!r}")
    runs = [(path, load_run(path)) for path in args.runs]
    out: dict[str, Any] = {}
    errors: dict[str, list[float]] = {"goodput": [], "ttft": [], "hit_points": []}
    print("cells: goodput req/s / mean TTFT s / mean TBT ms / prefix hit rate")
    print(f"{'run':<44} {'policy':<18} {'gateway':<28} {'saved sim':<28} {'sim now':<28}")
    for path, run in runs:
        c = {**CLUSTER_DEFAULTS, **run["cluster"]}
        opts = SimpleNamespace(
            preset=c["preset"],
            prefill=c["prefill"],
            decode=c["decode"],
            both=c["both"],
            prefill_cache_tokens=c["prefill_cache_tokens"],
        )
        with tempfile.TemporaryDirectory(prefix="gateway-resim-") as tmp:
            trace = trace_of(run, Path(tmp))
            for policy, saved in run["policies"].items():
                if only is not None and policy not in only:
                    continue
                now = gg.simulated(trace, run["workload"]["speed"], policy, opts)
                gw, then = saved["gateway"], saved["sim"]
                hit = prefill_hit_rate(gw)
                out[f"{path.name}:{policy}"] = {"gateway": gw, "saved_sim": then, "sim": now}
                errors["goodput"].append(rel(now["goodput_rps"], gw["goodput_rps"]))
                if now["ttft_s"]["mean"] is not None and gw["ttft_s"]["mean"] is not None:
                    errors["ttft"].append(rel(now["ttft_s"]["mean"], gw["ttft_s"]["mean"]))
                if hit is not None:
                    errors["hit_points"].append(abs(now["cache_hit_rate"] - hit))
                print(
                    f"{path.name:<44} {policy:<18} {cells(gw, hit):<28} "
                    f"{cells(then, then['cache_hit_rate']):<28} "
                    f"{cells(now, now['cache_hit_rate']):<28}",
                    flush=True,
                )
    if not out:
        ap.error("no saved policy matched --policies")
    n = len(errors["goodput"])
    means = {k: sum(v) / len(v) if v else None for k, v in errors.items()}
    print(
        f"over {n} rows, the simulation now against the gateway: goodput within "
        f"{means['goodput']:.1%} on average, mean TTFT within "
        + ("-" if means["ttft"] is None else f"{means['ttft']:.1%}")
        + ", prefix hit rate within "
        + ("-" if means["hit_points"] is None else f"{means['hit_points']:.3f}")
    )
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": out, "mean_abs_error": means}, indent=1) + "\n")
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
