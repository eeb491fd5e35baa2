"""Simulator fidelity on real vLLM engines (issue 12 items 4 and 5): one command.

    nice .venv/bin/python bench/fidelity.py [--limit 300] [--repeats 2] [--speed auto]

1. The slice: the first ``--limit`` requests of the bundled conversation trace, lengths
   scaled to the tiny model (``bench/fidelity_parts.py scale_records``: prompts x 1/16, so
   a 512-token trace block is one 32-token vLLM block, outputs x 0.1 capped at 64, prompt
   plus output within max_model_len 2048), written as a trace file that the replay and the
   simulator both read with 32-token blocks.
2. Two real vLLM CPU engines (role both, prefix caching, KV events, chunked prefill with
   ``--max-num-batched-tokens``, ``--max-num-seqs``), each engine's OpenMP thread bound to
   its own core (``--pin``: the whole engine too, ``taskset``).
3. ``conductor profile`` of engine e0 right before the replays (same machine, same load),
   unless ``--cost-file`` is given: the cost file every other step uses.
4. The replay rate: the simulator (that cost file, round_robin) at a ladder of speeds; the
   one whose mean engine busy fraction is nearest ``--target-busy`` (0.65). Chosen from the
   cost model only, never from a measured run; the measured busy fraction is reported.
5. For each repeat and each policy: the engines' prefix caches reset, ``conductor serve
   --policy P --cost-file F`` in front of both, ``conductor replay`` of the slice (a fresh
   token seed each run), the engines' ``vllm:prefix_cache_*`` counters and CPU seconds
   around it.
6. The same slice simulated per policy (``sim_config``: 2 engines of role both, the real
   engines' flags, KV room, block size; the same admission, no CPP).
7. Item 5: the same replays against two ``conductor emulate`` engines timed by the same
   cost file, with the same limits, block size and KV blocks.
8. Compare (per request and in aggregate), write ``--json``, the scatter ``--plot`` and
   ``--doc`` (docs/fidelity.md; its analysis section is kept between runs).

Everything shares this machine's cores; the doc says what else was running.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import fidelity_cluster as fc  # noqa: E402
import fidelity_report  # noqa: E402
from fidelity_parts import (  # noqa: E402
    EngineShape,
    Scaling,
    alone_slowdown,
    busy_fraction,
    compare,
    ordering,
    row_intervals,
    scale_records,
    sim_config,
    sim_rows,
)

from conductor.core.cost_file import parse_cost_file  # noqa: E402
from conductor.sim.simulator import simulate  # noqa: E402
from conductor.workload.max_tokens import MaxTokens  # noqa: E402
from conductor.workload.trace import (  # noqa: E402
    bundled_trace_path,
    generated_tokens,
    read_trace,
    records_to_requests,
    write_trace,
)
from tests.engines.fixtures import TINY_MODEL, missing_prerequisites  # noqa: E402

POLICIES = ("round_robin", "least_loaded", "conductor")
FIDELITY_MODEL = Path.home() / ".cache" / "conductor" / "fidelity-model"


def ensure_model(path: Path) -> None:
    """Make bench/fidelity_model.py's model at ``path`` if it is not there."""
    if (path / ".generated").exists() or path.resolve() == TINY_MODEL.resolve():
        return
    import subprocess

    py = REPO / ".venv-vllm" / "bin" / "python"
    subprocess.run([str(py), str(REPO / "bench" / "fidelity_model.py"), str(path)], check=True)


SPEEDS = (0.25, 0.35, 0.5, 0.6, 0.75, 0.9, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)


def write_slice(limit: int, offset: int, scaling: Scaling, path: Path) -> int:
    records = read_trace(bundled_trace_path(), limit=offset + limit).records[offset:]
    t0 = records[0].timestamp_ms
    scaled = scale_records(records, scaling)
    from dataclasses import replace

    write_trace([replace(r, timestamp_ms=r.timestamp_ms - t0) for r in scaled], path)
    return len(scaled)


def run_sim(
    trace: Path, speed: float, policy: str, cost: Any, shape: EngineShape, args: Any
) -> dict[str, Any]:
    records = read_trace(trace, block_size_tokens=shape.block_tokens).records
    mt = MaxTokens.parse("trace")
    requests = records_to_requests(
        records, speed=speed, block_size_tokens=shape.block_tokens, max_tokens=mt
    )
    cfg = sim_config(
        policy,
        cost,
        shape,
        admission=args.admission,
        ttft_slo_s=args.ttft_slo_s,
        tbt_slo_s=args.tbt_slo_ms / 1e3,
    )
    res = simulate(requests, cfg, outputs=generated_tokens(records, mt))
    rows = sim_rows(res.records)
    window = (requests[0].arrival_s, requests[-1].arrival_s)
    return {
        "summary": res.summary,
        "rows": rows,
        "busy": busy_fraction(row_intervals(rows), window),
    }


def choose_speed(trace: Path, cost: Any, shape: EngineShape, args: Any) -> tuple[float, dict]:
    ladder: dict[str, float] = {}
    best, best_gap = SPEEDS[0], 9.0
    for s in SPEEDS:
        busy = run_sim(trace, s, "round_robin", cost, shape, args)["busy"]
        mean = sum(busy.values()) / len(busy)
        ladder[str(s)] = round(mean, 4)
        if abs(mean - args.target_busy) < best_gap:
            best, best_gap = s, abs(mean - args.target_busy)
    return best, ladder


def measured_busy(rows: list[dict[str, Any]]) -> dict[str, float]:
    arrivals = [r["arrival_s"] for r in rows]
    return busy_fraction(row_intervals(rows), (min(arrivals), max(arrivals)))


def replays(
    kind: str, engines: list[fc.Engine], cost_file: Path, trace: Path, speed: float,
    args: Any, work: Path,
) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in args.policies}
    for _ in range(args.warmup if kind == "vllm" else 0):
        # Unmeasured: vLLM's CPU kernels are slow the first time they meet a batch shape
        # (first replays ran slower than later ones of the same policy).
        warm(engines, cost_file, trace, speed, args, work)
    for rep in range(args.repeats):
        for i, policy in enumerate(args.policies):
            codes = fc.reset_prefix_cache(engines)
            gw = fc.gateway(
                engines, cost_file, policy, args.admission, args.flags, work,
                ttft_slo_s=args.ttft_slo_s, tbt_slo_ms=args.tbt_slo_ms,
            )  # fmt: skip
            with gw as url:
                seed = 1 + rep * len(args.policies) + i
                out = work / f"{kind}-{policy}-{rep}.json"
                run = fc.replay(url, trace, speed, seed, engines, out, f"{kind}:{policy}",
                                args.flags.model)  # fmt: skip
            run["reset_status"] = codes
            run["busy"] = measured_busy(run["rows"])
            run["seed"] = seed
            s = run["summary"]
            print(
                f"{kind} {policy} rep {rep}: mean TTFT {s['ttft_s']['mean']:.4f} s, p90"
                f" {s['ttft_s']['p90']:.4f} s, hit rate {run['engine_hit_rate']:.3f}, busy"
                f" {run['busy']}, engine CPU {run['engine_cpu_s']} s in {run['wall_s']} s,"
                f" load {run['loadavg_after']}",
                file=sys.stderr,
                flush=True,
            )
            runs[policy].append(run)
    return runs


def warm(
    engines: list[fc.Engine], cost_file: Path, trace: Path, speed: float, args: Any, work: Path
) -> None:
    """One unmeasured replay of the slice (token seed 0, round robin)."""
    gw = fc.gateway(
        engines, cost_file, "round_robin", args.admission, args.flags, work,
        ttft_slo_s=args.ttft_slo_s, tbt_slo_ms=args.tbt_slo_ms,
    )  # fmt: skip
    with gw as url:
        run = fc.replay(url, trace, speed, 0, engines, work / "warmup.json", "warmup",
                        args.flags.model)  # fmt: skip
    s = run["summary"]
    print(f"warm-up: mean TTFT {s['ttft_s']['mean']:.4f} s", file=sys.stderr, flush=True)


def analyse(
    sim: dict[str, Any], runs: dict[str, list[dict[str, Any]]], cost: Any
) -> dict[str, Any]:
    """Per policy and repeat: the simulation against each measured run."""
    out: dict[str, Any] = {}
    for policy, reps in runs.items():
        per = []
        for run in reps:
            c = compare(sim[policy]["rows"], run["rows"])
            sim_hit = float(sim[policy]["summary"]["cache_hit_rate"])
            real_hit = run["engine_hit_rate"]
            c["hit_rate_sim"] = round(sim_hit, 4)
            c["alone_slowdown_measured"] = alone_slowdown(run["rows"], cost)
            c["alone_slowdown_sim"] = alone_slowdown(sim[policy]["rows"], cost)
            c["hit_rate_engines"] = None if real_hit is None else round(real_hit, 4)
            c["hit_rate_error_points"] = (
                None if real_hit is None else round(100 * (sim_hit - real_hit), 2)
            )
            per.append(c)
        out[policy] = per
    return out


def policy_order(sim: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    sim_means = {p: float(sim[p]["summary"]["ttft_s"]["mean"]) for p in runs}
    out: dict[str, Any] = {"sim": ordering(sim_means), "sim_mean_ttft_s": sim_means}
    reps = min(len(r) for r in runs.values())
    out["measured"] = []
    for k in range(reps):
        means = {p: float(runs[p][k]["summary"]["ttft_s"]["mean"]) for p in runs}
        out["measured"].append({"order": ordering(means), "mean_ttft_s": means})
    return out


def emu_vs_real(
    emu: dict[str, list[dict[str, Any]]], real: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    """Item 5: each emulated run against the measured run of the same policy and repeat."""
    out: dict[str, Any] = {}
    for policy in real:
        per = []
        for e, r in zip(emu.get(policy, []), real[policy], strict=False):
            c = compare(e["rows"], r["rows"])
            eh, rh = e["engine_hit_rate"], r["engine_hit_rate"]
            c["hit_rate_emulated"] = eh
            c["hit_rate_engines"] = rh
            c["hit_rate_error_points"] = (
                None if eh is None or rh is None else round(100 * (eh - rh), 2)
            )
            per.append(c)
        out[policy] = per
    return out


def strip(runs: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """The runs without their per-request rows (kept in the comparisons' pairs)."""
    return {p: [{k: v for k, v in r.items() if k != "rows"} for r in rs] for p, rs in runs.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--limit", type=int, default=300)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1, help="unmeasured replays first (vLLM)")
    p.add_argument("--speed", default="auto", help="replay speed, or auto (see 4.)")
    p.add_argument("--target-busy", type=float, default=0.65)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--kinds", default="vllm,emulate", help="vllm and/or emulate")
    p.add_argument("--cost-file", type=Path, default=None, help="default: profile e0 now")
    p.add_argument("--admission", default="off")
    p.add_argument(
        "--profile-both",
        action="store_true",
        help="profile both engines at once (e0's file is used): the replay's contention",
    )
    p.add_argument("--ttft-slo-s", type=float, default=30.0)
    p.add_argument("--tbt-slo-ms", type=float, default=1000.0)
    p.add_argument("--max-num-batched-tokens", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--pin", action="store_true", help="taskset each engine to its core")
    p.add_argument(
        "--model",
        type=Path,
        default=FIDELITY_MODEL,
        help="the engines' model folder (default: bench/fidelity_model.py's, made if missing)",
    )
    p.add_argument("--json", type=Path, default=REPO / "docs/results/fidelity.json")
    p.add_argument("--plot", type=Path, default=REPO / "docs/figures/fidelity_ttft.png")
    p.add_argument("--doc", type=Path, default=REPO / "docs/fidelity.md")
    args = p.parse_args()
    args.policies = [x for x in args.policies.split(",") if x]
    kinds = [x for x in args.kinds.split(",") if x]
    why = missing_prerequisites()
    if why is not None and "vllm" in kinds:
        print(f"cannot run: {why}", file=sys.stderr)
        return 1
    ensure_model(args.model)
    args.flags = fc.EngineFlags(
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        model=args.model.resolve(),
    )
    scaling = Scaling(max_model_len=args.flags.max_model_len)
    work = Path(tempfile.mkdtemp(prefix="fidelity-"))
    trace = work / "slice.jsonl"
    n = write_slice(args.limit, args.offset, scaling, trace)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result: dict[str, Any] = {
        "command": " ".join(["bench/fidelity.py", *sys.argv[1:]]),
        "started": started,
        "requests": n,
        "scaling": {k: getattr(scaling, k) for k in Scaling.__slots__},
        "engine_flags": {k: str(getattr(args.flags, k)) for k in fc.EngineFlags.__slots__},
        "admission": args.admission,
        "warmup_replays": args.warmup,
        "profile_both": args.profile_both,
        "pin": args.pin,
        "cpus": os.cpu_count(),
        "other_load_at_start": fc.other_load(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    engines = fc.start_vllm(2, args.flags, work, args.pin) if "vllm" in kinds else []
    try:
        cost_file = args.cost_file
        if cost_file is None:
            cost_file = work / "cost.toml"
            t = time.monotonic()
            if args.profile_both:
                # Both engines profiled at once: each sees the other busy, as in the replay.
                fc.profile_together(engines, args.flags.model, cost_file, work)
            else:
                fc.profile(engines[0], args.flags.model, cost_file)
            result["profile_wall_s"] = round(time.monotonic() - t, 1)
        result["cost_file"] = str(cost_file)
        result["cost_file_text"] = cost_file.read_text()
        cost = parse_cost_file(cost_file.read_text()).cost
        kv = cost.kv_capacity_tokens
        if engines:
            cc = engines[0].info["cache_config"]
            kv = int(cc["num_gpu_blocks"]) * int(cc["block_size"])
            result["engines"] = [e.info for e in engines]
        shape = EngineShape(
            n=2,
            max_num_batched_tokens=args.flags.max_num_batched_tokens,
            max_num_seqs=args.flags.max_num_seqs,
            block_tokens=args.flags.block_size,
            kv_capacity_tokens=kv,
        )
        result["shape"] = {k: getattr(shape, k) for k in EngineShape.__slots__}
        if args.speed == "auto":
            speed, ladder = choose_speed(trace, cost, shape, args)
            result["speed_ladder_sim_busy"] = ladder
        else:
            speed = float(args.speed)
        result["speed"] = speed
        print(f"{n} requests at speed {speed}", file=sys.stderr, flush=True)
        sim = {pol: run_sim(trace, speed, pol, cost, shape, args) for pol in args.policies}
        real: dict[str, list[dict[str, Any]]] = {}
        if engines:
            real = replays("vllm", engines, cost_file, trace, speed, args, work)
    finally:
        for e in engines:
            e.stop()
    emu: dict[str, list[dict[str, Any]]] = {}
    if "emulate" in kinds:
        emus = fc.start_emulated(2, args.flags, cost_file, kv // shape.block_tokens, work,
                                 args.pin)  # fmt: skip
        try:
            emu = replays("emulate", emus, cost_file, trace, speed, args, work)
        finally:
            for e in emus:
                e.stop()
    result["sim"] = {pol: {"summary": s["summary"], "busy": s["busy"]} for pol, s in sim.items()}
    if real:
        result["real"] = strip(real)
        result["sim_vs_real"] = analyse(sim, real, cost)
        result["order_real"] = policy_order(sim, real)
    if emu:
        result["emulated"] = strip(emu)
        result["sim_vs_emulated"] = analyse(sim, emu, cost)
        result["order_emulated"] = policy_order(sim, emu)
    if real and emu:
        result["emulated_vs_real"] = emu_vs_real(emu, real)
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"results written to {args.json} (work files in {work})", file=sys.stderr)
    fidelity_report.plot(result, args.plot)
    fidelity_report.write_doc(result, args.doc, args.json, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
