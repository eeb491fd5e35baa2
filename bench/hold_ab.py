"""Gateway variants side by side on real vLLM engines, paired round by round: what a
``conductor serve`` setting (the hold queue's horizon, say) changes in measured TTFT.

    nice .venv/bin/python bench/hold_ab.py [--rounds 3] [--speed auto] [--limit 200]
        [--variants 'round_robin;conductor;conductor --set hold_horizon_ms=30']
        [--cost-file F] [--pin] [--json OUT]

The fidelity slice (``bench/fidelity.py``: the first ``--limit`` requests of the bundled
conversation trace, lengths scaled to the fidelity model) on two vLLM CPU engines of role
both with the fidelity flags, one unmeasured warm-up replay, then ``--rounds`` rounds; each
round replays the slice once through a fresh gateway per variant, in the order given, with
the engines' prefix caches reset before each replay and a fresh token seed per round (the
same seed for every variant of a round). A variant is a policy name followed by extra
``conductor serve`` arguments. Printed per round: each variant's mean and p90 TTFT and its
mean TTFT over the first variant's in the same round (the box's drift between rounds moves
both); last, the mean of those ratios. ``--cost-file``: the gateway's cost file (default:
``conductor profile`` of e0 first); ``--speed auto`` (the default): the replay speed
``bench/fidelity.py`` would choose with that cost file (the simulator's round robin nearest
``--target-busy``, 0.65).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import fidelity_cluster as fc  # noqa: E402
from fidelity import (  # noqa: E402
    FIDELITY_MODEL,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    choose_speed,
    ensure_model,
    write_slice,
)
from fidelity_parts import EngineShape, Scaling  # noqa: E402

from conductor.core.cost_file import parse_cost_file  # noqa: E402
from conductor.core.policies.registry import policy_names  # noqa: E402
from tests.engines.fixtures import missing_prerequisites  # noqa: E402

DEFAULT_VARIANTS = "round_robin;conductor;conductor --set hold_horizon_ms=30"


def parse_variants(text: str) -> list[tuple[str, list[str]]]:
    """``POLICY [serve args...]`` items separated by ``;``; ValueError naming a bad one."""
    out: list[tuple[str, list[str]]] = []
    for item in (x.strip() for x in text.split(";") if x.strip()):
        words = shlex.split(item)
        if words[0] not in policy_names():
            raise ValueError(
                f"{item!r}: {words[0]!r} is not a policy (one of {', '.join(policy_names())})"
            )
        out.append((words[0], words[1:]))
    if len(out) < 2:
        raise ValueError(f"{text!r}: give at least two variants, separated by ';'")
    return out


def label(variant: tuple[str, list[str]]) -> str:
    return " ".join([variant[0], *variant[1]])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--speed", default="auto", help="replay speed, or auto")
    p.add_argument("--target-busy", type=float, default=0.65)
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--variants", default=DEFAULT_VARIANTS)
    p.add_argument("--cost-file", type=Path, default=None)
    p.add_argument("--pin", action="store_true", help="taskset each engine to its core")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    try:
        variants = parse_variants(args.variants)
    except ValueError as exc:
        p.error(f"--variants: {exc}")
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    try:
        speed = None if args.speed == "auto" else float(args.speed)
    except ValueError:
        p.error(f"--speed must be a number or auto, got {args.speed!r}")
    if speed is not None and not speed > 0:
        p.error(f"--speed must be > 0, got {args.speed}")
    why = missing_prerequisites()
    if why is not None:
        print(f"cannot run: {why}", file=sys.stderr)
        return 1
    ensure_model(FIDELITY_MODEL)
    flags = fc.EngineFlags(
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        max_num_seqs=MAX_NUM_SEQS,
        model=FIDELITY_MODEL.resolve(),
    )
    work = Path(tempfile.mkdtemp(prefix="hold-ab-"))
    trace = work / "slice.jsonl"
    n = write_slice(args.limit, 0, Scaling(max_model_len=flags.max_model_len), trace)
    result: dict[str, Any] = {
        "command": " ".join(["bench/hold_ab.py", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "requests": n,
        "pin": args.pin,
        "other_load_at_start": fc.other_load(),
        "variants": [label(v) for v in variants],
        "rounds": [],
    }
    engines = fc.start_vllm(2, flags, work, args.pin)
    try:
        cost_file = args.cost_file
        if cost_file is None:
            cost_file = work / "cost.toml"
            fc.profile(engines[0], flags.model, cost_file)
        result["cost_file_text"] = cost_file.read_text()
        if speed is None:
            shape = EngineShape(
                n=2,
                max_num_batched_tokens=flags.max_num_batched_tokens,
                max_num_seqs=flags.max_num_seqs,
                block_tokens=flags.block_size,
                kv_capacity_tokens=fc.kv_tokens(engines[0]),
            )
            cost = parse_cost_file(cost_file.read_text()).cost
            opts = SimpleNamespace(
                admission="off", ttft_slo_s=30.0, tbt_slo_ms=1000.0,
                target_busy=args.target_busy, scenario="both",
            )  # fmt: skip
            speed, result["speed_ladder_sim_busy"] = choose_speed(trace, cost, shape, opts)
        result["speed"] = speed
        print(f"speed {speed}", flush=True)

        def run(variant: tuple[str, list[str]], seed: int, name: str) -> dict[str, Any]:
            fc.reset_prefix_cache(engines)
            gw = fc.gateway(
                engines, cost_file, variant[0], "off", flags, work,
                ttft_slo_s=30.0, tbt_slo_ms=1000.0, extra_args=variant[1], log_name=name,
            )  # fmt: skip
            with gw as url:
                out = work / f"{name}.json"
                return fc.replay(url, trace, speed, seed, engines, out, name, flags.model)

        run(variants[0], 0, "warmup")  # unmeasured: vLLM's CPU kernels warm up
        for r in range(args.rounds):
            row: dict[str, Any] = {}
            for i, v in enumerate(variants):
                got = run(v, 1 + r, f"r{r}-v{i}")
                ttft = got["summary"]["ttft_s"]
                row[label(v)] = {
                    "ttft_mean_s": ttft["mean"],
                    "ttft_p90_s": ttft["p90"],
                    "failed": got["summary"].get("failed", 0),
                    "loadavg_after": got["loadavg_after"],
                }
            base = row[label(variants[0])]["ttft_mean_s"]
            for v in row.values():
                v["ratio_to_first"] = round(v["ttft_mean_s"] / base, 4)
            result["rounds"].append(row)
            print(f"round {r}: " + " | ".join(
                f"{k}: {v['ttft_mean_s']:.4f} / {v['ttft_p90_s']:.4f} s ({v['ratio_to_first']:.3f})"
                for k, v in row.items()), flush=True)  # fmt: skip
    finally:
        for e in engines:
            e.stop()
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    means = {
        k: round(statistics.mean(row[k]["ratio_to_first"] for row in result["rounds"]), 4)
        for k in result["variants"]
    }
    result["mean_ratio_to_first"] = means
    print("mean TTFT over the first variant's, averaged over rounds: " + ", ".join(
        f"{k} {v:.3f}" for k, v in means.items()))  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
