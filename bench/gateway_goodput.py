"""Goodput through the real gateway: each policy run by ``conductor serve`` in front of the same
emulated prefill/decode cluster, side by side, beside what the simulator predicts.

    python bench/gateway_goodput.py [--kind agent] [--requests 600] [--speed 12] [--seed 19]
        [--prefill 4] [--decode 8] [--both 0] [--policies conductor,mooncake,...] [--json OUT]

What runs, per policy (fresh processes each time, so every policy starts from cold caches):

1. ``--prefill`` + ``--decode`` (+ ``--both``: aggregated engines, each decoding what it
   prefills) ``conductor emulate`` engines of those roles, timed by the cost
   model ``--preset`` (the simulator's default cluster: Llama-3-70B on 8 x A800 per instance),
   each with the simulator's engine shape: KV room of the preset in 32-token blocks, 8,192
   batched tokens per step, 256 sequences, chunked prefill (docs/emulator.md; they form their
   steps as the simulator's engines do).
2. ``conductor serve --policy P --admission early --set handoff="load"`` before them (the
   gateway: real HTTP, the engines' KV events over ZMQ, its hold queue, its P/D protocol —
   the prefill leg, then the decode leg that reads the KV inside a step and makes the first
   token), SLOs TTFT 30 s and TBT 100 ms.
3. ``conductor replay`` of a generated workload (``conductor trace synth --kind K --requests N
   --rate 2.5 --seed S --block-size 32``, its simultaneous arrivals ordered in time: ``conductor
   trace spread``)
   at ``--speed``, prompts made from the trace's block ids (shared prefixes hit), outputs as
   in the trace. Goodput: requests meeting both SLOs at the client, per second of the trace's
   span; 429s count as misses.

The same trace is simulated per policy with the same cluster, admission, SLOs and the
gateway's protocol (``--handoff load --first-token decode``, CPP off, no output lengths).
Every policy sees what the gateway sees; nothing is tuned here: the defaults are a held-out
case of bench/heldout.py (agent 12x, seed 19, 4P+8D), whose workload no parameter was chosen on.

Everything shares this machine's cores (the emulated engines use little CPU; the gateway and
the client stream every token). How late the engines' steps handed their tokens out, on
average (``conductor_emulator_late_seconds_total`` over steps), is printed and kept per
policy: the machine's own share of every token interval, which the simulator does not have;
and the mean TBT of the completed streams as the gateway relayed them
(``conductor_observed_tbt_seconds``) beside the client's and the simulated one. Prefix hit
rates: the simulator's ``cache_hit_rate`` is the prefill engines' (what their prefills
reused); compare it with the prefill-capable engines' own counters (``engines``, printed),
not with the replay's ``cache_hit_rate``, which under P/D is the decode engines' (the client's
``cached_tokens`` come from the decode leg). Figures only: nothing passes or fails on a
timing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fidelity_cluster as fc
from fidelity_parts import EngineShape, sim_config, simulate_slice
from hold_order import RATE_RPS

from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import DEFAULT_PRESET, preset
from conductor.core.errors import InvalidInput
from conductor.core.policies import check_policy
from conductor.demo.tokenizer import make_tokenizer
from conductor.sim.config import EngineConfig
from conductor.workload.spread import DEFAULT_GAP_MS, spread_ties
from conductor.workload.synth import KINDS, synthesize
from conductor.workload.trace import write_trace

BLOCK = 32
"""Tokens per KV block in the engines, the gateway and the generated trace (one hash id per
block). vLLM-like: a decode leg loads the prompt's full blocks and computes the rest, so a
large block (512) would make each decode engine recompute up to 511 tokens per joining
request, stalling its other streams."""
MAX_BATCHED_TOKENS = EngineConfig().max_num_batched_tokens
"""The simulator's engine default (vLLM's ``max_num_batched_tokens``)."""
MODEL_LEN = SchedulerConfig().context_tokens
TTFT_SLO_S = SchedulerConfig().ttft_slo_s
TBT_SLO_MS = SchedulerConfig().tbt_slo_s * 1e3
MODEL = "emulated"
HANDOFF = "load"
"""The emulated decode engines read a hand-off's KV inside a step: the gateway and the
simulated scheduler are told so (``serve --set handoff=...``, ``--handoff``)."""
POLICIES = (
    "conductor",
    "mooncake",
    "dynamo",
    "sglang",
    "llmd",
    "weighted",
    "cache_aware_local",
    "least_loaded",
    "round_robin",
)


@dataclass
class Emulated:
    name: str
    role: str
    url: str
    kv_port: int
    replay_port: int
    proc: subprocess.Popen[bytes]
    kv_blocks: int

    @property
    def spec(self) -> str:
        """Its ``--engine`` spec; ``max_blocks`` is its KV capacity, which the gateway also
        reads as its prefix cache's size (as an operator would configure it)."""
        return (
            f"{self.url},role={self.role},id={self.name},model={MODEL},block_size={BLOCK},"
            f"kv_events=tcp://127.0.0.1:{self.kv_port},replay=tcp://127.0.0.1:{self.replay_port},"
            f"max_blocks={self.kv_blocks}"
        )


def kv_tokens(args: Any, role: str) -> int:
    """An engine's KV capacity (its prefix cache lives in the free part): the preset's, or
    ``--prefill-cache-tokens`` on the prefill-capable engines."""
    if role != "decode" and args.prefill_cache_tokens is not None:
        return int(args.prefill_cache_tokens)
    return preset(args.preset).kv_capacity_tokens


def start_engines(args: Any, work: Path) -> list[Emulated]:
    engines: list[Emulated] = []
    try:
        for role, n in (("prefill", args.prefill), ("decode", args.decode), ("both", args.both)):
            kv_blocks = kv_tokens(args, role) // BLOCK
            for i in range(n):
                name = f"{role[0]}{i}"
                port, kv, rp = fc.free_ports(3)
                cmd = [*fc.CLI, "emulate", "--port", str(port), "--role", role]
                cmd += ["--kv-events-port", str(kv), "--replay-port", str(rp)]
                cmd += ["--engine-id", name, "--preset", args.preset, "--model", MODEL]
                cmd += ["--block-size", str(BLOCK), "--cache-blocks", str(kv_blocks)]
                cmd += ["--max-model-len", str(MODEL_LEN), "--log-level", "warning"]
                cmd += ["--max-batched-tokens", str(MAX_BATCHED_TOKENS)]
                cmd += ["--max-batch-size", str(preset(args.preset).max_batch_size)]
                with (work / f"{name}.log").open("wb") as log:
                    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                            cwd=fc.REPO, start_new_session=True)  # fmt: skip
                url = f"http://127.0.0.1:{port}"
                engines.append(Emulated(name, role, url, kv, rp, proc, kv_blocks))
        for e in engines:
            fc.wait_http(e.url, e.proc, work / f"{e.name}.log", 60)
    except BaseException:
        for e in engines:
            fc.stop_group(e.proc)
        raise
    return engines


@contextmanager
def gateway(engines: Sequence[Emulated], policy: str, args: Any, work: Path) -> Iterator[str]:
    (port,) = fc.free_ports(1)
    cmd = [*fc.CLI, "serve", "--port", str(port), "--model-name", MODEL]
    cmd += ["--model-path", str(work / "tokenizer")]  # the demo's; prompts come as token ids
    cmd += ["--block-size", str(BLOCK), "--max-model-len", str(MODEL_LEN)]
    cmd += ["--preset", args.preset, "--policy", policy, "--admission", "early"]
    cmd += ["--ttft-slo-s", str(TTFT_SLO_S), "--tbt-slo-ms", str(TBT_SLO_MS)]
    cmd += ["--log-level", "warning", "--max-body-bytes", str(64 << 20)]
    cmd += ["--kv-transfer-params"]  # the legs carry them: the emulator's (NIXL's) P/D protocol
    cmd += ["--set", f'handoff="{HANDOFF}"']
    for e in engines:
        cmd += ["--engine", e.spec]
    log = work / f"gateway-{policy}.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=fc.REPO,
                                start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        fc.wait_http(url, proc, log, 60)
        yield url
    finally:
        fc.stop_group(proc)


def replay(url: str, trace: Path, speed: float, out: Path, label: str) -> dict[str, Any]:
    cmd = [*fc.CLI, "replay", "--url", url, "--trace", str(trace), "--speed", str(speed)]
    cmd += ["--token-scale", "1", "--output-scale", "1", "--trace-block-size", str(BLOCK)]
    cmd += ["--block-size", str(BLOCK), "--model", MODEL, "--json", str(out), "--label", label]
    cmd += ["--ttft-slo-s", str(TTFT_SLO_S), "--tbt-slo-ms", str(TBT_SLO_MS)]
    cmd += ["--requests-json", str(out.with_suffix(".requests.json")), "--timeout-s", "300"]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, cwd=fc.REPO, stdout=subprocess.DEVNULL)
    summary: dict[str, Any] = json.loads(out.read_text())
    summary["wall_s"] = round(time.monotonic() - t0, 2)
    return summary


ENGINE_METRICS = (
    "conductor_emulator_steps_total",
    "conductor_emulator_late_seconds_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
)


def engine_figures(engines: Sequence[Emulated]) -> dict[str, Any]:
    """Per role, from the engines' own counters after the replay: how late their steps'
    tokens went out on average (the machine's share of every token interval, which the
    simulator does not have) and their prefix-cache hit rate."""
    out: dict[str, Any] = {}
    for role in sorted({e.role for e in engines}, key=("prefill", "decode", "both").index):
        sums = dict.fromkeys(ENGINE_METRICS, 0.0)
        for e in (e for e in engines if e.role == role):
            for name, value in fc.metric_sums(e.url, ENGINE_METRICS).items():
                sums[name] += value
        steps, late = sums[ENGINE_METRICS[0]], sums[ENGINE_METRICS[1]]
        queries, hits = sums[ENGINE_METRICS[2]], sums[ENGINE_METRICS[3]]
        out[role] = {
            "steps": int(steps),
            "late_ms_per_step": round(late / steps * 1e3, 3) if steps else None,
            "prefix_hit_rate": round(hits / queries, 4) if queries else None,
        }
    return out


GATEWAY_TBT = ("conductor_observed_tbt_seconds_sum", "conductor_observed_tbt_seconds_count")


def gateway_figures(url: str, real: dict[str, Any]) -> dict[str, Any]:
    """The mean TBT of the completed streams as the gateway relayed them
    (``conductor_observed_tbt_seconds``) beside the client's, on the same requests: what the
    engines delivered against what reached the client (the relay's and the client's share)."""
    sums = fc.metric_sums(url, GATEWAY_TBT)
    total, count = sums[GATEWAY_TBT[0]], sums[GATEWAY_TBT[1]]
    client = real["tbt_ms"]["mean"]
    return {
        "streams": int(count),
        "tbt_mean_ms": round(total / count * 1e3, 2) if count else None,
        "client_tbt_mean_ms": None if client is None else round(client, 2),
    }


def write_workload(
    path: Path, kind: str, requests: int, rate_rps: float, seed: int, gap_ms: int
) -> None:
    """The replayed trace: ``conductor trace synth`` with the engines' block size, its
    simultaneous arrivals spread ``gap_ms`` apart (``conductor trace spread``). Seeded: the
    same arguments write the same file (bench/gateway_resimulate.py relies on it)."""
    records = synthesize(kind, requests=requests, rate_rps=rate_rps, seed=seed,
                         block_size_tokens=BLOCK)  # fmt: skip
    write_trace(spread_ties(records, gap_ms), path)


def prefill_role(engines: dict[str, Any]) -> str:
    """Which engines' counters measure what the simulator's ``cache_hit_rate`` does: the
    prefill engines' under P/D, else the aggregated (``both``) ones'."""
    return "prefill" if "prefill" in engines else "both"


def simulated(trace: Path, speed: float, policy: str, args: Any) -> dict[str, Any]:
    cost = preset(args.preset)
    shape = EngineShape(
        n=args.both,
        n_prefill=args.prefill,
        n_decode=args.decode,
        max_num_batched_tokens=MAX_BATCHED_TOKENS,
        max_num_seqs=cost.max_batch_size,
        block_tokens=BLOCK,
        kv_capacity_tokens=(cost.kv_capacity_tokens // BLOCK) * BLOCK,
    )
    cfg = sim_config(
        policy,
        cost,
        shape,
        admission="early",
        ttft_slo_s=TTFT_SLO_S,
        tbt_slo_s=TBT_SLO_MS / 1e3,
        handoff=HANDOFF,
        first_token="decode",
    )
    if args.prefill_cache_tokens is not None:  # the prefill engines' prefix caches
        cfg = replace(cfg, cache_capacity_tokens=args.prefill_cache_tokens)
    return dict(simulate_slice(trace, speed, cfg).summary)


def row(name: str, real: dict[str, Any], sim: dict[str, Any]) -> str:
    def cells(s: dict[str, Any]) -> str:
        ttft = s["ttft_s"]["mean"]
        return (
            f"{s['goodput_rps']:>8.3f} {s['slo_attainment']:>6.3f} {int(s['rejected']):>5d} "
            f"{'-' if ttft is None else f'{ttft:.2f}':>7}"
        )

    return f"{name:<18} {cells(real)}   {cells(sim)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--kind", default="agent", choices=KINDS)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--speed", type=float, default=12.0)
    ap.add_argument("--prefill", type=int, default=4)
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--both", type=int, default=0)
    ap.add_argument("--preset", default=DEFAULT_PRESET)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--prefill-cache-tokens",
        type=int,
        default=None,
        help="KV capacity (and so prefix cache) of the prefill-capable engines in tokens "
        "(default: the preset's KV capacity)",
    )
    args = ap.parse_args()
    if args.both < 0:
        ap.error(f"--both must be >= 0, got {args.both}")
    least = 0 if args.both else 1  # with aggregated engines the P/D pools may be empty
    for flag, value, low in (("--requests", args.requests, 1), ("--prefill", args.prefill, least),
                             ("--decode", args.decode, least)):  # fmt: skip
        if value < low:
            ap.error(f"{flag} must be >= {low}, got {value}")
    if bool(args.prefill) != bool(args.decode):
        ap.error(f"--prefill and --decode go together, got {args.prefill} and {args.decode}")
    if not args.speed > 0:
        ap.error(f"--speed must be > 0, got {args.speed}")
    if args.prefill_cache_tokens is not None and args.prefill_cache_tokens < BLOCK:
        ap.error(f"--prefill-cache-tokens must be >= {BLOCK}, got {args.prefill_cache_tokens}")
    policies = [p for p in args.policies.split(",") if p]
    if not policies:
        ap.error(f"--policies names no policy: {args.policies!r}")
    for policy in policies:
        try:
            check_policy(policy)
        except InvalidInput as exc:
            ap.error(f"--policies: {exc.why}, got {policy!r}")
    work = Path(tempfile.mkdtemp(prefix="gateway-goodput-"))
    trace = work / "trace.jsonl"
    make_tokenizer(work / "tokenizer")
    write_workload(trace, args.kind, args.requests, RATE_RPS, args.seed, DEFAULT_GAP_MS)
    result: dict[str, Any] = {
        "command": " ".join(["bench/gateway_goodput.py", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "workload": {
            "kind": args.kind,
            "requests": args.requests,
            "rate_rps": RATE_RPS,
            "seed": args.seed,
            "speed": args.speed,
            "tie_gap_ms": DEFAULT_GAP_MS,
        },
        "cluster": {
            "prefill": args.prefill,
            "decode": args.decode,
            "both": args.both,
            "preset": args.preset,
            "block_tokens": BLOCK,
            "max_batched_tokens": MAX_BATCHED_TOKENS,
            "max_seqs": preset(args.preset).max_batch_size,
            "prefill_cache_tokens": args.prefill_cache_tokens,
        },
        "slo": {"ttft_s": TTFT_SLO_S, "tbt_ms": TBT_SLO_MS},
        "cpus": os.cpu_count(),
        "work_dir": str(work),
        "policies": {},
    }
    print(f"{'':<18} {'gateway + emulated engines':^28}   {'simulated':^28}")
    print(f"{'policy':<18} {'goodput':>8} {'att.':>6} {'rej.':>5} {'TTFT s':>7}   "
          f"{'goodput':>8} {'att.':>6} {'rej.':>5} {'TTFT s':>7}", flush=True)  # fmt: skip
    for policy in policies:
        sim = simulated(trace, args.speed, policy, args)
        load0 = os.getloadavg()
        engines = start_engines(args, work)
        try:
            with gateway(engines, policy, args, work) as url:
                real = replay(url, trace, args.speed, work / f"replay-{policy}.json", policy)
                real["relay"] = gateway_figures(url, real)
            real["engines"] = engine_figures(engines)
        finally:
            for e in engines:
                fc.stop_group(e.proc)
        real["loadavg_before"] = [round(x, 2) for x in load0]
        real["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        result["policies"][policy] = {"gateway": real, "sim": sim}
        print(row(policy, real, sim), flush=True)
        decoding = "decode" if "decode" in real["engines"] else "both"
        late = real["engines"][decoding]["late_ms_per_step"]
        print(f"{'':<18} {decoding} engines' steps handed out {late} ms late on average",
              flush=True)  # fmt: skip
        prefilling = prefill_role(real["engines"])
        print(f"{'':<18} prefix hit rate of the {prefilling} engines (their own counters) "
              f"{real['engines'][prefilling]['prefix_hit_rate']}, simulated "
              f"{sim['cache_hit_rate']:.4f}", flush=True)  # fmt: skip
        relay = real["relay"]
        print(f"{'':<18} mean TBT as the gateway relayed it {relay['tbt_mean_ms']} ms, at the "
              f"client {relay['client_tbt_mean_ms']} ms, simulated "
              f"{sim['tbt_ms']['mean']:.2f} ms", flush=True)  # fmt: skip
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
