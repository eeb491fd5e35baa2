"""Simulator fidelity on real vLLM engines (issue 12 items 4 and 5): one command.

    nice .venv/bin/python bench/fidelity.py [--limit 300] [--repeats 2] [--speed auto]

1. The slice: the first ``--limit`` requests of the bundled conversation trace, lengths
   scaled to the tiny model (``bench/fidelity_parts.py scale_records``: prompts x 1/16, so
   a 512-token trace block is one 32-token vLLM block, outputs x 0.1 capped at 64 —
   ``--output-scale``, ``--max-output-tokens``; the P/D scenario's default x 0.25 capped
   at 160, so its one decode engine is as busy as its prefill engine — prompt plus output
   within max_model_len 2048), written as a trace file that the replay and the
   simulator both read with 32-token blocks. Requests that share a timestamp (the trace's
   3-second stamps) are moved ``--tie-gap-ms`` (10) trace ms apart in file order, so that
   the replay and the simulator agree on the order they arrive in (``conductor trace
   spread``; 0 keeps the ties).
2. Two real vLLM CPU engines (role both, prefix caching, KV events, chunked prefill with
   ``--max-num-batched-tokens``, ``--max-num-seqs``), each engine's OpenMP thread bound to
   its own core (``--pin``: the whole engine too, ``taskset``).
3. ``conductor profile`` of engine e0 right before the replays (same machine, same load),
   unless ``--cost-file`` is given: the cost file every other step uses.
3b. The gateway's own latency (``--gateway-latency measure``, the default, both scenario):
   single-block prompts one at a time straight to e0 and through a round-robin gateway;
   the difference of the median TTFTs is given to the simulator as its dispatch and report
   latency, half each (a held request waits for the one before it to come back through the
   gateway, then has to get to its engine; docs/fidelity.md).
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

``--scenario pd``: the same slice on 1 prefill + 1 decode vLLM engine handing KV over with
vLLM's ExampleConnector (a shared folder, emptied before every replay; each engine's OpenMP
thread on its own core as above), the gateway given those roles, the simulator run with
``--prefill 1 --decode 1``. With one engine of each role every policy places alike: one
policy (conductor) unless ``--policies`` says otherwise; vLLM only (no emulated P/D).
Between 3. and 4.: the hand-off probe (``fidelity_cluster.handoff_probe``, one request at
a time, a few prompt lengths): TTFT through the gateway minus the prefill engine's own time,
less the profiled decode step, fitted as ``latency + s_per_token * tokens`` through the
per-length medians (as ``conductor profile --handoff-url`` fits it); the cost file's
``[transfer]`` (``conductor profile`` without ``--handoff-url`` writes option values there,
not measurements) is set
from that fit, and that file is the one the gateway and the simulator use. Compared: the
simulator with the scenario's protocol (``--handoff load --first-token decode``: the decode
engine reads the KV inside the step that admits the request, stalling its other streams,
and the client's first token is the decode engine's, so TTFT holds the read and one decode
step), the same with the profile's own ``[transfer]``, and
Mooncake's protocol (the simulator's default: streamed hand-off, TTFT ends with the
prefill). The doc's "P/D scenario"
section is rewritten; the rest of the doc is left alone.

Everything shares this machine's cores; the doc says what else was running.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import tomllib
from dataclasses import replace
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
    pd_intervals,
    row_intervals,
    scale_records,
    sim_config,
    sim_rows,
    simulate_slice,
    with_transfer,
)

from conductor.core.cost_file import parse_cost_file, render_cost_file  # noqa: E402
from conductor.profiling.handoff import (  # noqa: E402
    HandoffSample,
    fit_handoff,
    kv_moves,
    per_length_medians,
)
from conductor.workload.spread import DEFAULT_GAP_MS, spread_ties  # noqa: E402
from conductor.workload.trace import (  # noqa: E402
    bundled_trace_path,
    read_trace,
    write_trace,
)
from tests.engines.fixtures import TINY_MODEL, missing_prerequisites  # noqa: E402

POLICIES = ("round_robin", "least_loaded", "conductor")
MAX_NUM_BATCHED_TOKENS = 1024
"""The fidelity engines' vLLM ``--max-num-batched-tokens`` (chunked prefill's step budget)."""
MAX_NUM_SEQS = 64
"""The fidelity engines' vLLM ``--max-num-seqs``."""
FIDELITY_MODEL = Path.home() / ".cache" / "conductor" / "fidelity-model"


def ensure_model(path: Path) -> None:
    """Make bench/fidelity_model.py's model at ``path`` if it is not there."""
    if (path / ".generated").exists() or path.resolve() == TINY_MODEL.resolve():
        return
    import subprocess

    py = REPO / ".venv-vllm" / "bin" / "python"
    subprocess.run([str(py), str(REPO / "bench" / "fidelity_model.py"), str(path)], check=True)


SPEEDS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.35, 0.5, 0.6, 0.75, 0.9, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0)
SPEEDS += (4.0, 5.0, 6.0, 8.0)
"""The replay speeds ``--speed auto`` chooses among (from 0.05: an AVX2-only machine's float32
engines need rates a tenth of an AVX-512 machine's)."""


PD_OUTPUT_SCALE = 0.25
PD_MAX_OUTPUT_TOKENS = 160
"""The P/D scenario's output scaling: the conversation slice's outputs x 0.1 (the ``both``
scenario's) kept its one decode engine about 35% busy while the prefill engine ran at 68%;
x 0.25 capped at 160 puts both near ``--target-busy`` (simulated with the 2026-12-07 P/D
cost file at speed 0.25: decode 0.63, prefill 0.65). Chosen from the simulator, before a
measured run."""


def output_scaling(args: Any, max_model_len: int) -> Scaling:
    """The slice's :class:`Scaling` from ``--output-scale`` / ``--max-output-tokens`` (each
    defaulting by scenario); ValueError naming the option and the value."""
    pd = is_pd(args)
    scale = args.output_scale
    if scale is None:
        scale = PD_OUTPUT_SCALE if pd else Scaling().output_scale
    cap = args.max_output_tokens
    if cap is None:
        cap = PD_MAX_OUTPUT_TOKENS if pd else Scaling().max_output_tokens
    if not scale > 0:
        raise ValueError(f"--output-scale must be > 0, got {scale}")
    if not 1 <= cap < max_model_len:
        raise ValueError(f"--max-output-tokens must be in 1..{max_model_len - 1}, got {cap}")
    return Scaling(output_scale=scale, max_output_tokens=cap, max_model_len=max_model_len)


TIE_GAP_MS = DEFAULT_GAP_MS
"""Trace milliseconds between requests of the slice that share a timestamp (``--tie-gap-ms``;
``conductor trace spread``): without an order in time they reach the gateway in whatever
order the client and the gateway finish them, not the simulator's file order
(docs/fidelity.md, "Simultaneous arrivals")."""


def write_slice(limit: int, offset: int, scaling: Scaling, path: Path, tie_gap_ms: int = 0) -> int:
    """The slice as a trace file from time 0; with ``tie_gap_ms`` its simultaneous arrivals
    ordered in time (:func:`~conductor.workload.spread.spread_ties`)."""
    records = read_trace(bundled_trace_path(), limit=offset + limit).records[offset:]
    t0 = records[0].timestamp_ms
    scaled = [replace(r, timestamp_ms=r.timestamp_ms - t0) for r in scale_records(records, scaling)]
    write_trace(spread_ties(scaled, tie_gap_ms) if tie_gap_ms else scaled, path)
    return len(scaled)


PD_PROTOCOL = ("load", "decode")
"""The P/D scenario's protocol in the simulator (``--handoff load --first-token decode``):
ExampleConnector's decode engine reads the KV files inside the step that admits the
request, and ``conductor serve`` gives the client the decode engine's first token."""
NIC_PD_PROTOCOL = ("serial", "decode")
"""The same with the KV moved over the NICs after the prefill (no stall of the decode
engine's other streams): what modelling the load in the decode step buys."""
MOONCAKE_PROTOCOL = ("stream", "prefill")
"""The simulator's default: the KV streams during the prefill, whose engine gives the first
token."""
PD_VARIANTS: dict[str, tuple[str, bool, tuple[str, str] | None]] = {
    "profiled": ("sim_profiled_transfer", True, None),
    "nic": ("sim_nic_handoff", False, NIC_PD_PROTOCOL),
    "mooncake": ("sim_mooncake_protocol", False, MOONCAKE_PROTOCOL),
}
"""The P/D scenario's other simulations beside ``sim``: name (as :func:`analyse_pd` reads
it) -> (the result's key, with the profile's own ``[transfer]``, the protocol; None: the
scenario's)."""


def run_sim(
    trace: Path,
    speed: float,
    policy: str,
    cost: Any,
    shape: EngineShape,
    args: Any,
    protocol: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """One simulation of the slice; ``protocol`` ``(handoff, first_token)``, by default
    :data:`PD_PROTOCOL` in the P/D scenario and :data:`MOONCAKE_PROTOCOL` otherwise."""
    if protocol is None:
        protocol = PD_PROTOCOL if is_pd(args) else MOONCAKE_PROTOCOL
    h = getattr(args, "hold_horizon_ms", None)
    cfg = sim_config(
        policy,
        cost,
        shape,
        admission=args.admission,
        ttft_slo_s=args.ttft_slo_s,
        tbt_slo_s=args.tbt_slo_ms / 1e3,
        gateway_latency_s=getattr(args, "gateway_latency_s", 0.0),
        handoff=protocol[0],
        first_token=protocol[1],
        hold_horizon_s=None if h is None else h / 1e3,  # the gateway's, if given
    )
    res = simulate_slice(trace, speed, cfg)
    rows = sim_rows(res.records)
    window = (res.records[0].arrival_s, res.records[-1].arrival_s)
    return {
        "summary": res.summary,
        "rows": rows,
        "busy": busy_fraction(intervals(rows, args), window),
    }


def intervals(rows: list[dict[str, Any]], args: Any) -> list[Any]:
    """Per engine, when it had a request: P/D splits each request at its first token."""
    return pd_intervals(rows) if is_pd(args) else row_intervals(rows)


def is_pd(args: Any) -> bool:
    """Whether ``args`` (the bench's options, or a test's few) asks for the P/D scenario."""
    return getattr(args, "scenario", "both") == "pd"


def choose_speed(trace: Path, cost: Any, shape: EngineShape, args: Any) -> tuple[float, dict]:
    ladder: dict[str, float] = {}
    best, best_gap = SPEEDS[0], 9.0
    for s in SPEEDS:
        busy = run_sim(trace, s, "round_robin", cost, shape, args)["busy"]
        # P/D: the busier engine (the prefill one, mostly) sets the rate
        mean = max(busy.values()) if is_pd(args) else sum(busy.values()) / len(busy)
        ladder[str(s)] = round(mean, 4)
        if abs(mean - args.target_busy) < best_gap:
            best, best_gap = s, abs(mean - args.target_busy)
    return best, ladder


GATEWAY_PROBE_REQUESTS = 12
GATEWAY_PROBE_GAP_MS = 400


def gateway_latency(
    engines: list[fc.Engine], cost_file: Path, args: Any, work: Path
) -> dict[str, Any]:
    """What ``conductor serve`` adds to a request's TTFT on idle engines: the same
    ``GATEWAY_PROBE_REQUESTS`` single-block prompts (one token out, ``GATEWAY_PROBE_GAP_MS``
    apart, so one at a time) straight to engine 0 and through a round-robin gateway; the
    difference of the median TTFTs (the cost file's prefill times already hold everything
    between the client and the engine)."""
    lines = [
        {"timestamp": i * GATEWAY_PROBE_GAP_MS, "input_length": 32, "output_length": 1,
         "hash_ids": [900_000 + i]}
        for i in range(GATEWAY_PROBE_REQUESTS)
    ]  # fmt: skip
    trace = work / "gateway-probe.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))

    def median_ttft(url: str, label: str, pool: list[fc.Engine]) -> float:
        fc.reset_prefix_cache(engines)
        run = fc.replay(url, trace, 1.0, 0, pool, work / f"{label}.json", label, args.flags.model)
        return statistics.median(float(r["ttft_s"]) for r in run["rows"])

    direct = median_ttft(engines[0].url, "probe-direct", engines[:1])
    gw = fc.gateway(
        engines, cost_file, "round_robin", "off", args.flags, work,
        ttft_slo_s=args.ttft_slo_s, tbt_slo_ms=args.tbt_slo_ms,
    )  # fmt: skip
    with gw as url:
        through = median_ttft(url, "probe-gateway", engines)
    return {
        "requests": GATEWAY_PROBE_REQUESTS,
        "direct_median_ttft_s": round(direct, 5),
        "gateway_median_ttft_s": round(through, 5),
        "gateway_latency_s": round(max(through - direct, 0.0), 5),
    }


def measured_busy(rows: list[dict[str, Any]], args: Any = None) -> dict[str, float]:
    arrivals = [r["arrival_s"] for r in rows]
    return busy_fraction(intervals(rows, args), (min(arrivals), max(arrivals)))


def hold_args(args: Any) -> list[str]:
    """``conductor serve``'s hold-queue horizon, when ``--hold-horizon-ms`` gives one."""
    h = getattr(args, "hold_horizon_ms", None)
    return [] if h is None else ["--set", f"hold_horizon_ms={h}"]


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
            kv_files = fc.clear_folder(args.shared_kv) if args.shared_kv else None
            gw = fc.gateway(
                engines, cost_file, policy, args.admission, args.flags, work,
                ttft_slo_s=args.ttft_slo_s, tbt_slo_ms=args.tbt_slo_ms,
                extra_args=hold_args(args),
            )  # fmt: skip
            with gw as url:
                seed = 1 + rep * len(args.policies) + i
                out = work / f"{kind}-{policy}-{rep}.json"
                run = fc.replay(url, trace, speed, seed, engines, out, f"{kind}:{policy}",
                                args.flags.model)  # fmt: skip
            run["reset_status"] = codes
            run["kv_folders_cleared"] = kv_files
            run["busy"] = measured_busy(run["rows"], args)
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
    if args.shared_kv:
        fc.clear_folder(args.shared_kv)
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


def handoff(
    engines: list[fc.Engine], cost_file: Path, cost: Any, args: Any, work: Path
) -> tuple[Path, Any, dict[str, Any]]:
    """P/D: the hand-off probe through a conductor gateway, its fit, and the cost file with
    its ``[transfer]`` set from the fit (the file the replays and the simulator use); the
    cost file's own prediction beside each measured length."""
    prefill, decode = engines
    gw = fc.gateway(
        engines, cost_file, "conductor", args.admission, args.flags, work,
        ttft_slo_s=args.ttft_slo_s, tbt_slo_ms=args.tbt_slo_ms,
    )  # fmt: skip
    lengths = [int(x) for x in args.handoff_lengths.split(",") if x]
    load0 = [round(x, 2) for x in os.getloadavg()]
    with gw as url:
        samples = fc.handoff_probe(prefill, decode, url, lengths, args.handoff_samples, seed=7)
    medians = per_length_medians(
        [HandoffSample(int(r["prompt_tokens"]), r["prefill_s"], r["pd_ttft_s"]) for r in samples]
    )
    fit = fit_handoff(kv_moves(medians, cost))  # as conductor profile --handoff-url fits it
    fitted = with_transfer(cost, fit)
    info: dict[str, Any] = {
        "samples": samples,
        "loadavg_before": load0,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "fit": {
            "latency_s": round(fit.latency_s, 6),
            "s_per_token": fit.s_per_token,
            "n": fit.n,
            "max_residual_s": round(fit.max_residual_s, 6),
        },
        "profiled_transfer": {
            "bytes_per_s": cost.transfer_bytes_per_s,
            "latency_s": cost.transfer_latency_s,
        },
        "kv_bytes_per_token": cost.kv_bytes_per_token,
    }
    use = cost if fitted is None else fitted
    per: list[dict[str, Any]] = []
    for n in lengths:
        got = [r for r in samples if r["prompt_tokens"] == n]

        def med(key: str, rows: list[dict[str, float]] = got) -> float:
            return round(float(sorted(r[key] for r in rows)[len(rows) // 2]), 4)

        pre = cost.prefill_s(n, 0)
        step = cost.decode_step_s(1, n)
        per.append(
            {
                "prompt_tokens": n,
                "prefill_s": med("prefill_s"),
                "decode_leg_ttft_s": med("decode_leg_ttft_s"),
                "pd_ttft_s": med("pd_ttft_s"),
                "handoff_s": med("handoff_s"),
                "decode_step_s": round(step, 4),
                "fit_s": round(fit.at(n), 4),
                "cost_prefill_s": round(pre, 4),
                "profiled_transfer_s": round(cost.transfer_s(n), 4),
                "fitted_transfer_s": round(use.transfer_s(n), 4),
                # the scenario's protocol: the transfer after the prefill, then the decode
                # engine's first step makes the first token
                "sim_handoff_s": round(use.transfer_s(n) + step, 4),
            }
        )
    info["by_length"] = per
    if fitted is None:
        info["transfer_set"] = False
        return cost_file, cost, info
    transfer = {
        "bytes_per_s": fitted.transfer_bytes_per_s,
        "latency_s": fitted.transfer_latency_s,
    }
    note = (
        "bench/fidelity.py --scenario pd hand-off probe (ExampleConnector, shared folder):"
        f" TTFT through the gateway minus the prefill leg, {len(samples)} samples at"
        f" {lengths} tokens; each length's median less the profiled decode step, fitted"
        " latency_s + tokens * kv_bytes_per_token / bytes_per_s"
    )
    out = work / "cost-pd.toml"
    header = "conductor profile's file, [transfer] fitted"
    rewrite_cost_file(cost_file, out, {"transfer": transfer}, {"transfer": note}, header)
    info["transfer_set"] = True
    info["fitted_transfer"] = transfer
    return out, parse_cost_file(out.read_text()).cost, info


def rewrite_cost_file(
    cost_file: Path,
    out: Path,
    tables: dict[str, Any],
    measured: dict[str, Any],
    header: str,
) -> None:
    """``cost_file`` written to ``out`` with ``tables`` replaced and ``measured``'s keys set
    in its ``[measured]`` table, after a ``header`` comment."""
    doc = tomllib.loads(cost_file.read_text())
    doc.update(tables)
    doc["measured"] = {**doc.get("measured", {}), **measured}
    out.write_text(render_cost_file(doc, [header]))


def decode_step_from(decode_file: Path, cost_file: Path, work: Path) -> Path:
    """``cost_file`` with the ``[decode]`` fit (and its samples) of ``decode_file``: the P/D
    scenario's decode engine profiled beside the prefill engine (``--profile-both``)."""
    theirs = tomllib.loads(decode_file.read_text())
    samples = theirs.get("measured", {})
    measured = {
        k: samples[k]
        for k in ("decode_samples", "decode_rms_error", "decode_max_error")
        if k in samples
    }
    measured["decode"] = (
        "bench/fidelity.py --scenario pd --profile-both: the decode engine's own profile,"
        " taken at the same time as the prefill engine's"
    )
    out = work / "cost-pd-decode.toml"
    header = "conductor profile's file, [decode] of the decode engine's"
    rewrite_cost_file(cost_file, out, {"decode": theirs["decode"]}, measured, header)
    return out


def analyse_pd(
    sims: dict[str, dict[str, Any]], runs: dict[str, list[dict[str, Any]]], cost: Any
) -> dict[str, Any]:
    """P/D: per policy, each measured run against the simulation with the scenario's
    protocol (``sim``), the same with the profile's own ``[transfer]`` (``sim, profile's
    transfer``), with the KV over a NIC after the prefill (``sim, hand-off over a NIC``) and
    with Mooncake's protocol (``sim, Mooncake's protocol``). The hit rate is the
    prefill engine's (the decode engine loads every prompt from the connector's files)."""
    out: dict[str, Any] = {}
    for policy, reps in runs.items():
        mooncake = sims["mooncake"][policy]["rows"]
        variants = {
            f"{policy}: sim": sims["fitted"][policy]["rows"],
            f"{policy}: sim, profile's transfer": sims["profiled"][policy]["rows"],
            f"{policy}: sim, hand-off over a NIC": sims["nic"][policy]["rows"],
            f"{policy}: sim, Mooncake's protocol": mooncake,
        }
        sim_hit = float(sims["fitted"][policy]["summary"]["cache_hit_rate"])
        for name, rows in variants.items():
            per = []
            for run in reps:
                c = compare(rows, run["rows"])
                pre = run["engine_counters"]["p0"]
                q = pre[fc.PREFIX_METRICS[1]]
                real_hit = pre[fc.PREFIX_METRICS[0]] / q if q else None
                c["hit_rate_sim"] = round(sim_hit, 4)
                c["hit_rate_engines"] = None if real_hit is None else round(real_hit, 4)
                c["hit_rate_error_points"] = (
                    None if real_hit is None else round(100 * (sim_hit - real_hit), 2)
                )
                c["alone_slowdown_measured"] = alone_slowdown(
                    [{**r, "decode": r.get("prefill")} for r in run["rows"]], cost
                )
                per.append(c)
            out[name] = per
    return out


def summaries(sims: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each policy's simulation without its per-request rows."""
    return {pol: {"summary": s["summary"], "busy": s["busy"]} for pol, s in sims.items()}


def strip(runs: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """The runs without their per-request rows (kept in the comparisons' pairs)."""
    return {p: [{k: v for k, v in r.items() if k != "rows"} for r in rs] for p, rs in runs.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--limit", type=int, default=300)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument(
        "--tie-gap-ms",
        type=int,
        default=TIE_GAP_MS,
        help="trace ms between requests sharing a timestamp, in file order (0: keep the ties)",
    )
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1, help="unmeasured replays first (vLLM)")
    p.add_argument("--speed", default="auto", help="replay speed, or auto (see 4.)")
    p.add_argument("--target-busy", type=float, default=0.65)
    p.add_argument(
        "--output-scale",
        type=float,
        default=None,
        help=f"trace output lengths x this (default 0.1; pd: {PD_OUTPUT_SCALE:g})",
    )
    p.add_argument(
        "--max-output-tokens",
        type=int,
        default=None,
        help=f"cap on the scaled output lengths (default 64; pd: {PD_MAX_OUTPUT_TOKENS})",
    )
    p.add_argument(
        "--scenario",
        choices=("both", "pd"),
        default="both",
        help="both: 2 engines of role both; pd: 1 prefill + 1 decode (ExampleConnector)",
    )
    p.add_argument("--policies", default=None, help="default: all three; pd: conductor")
    p.add_argument(
        "--kinds", default=None, help="vllm and/or emulate (default both; pd: vllm only)"
    )
    p.add_argument("--handoff-lengths", default="64,256,512,1024,1984", help="pd probe")
    p.add_argument("--handoff-samples", type=int, default=5, help="pd probe, per length")
    p.add_argument("--cost-file", type=Path, default=None, help="default: profile e0 now")
    p.add_argument("--admission", default="off")
    p.add_argument(
        "--hold-horizon-ms",
        type=float,
        default=None,
        help="conductor's hold queue releases a request once its engine is predicted free"
        " within this long (gateway --set hold_horizon_ms and the simulator; default: the"
        " policy's, 0)",
    )
    p.add_argument(
        "--gateway-latency",
        default="measure",
        help="ms the gateway adds to TTFT, given to the simulator (dispatch and report"
        " latency, half each); 'measure' (default): probed on the engines, both scenario",
    )
    p.add_argument(
        "--profile-both",
        action="store_true",
        help="profile both engines at once (e0's file is used; pd: with the decode engine's"
        " decode step): the replay's contention",
    )
    p.add_argument("--ttft-slo-s", type=float, default=30.0)
    p.add_argument("--tbt-slo-ms", type=float, default=1000.0)
    p.add_argument("--max-num-batched-tokens", type=int, default=MAX_NUM_BATCHED_TOKENS)
    p.add_argument("--max-num-seqs", type=int, default=MAX_NUM_SEQS)
    p.add_argument("--pin", action="store_true", help="taskset each engine to its core")
    p.add_argument(
        "--model",
        type=Path,
        default=FIDELITY_MODEL,
        help="the engines' model folder (default: bench/fidelity_model.py's, made if missing)",
    )
    p.add_argument("--json", type=Path, default=REPO / "docs/results/fidelity.json")
    p.add_argument("--plot", type=Path, default=None, help="default: docs/figures/...png")
    p.add_argument("--doc", type=Path, default=REPO / "docs/fidelity.md")
    args = p.parse_args()
    try:
        lengths = [int(x) for x in args.handoff_lengths.split(",") if x]
    except ValueError:
        p.error(f"--handoff-lengths must be comma-separated integers, got {args.handoff_lengths!r}")
    if not lengths or min(lengths) < 1:
        p.error(f"--handoff-lengths must name positive token counts, got {args.handoff_lengths!r}")
    if args.handoff_samples < 1:
        p.error(f"--handoff-samples must be >= 1, got {args.handoff_samples}")
    if args.tie_gap_ms < 0:
        p.error(f"--tie-gap-ms must be >= 0 (0 keeps the ties), got {args.tie_gap_ms}")
    if args.hold_horizon_ms is not None and not args.hold_horizon_ms >= 0:
        p.error(f"--hold-horizon-ms must be >= 0, got {args.hold_horizon_ms}")
    if args.gateway_latency != "measure":
        try:
            ok = float(args.gateway_latency) >= 0
        except ValueError:
            ok = False
        if not ok:
            p.error(f"--gateway-latency must be 'measure' or ms >= 0, got {args.gateway_latency!r}")
    args.plot_given = args.plot is not None
    if args.plot is None:
        args.plot = REPO / "docs/figures/fidelity_ttft.png"
    pd = args.scenario == "pd"
    policies = args.policies or ("conductor" if pd else ",".join(POLICIES))
    args.policies = [x for x in policies.split(",") if x]
    kinds = [x for x in (args.kinds or ("vllm" if pd else "vllm,emulate")).split(",") if x]
    if pd and kinds != ["vllm"]:
        print("--scenario pd runs real vLLM only (--kinds vllm)", file=sys.stderr)
        return 2
    why = missing_prerequisites()
    if why is not None and "vllm" in kinds:
        print(f"cannot run: {why}", file=sys.stderr)
        return 1
    ensure_model(args.model)
    if pd:
        # ExampleConnector stores a prompt's KV at its first step, from the blocks allocated
        # by then: a prompt chunked over steps is stored cut short and the decode engine's
        # load fails (shape mismatch, engine dead). P/D engines run unchunked, with a budget
        # that holds the longest prompt.
        args.max_num_batched_tokens = max(
            args.max_num_batched_tokens, fc.EngineFlags().max_model_len
        )
    args.flags = fc.EngineFlags(
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        model=args.model.resolve(),
    )
    try:
        scaling = output_scaling(args, args.flags.max_model_len)
    except ValueError as exc:
        p.error(str(exc))
    work = Path(tempfile.mkdtemp(prefix="fidelity-"))
    trace = work / "slice.jsonl"
    n = write_slice(args.limit, args.offset, scaling, trace, args.tie_gap_ms)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result: dict[str, Any] = {
        "command": " ".join(["bench/fidelity.py", *sys.argv[1:]]),
        "scenario": args.scenario,
        "target_busy": args.target_busy,
        "work_dir": str(work),
        "started": started,
        "requests": n,
        "scaling": {k: getattr(scaling, k) for k in Scaling.__slots__},
        "tie_gap_ms": args.tie_gap_ms,
        "engine_flags": {k: str(getattr(args.flags, k)) for k in fc.EngineFlags.__slots__},
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "admission": args.admission,
        "hold_horizon_ms": args.hold_horizon_ms,
        "warmup_replays": args.warmup,
        "profile_both": args.profile_both,
        "pin": args.pin,
        "cpus": os.cpu_count(),
        "other_load_at_start": fc.other_load(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    args.shared_kv = None
    start: dict[str, Any] = {}
    if pd:
        args.shared_kv = work / "kv"
        args.shared_kv.mkdir()
        start = {
            "roles": (("p0", "prefill"), ("d0", "decode")),
            "extra_args": [
                [*a, "--no-enable-chunked-prefill"] for a in fc.pd_connector_args(args.shared_kv)
            ],
        }
        result["chunked_prefill"] = False
        result["kv_transfer"] = "ExampleConnector, shared folder " + str(args.shared_kv)
    engines = fc.start_vllm(2, args.flags, work, args.pin, **start) if "vllm" in kinds else []
    try:
        cost_file = args.cost_file
        if cost_file is None:
            cost_file = work / "cost.toml"
            t = time.monotonic()
            if args.profile_both:
                # Both engines profiled at once: each sees the other busy, as in the replay.
                fc.profile_together(engines, args.flags.model, cost_file, work)
                if pd:  # the decode step as the decode engine (the connector's consumer) ran it
                    decode_file = work / f"cost-{engines[1].engine_id}.toml"
                    cost_file = decode_step_from(decode_file, cost_file, work)
            else:
                fc.profile(engines[0], args.flags.model, cost_file)
            result["profile_wall_s"] = round(time.monotonic() - t, 1)
        result["cost_file"] = str(cost_file)
        result["cost_file_text"] = cost_file.read_text()
        cost = parse_cost_file(cost_file.read_text()).cost
        profiled = cost
        if pd:
            cost_file, cost, result["handoff"] = handoff(engines, cost_file, cost, args, work)
            result["cost_file_pd"] = str(cost_file)
            result["cost_file_pd_text"] = cost_file.read_text()
            print(f"hand-off: {result['handoff']['by_length']}", file=sys.stderr, flush=True)
        args.gateway_latency_s = 0.0
        if engines and not pd and args.gateway_latency == "measure":
            result["gateway_probe"] = gateway_latency(engines, cost_file, args, work)
            args.gateway_latency_s = result["gateway_probe"]["gateway_latency_s"]
            print(f"gateway probe: {result['gateway_probe']}", file=sys.stderr, flush=True)
        elif args.gateway_latency != "measure":
            args.gateway_latency_s = float(args.gateway_latency) / 1e3
        result["gateway_latency_s"] = args.gateway_latency_s
        kv = cost.kv_capacity_tokens
        if engines:
            kv = fc.kv_tokens(engines[0])
            result["engines"] = [e.info for e in engines]
        shape = EngineShape(
            n=0 if pd else 2,
            max_num_batched_tokens=args.flags.max_num_batched_tokens,
            max_num_seqs=args.flags.max_num_seqs,
            block_tokens=args.flags.block_size,
            kv_capacity_tokens=kv,
            n_prefill=1 if pd else 0,
            n_decode=1 if pd else 0,
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
        variants = {
            name: {
                pol: run_sim(trace, speed, pol, profiled if own else cost, shape, args, proto)
                for pol in args.policies
            }
            for name, (_, own, proto) in (PD_VARIANTS.items() if pd else ())
        }
        real: dict[str, list[dict[str, Any]]] = {}
        if engines:
            real = replays("vllm", engines, cost_file, trace, speed, args, work)
    finally:
        for e in engines:
            e.stop()
        if args.shared_kv:  # the connector's files: up to ~1 GB for 200 requests
            fc.clear_folder(args.shared_kv)
    emu: dict[str, list[dict[str, Any]]] = {}
    if "emulate" in kinds:
        emus = fc.start_emulated(2, args.flags, cost_file, kv // shape.block_tokens, work,
                                 args.pin)  # fmt: skip
        try:
            emu = replays("emulate", emus, cost_file, trace, speed, args, work)
        finally:
            for e in emus:
                e.stop()
    result["sim"] = summaries(sim)
    if pd:
        for name, (key, _, _) in PD_VARIANTS.items():
            result[key] = summaries(variants[name])
        if real:
            result["real"] = strip(real)
            result["sim_vs_real"] = analyse_pd({"fitted": sim, **variants}, real, cost)
        return finish(result, args)
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
    return finish(result, args)


def finish(result: dict[str, Any], args: Any) -> int:
    """Write the JSON, the plot and the doc (P/D: only the doc's P/D section)."""
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"results written to {args.json}", file=sys.stderr)
    if args.scenario == "pd":
        plot = args.plot if args.plot_given else REPO / "docs/figures/fidelity_pd_ttft.png"
        if "sim_vs_real" in result:
            fidelity_report.plot(result, plot)
        fidelity_report.write_pd_doc(result, args.doc, args.json, plot)
        return 0
    fidelity_report.plot(result, args.plot)
    fidelity_report.write_doc(result, args.doc, args.json, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
