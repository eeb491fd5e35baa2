"""Where a request's TTFT goes, on real vLLM and in the simulator, per policy (issue 12:
the fidelity bench's gap, taken apart).

    nice .venv/bin/python bench/fidelity_decompose.py [--limit 200] [--speed 1.5]
        [--configs round_robin,conductor,conductor:no-hold] [--cost-file F] [--json OUT]

The fidelity bench's slice and engines (bench/fidelity.py: the first ``--limit`` requests of
the bundled conversation trace scaled to bench/fidelity_model.py's model, two vLLM CPU
engines of role both, each taskset to its core), started with vLLM's
``--enable-logging-iteration-details`` (every engine step logged with its new prompt tokens,
its decode requests and its elapsed time). ``conductor profile`` of engine 0 first unless
``--cost-file``. One unmeasured round-robin replay, then for each config ``conductor serve
--policy P`` (``:no-hold``: its late-binding queue off) and ``conductor replay`` of the slice.

Per config, measured: the client's TTFT (mean, p90, mean by prompt length); the gateway's
hold time (``conductor_hold_seconds``); vLLM's own per-request queue, prefill and TTFT
(``vllm:request_queue_time_seconds``, ``vllm:request_prefill_time_seconds``,
``vllm:time_to_first_token_seconds``: from the API server's arrival); from the iteration
log, the engines' busy time in steps with prompt tokens and in decode-only steps, and the
mean step time by prompt tokens in the step. Simulated with the same cost file, slice and
speed: TTFT (mean, p90, by prompt length), arrival to the first step (hold plus the
engine's queue) and first step to first token.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import fidelity as fb  # noqa: E402
import fidelity_cluster as fc  # noqa: E402
from fidelity_parts import EngineShape, Scaling, sim_config, simulate_slice  # noqa: E402

from conductor.core.cost_file import parse_cost_file  # noqa: E402
from conductor.core.costmodel import CostModel  # noqa: E402
from tests.engines.fixtures import missing_prerequisites  # noqa: E402

PROMPT_BINS = ((0, 128), (128, 512), (512, 1024), (1024, 2048))
STEP_BINS = ((0, 64), (64, 256), (256, 512), (512, 768), (768, 1024))
VLLM = (
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
)
HOLD = ("conductor_hold_seconds_sum", "conductor_hold_seconds_count")
ITERATION = re.compile(
    r"Iteration\(\d+\): (\d+) context requests, (\d+) context tokens, (\d+) generation "
    r"requests, \d+ generation tokens, iteration elapsed time: ([\d.]+) ms"
)


def steps(lines: Sequence[str]) -> list[tuple[int, int, int, float]]:
    """(prompt requests, prompt tokens, decode requests, seconds) of each logged step."""
    out = []
    for line in lines:
        m = ITERATION.search(line)
        if m:
            a, b, c, ms = m.groups()
            out.append((int(a), int(b), int(c), float(ms) / 1e3))
    return out


def step_summary(all_steps: list[tuple[int, int, int, float]]) -> dict[str, Any]:
    prompt = [s for s in all_steps if s[1] > 0]
    by_bin = {}
    for lo, hi in STEP_BINS:
        sel = [s for s in prompt if lo < s[1] <= hi]
        if sel:
            by_bin[f"{lo}-{hi}"] = {
                "steps": len(sel),
                "mean_ms": round(1e3 * statistics.mean(s[3] for s in sel), 1),
                "mean_prompts": round(statistics.mean(s[0] for s in sel), 2),
                "mean_decodes": round(statistics.mean(s[2] for s in sel), 2),
            }
    return {
        "steps": len(all_steps),
        "prompt_steps": len(prompt),
        "prompt_steps_s": round(sum(s[3] for s in prompt), 2),
        "decode_only_steps_s": round(sum(s[3] for s in all_steps if s[1] == 0), 2),
        "prompt_step_ms_by_tokens": by_bin,
    }


def by_prompt(pairs: Sequence[tuple[int, float]]) -> dict[str, float]:
    out = {}
    for lo, hi in PROMPT_BINS:
        sel = [t for n, t in pairs if lo < n <= hi]
        if sel:
            out[f"{lo}-{hi}"] = round(statistics.mean(sel), 4)
    return out


def p90(xs: Sequence[float]) -> float:
    return sorted(xs)[int(0.9 * len(xs))]


@contextlib.contextmanager
def gateway(
    engines: Sequence[fc.Engine], cost_file: Path, policy: str, hold: bool, flags: Any, work: Path
) -> Iterator[str]:
    """The fidelity bench's gateway (admission off), ``hold`` False: its hold queue off."""
    extra: list[str] = []
    if not hold:
        config = work / "no-hold.toml"
        config.write_text("[gateway]\nlate_binding = false\n")
        extra = ["--config", str(config)]
    with fc.gateway(
        engines, cost_file, policy, "off", flags, work, ttft_slo_s=30.0, tbt_slo_ms=1000.0,
        extra_args=extra, log_name=f"{policy}-{int(hold)}",
    ) as url:  # fmt: skip
        yield url


def simulated(
    trace: Path, speed: float, policy: str, hold: bool, cost: CostModel, kv: int
) -> dict[str, Any]:
    block = fc.BLOCK_SIZE_TOKENS
    shape = EngineShape(
        n=2,
        max_num_batched_tokens=fb.MAX_NUM_BATCHED_TOKENS,
        max_num_seqs=fb.MAX_NUM_SEQS,
        block_tokens=block,
        kv_capacity_tokens=kv,
    )
    cfg = sim_config(policy, cost, shape, admission="off", ttft_slo_s=30.0, tbt_slo_s=1.0)
    if not hold:
        cfg = replace(cfg, scheduler=replace(cfg.scheduler, policy_params={"late_binding": 0.0}))
    recs = simulate_slice(trace, speed, cfg).records
    done = [r for r in recs if r.ttft_s is not None and r.prefill_start_s is not None]
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    return {
        "ttft_mean_s": round(statistics.mean(ttft), 4),
        "ttft_p90_s": round(p90(ttft), 4),
        "ttft_by_prompt_s": by_prompt([(r.prompt_tokens, r.ttft_s or 0.0) for r in done]),
        "arrival_to_first_step_s": round(
            statistics.mean((r.prefill_start_s or 0.0) - r.arrival_s for r in done), 4
        ),
        "first_step_to_first_token_s": round(
            statistics.mean((r.prefill_end_s or 0.0) - (r.prefill_start_s or 0.0) for r in done),
            4,
        ),
    }


def _log_lines(engine: fc.Engine) -> list[str]:
    return engine.log_path.read_text(errors="replace").splitlines()


def measure(
    engines: Sequence[fc.Engine], url: str, trace: Path, speed: float, seed: int, label: str,
    flags: Any, work: Path,
) -> dict[str, Any]:  # fmt: skip
    fc.reset_prefix_cache(engines)
    before = {e.engine_id: fc.metric_sums(e.url, VLLM) for e in engines}
    lines0 = {
        e.engine_id: len(e.log_path.read_text(errors="replace").splitlines()) for e in engines
    }
    run = fc.replay(url, trace, speed, seed, engines, work / f"{label}.json", label, flags.model)
    gw = fc.metric_sums(url, HOLD)
    after = {e.engine_id: fc.metric_sums(e.url, VLLM) for e in engines}
    v = {k: sum(after[e][k] - before[e][k] for e in after) for k in VLLM}
    n = v["vllm:time_to_first_token_seconds_count"] or 1.0
    logged: list[tuple[int, int, int, float]] = []
    for e in engines:
        logged += steps(_log_lines(e)[lines0[e.engine_id] :])
    rows = [r for r in run["rows"] if r["ttft_s"] is not None]
    ttft = [float(r["ttft_s"]) for r in rows]
    return {
        "ttft_mean_s": round(statistics.mean(ttft), 4),
        "ttft_p90_s": round(p90(ttft), 4),
        "ttft_by_prompt_s": by_prompt(
            [(int(r["prompt_tokens"]), float(r["ttft_s"])) for r in rows]
        ),
        "gateway_hold_mean_s": round(
            gw["conductor_hold_seconds_sum"] / max(gw["conductor_hold_seconds_count"], 1.0), 4
        ),
        "vllm_queue_mean_s": round(v["vllm:request_queue_time_seconds_sum"] / n, 4),
        "vllm_prefill_mean_s": round(v["vllm:request_prefill_time_seconds_sum"] / n, 4),
        "vllm_ttft_mean_s": round(v["vllm:time_to_first_token_seconds_sum"] / n, 4),
        "engine_steps": step_summary(logged),
        "busy": fb.measured_busy(run["rows"]),
        "hit_rate": run["engine_hit_rate"],
        "loadavg_after": run["loadavg_after"],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--speed", type=float, default=1.5)
    p.add_argument("--configs", default="round_robin,conductor,conductor:no-hold")
    p.add_argument("--cost-file", type=Path, default=None, help="default: profile e0 now")
    p.add_argument("--model", type=Path, default=fb.FIDELITY_MODEL)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    configs = []
    for item in [x for x in args.configs.split(",") if x]:
        policy, _, mode = item.partition(":")
        if mode not in ("", "no-hold"):
            p.error(f"--configs: {item!r}: the only suffix is ':no-hold'")
        configs.append((item, policy, mode != "no-hold"))
    if not configs:
        p.error(f"--configs names no policy: {args.configs!r}")
    if args.cost_file is not None and not args.cost_file.is_file():
        p.error(f"--cost-file {str(args.cost_file)!r} is not a file")
    if args.limit < 1 or args.speed <= 0:
        p.error(f"--limit must be >= 1 and --speed > 0, got {args.limit} and {args.speed}")
    why = missing_prerequisites()
    if why is not None:
        print(f"cannot run: {why}", file=sys.stderr)
        return 1
    fb.ensure_model(args.model)
    flags = fc.EngineFlags(
        max_num_batched_tokens=fb.MAX_NUM_BATCHED_TOKENS,
        max_num_seqs=fb.MAX_NUM_SEQS,
        model=args.model.resolve(),
    )
    work = Path(tempfile.mkdtemp(prefix="fidelity-decompose-"))
    trace = work / "slice.jsonl"
    fb.write_slice(args.limit, 0, Scaling(max_model_len=flags.max_model_len), trace)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    detail = [["--enable-logging-iteration-details"]] * 2
    engines = fc.start_vllm(2, flags, work, True, extra_args=detail)
    out: dict[str, Any] = {}
    try:
        cost_file = args.cost_file
        if cost_file is None:
            cost_file = work / "cost.toml"
            fc.profile(engines[0], flags.model, cost_file)
        cost_text = cost_file.read_text()
        cost = parse_cost_file(cost_text).cost
        kv = fc.kv_tokens(engines[0])
        with gateway(engines, cost_file, "round_robin", True, flags, work) as url:
            measure(engines, url, trace, args.speed, 0, "warm-up", flags, work)
        for i, (label, policy, hold) in enumerate(configs):
            with gateway(engines, cost_file, policy, hold, flags, work) as url:
                real = measure(engines, url, trace, args.speed, 1 + i, label, flags, work)
            sim = simulated(trace, args.speed, policy, hold, cost, kv)
            out[label] = {"vllm": real, "sim": sim}
            print(f"{label}: vLLM {json.dumps(real)}\n  sim {json.dumps(sim)}", flush=True)
    finally:
        for e in engines:
            e.stop()
    result = {
        "command": " ".join(["bench/fidelity_decompose.py", *sys.argv[1:]]),
        "started": started,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "requests": args.limit,
        "speed": args.speed,
        "cost_file_text": cost_text,
        "other_load_at_start": fc.other_load(),
        "configs": out,
    }
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
