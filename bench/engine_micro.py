"""The simulator's engine model against one real vLLM engine, request by request, on small
hand-built scenarios (issue 12 item 1: does a short prompt wait behind a long one's chunks
as it does in vLLM, do decodes slow a prefill as they do there).

    nice .venv/bin/python bench/engine_micro.py [--repeats 4] [--cost-file F] [--json OUT]

One vLLM CPU engine (bench/fidelity_model.py's model, the fidelity bench's flags: chunked
prefill with ``--max-num-batched-tokens 1024``, 32-token blocks, pinned to core 0 with
``--pin``), profiled first by ``conductor profile`` unless ``--cost-file`` is given. Each
scenario is a few requests with distinct prompts (no shared prefix) at fixed offsets,
sent straight to the engine by ``conductor replay`` (no gateway), ``--repeats`` times with
the prefix cache reset in between; the first repeat warms the engine's kernels and is
reported apart. The same scenario runs through the simulator: one engine of role both, the
same flags, that cost file. Printed and kept in ``--json``: each request's TTFT, measured
(median of repeats 2..n) and simulated, and the simulated/measured ratio.
"""

from __future__ import annotations

import argparse
import json
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

import fidelity as fb  # noqa: E402
import fidelity_cluster as fc  # noqa: E402
from fidelity_parts import EngineShape  # noqa: E402

from conductor.core.cost_file import parse_cost_file  # noqa: E402
from conductor.core.costmodel import CostModel  # noqa: E402
from tests.engines.fixtures import missing_prerequisites  # noqa: E402

BLOCK = fc.BLOCK_SIZE_TOKENS  # the fidelity engines' KV block, one trace hash id each
SIM_ARGS = SimpleNamespace(admission="off", ttft_slo_s=30.0, tbt_slo_ms=1000.0)
"""The fidelity bench's simulator options: admission off, SLOs out of the way."""
# (offset ms, prompt tokens, output tokens) per request
SCENARIOS: dict[str, list[tuple[int, int, int]]] = {
    "short alone": [(0, 64, 1)],
    "704 alone": [(0, 704, 1)],
    "1920 alone (two chunks)": [(0, 1920, 1)],
    "1920, then 64 at 50 ms": [(0, 1920, 1), (50, 64, 1)],
    "1920, then 4 x 64": [(0, 1920, 1)] + [(20 + 20 * i, 64, 1) for i in range(4)],
    "6 mixed prompts at once": [(0, n, 8) for n in (1500, 100, 900, 64, 1200, 300)],
    "8 decoding, then 704": [(0, 64, 64)] * 8 + [(300, 704, 1)],
    "16 decoding, then 704": [(0, 64, 64)] * 16 + [(300, 704, 1)],
    "16 decoding, then 1024": [(0, 64, 64)] * 16 + [(300, 1024, 1)],
}


def scenario_records(spec: list[tuple[int, int, int]], first_id: int) -> list[dict[str, Any]]:
    """Trace lines for ``spec``: each prompt its own blocks (hash ids from ``first_id``)."""
    out, nxt = [], first_id
    for at_ms, prompt, output in spec:
        blocks = -(-prompt // BLOCK)
        ids = list(range(nxt, nxt + blocks))
        nxt += blocks
        out.append(
            {"timestamp": at_ms, "input_length": prompt, "output_length": output, "hash_ids": ids}
        )
    return out


def simulated(path: Path, cost: CostModel, flags: fc.EngineFlags, kv: int) -> list[float]:
    """Each request's simulated TTFT (trace order): the fidelity bench's simulator
    (:func:`fidelity.run_sim`) with one engine of role both, the real one's flags and KV."""
    shape = EngineShape(
        n=1,
        max_num_batched_tokens=flags.max_num_batched_tokens,
        max_num_seqs=flags.max_num_seqs,
        block_tokens=flags.block_size,
        kv_capacity_tokens=kv,
    )
    sim = fb.run_sim(path, 1.0, "round_robin", cost, shape, SIM_ARGS)
    return [float("nan") if r["ttft_s"] is None else float(r["ttft_s"]) for r in sim["rows"]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=4, help="replays per scenario (>= 2)")
    p.add_argument("--cost-file", type=Path, default=None, help="default: profile the engine")
    p.add_argument("--pin", action="store_true", help="taskset the engine to core 0")
    p.add_argument("--model", type=Path, default=fb.FIDELITY_MODEL)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    if args.repeats < 2:
        p.error(f"--repeats must be >= 2 (the first one warms the engine), got {args.repeats}")
    if args.cost_file is not None and not args.cost_file.is_file():
        p.error(f"--cost-file {str(args.cost_file)!r} is not a file")
    why = missing_prerequisites()
    if why is not None:
        print(f"cannot run: {why}", file=sys.stderr)
        return 1
    fb.ensure_model(args.model)
    work = Path(tempfile.mkdtemp(prefix="engine-micro-"))
    flags = fc.EngineFlags(
        max_num_batched_tokens=fb.MAX_NUM_BATCHED_TOKENS,
        max_num_seqs=fb.MAX_NUM_SEQS,
        model=args.model.resolve(),
    )
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (engine,) = fc.start_vllm(1, flags, work, args.pin)
    rows: list[dict[str, Any]] = []
    try:
        cost_file = args.cost_file
        if cost_file is None:
            cost_file = work / "cost.toml"
            fc.profile(engine, flags.model, cost_file)
        cost_text = cost_file.read_text()
        cost = parse_cost_file(cost_text).cost
        first_id = 1000
        for name, spec in SCENARIOS.items():
            recs = scenario_records(spec, first_id)
            first_id += sum(len(r["hash_ids"]) for r in recs)
            path = work / f"s{len(rows)}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in recs))
            runs = []
            for rep in range(args.repeats):
                fc.reset_prefix_cache([engine])
                out = work / f"s{len(rows)}-{rep}.json"
                run = fc.replay(engine.url, path, 1.0, 10 + rep, [engine], out, name, flags.model)
                by_id = sorted(run["rows"], key=lambda r: int(str(r["request_id"])[1:]))
                runs.append([float(r["ttft_s"]) for r in by_id])
            sim = simulated(path, cost, flags, fc.kv_tokens(engine))
            measured = [statistics.median(run[i] for run in runs[1:]) for i in range(len(spec))]
            ratio = [round(s / m, 3) for s, m in zip(sim, measured, strict=True)]
            rows.append(
                {
                    "scenario": name,
                    "requests": [list(s) for s in spec],
                    "measured_ttft_s": [round(x, 4) for x in measured],
                    "first_repeat_ttft_s": [round(x, 4) for x in runs[0]],
                    "sim_ttft_s": [round(x, 4) for x in sim],
                    "sim_over_measured": ratio,
                }
            )
            print(_line(rows[-1]), flush=True)
    finally:
        engine.stop()
    result = {
        "command": " ".join(["bench/engine_micro.py", *sys.argv[1:]]),
        "started": started,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "repeats": args.repeats,
        "pin": args.pin,
        "cost_file_text": cost_text,
        "other_load_at_start": fc.other_load(),
        "scenarios": rows,
    }
    print(json.dumps({"scenarios": len(rows), "ratios": [r["sim_over_measured"] for r in rows]}))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def _line(row: dict[str, Any]) -> str:
    m, s = row["measured_ttft_s"], row["sim_ttft_s"]
    if len(m) > 4:  # the decoding ones alike: the first, one of them, the last
        m, s = [m[0], m[1], m[-1]], [s[0], s[1], s[-1]]
    return f"{row['scenario']:<26} measured {m}  simulated {s}"


if __name__ == "__main__":
    raise SystemExit(main())
