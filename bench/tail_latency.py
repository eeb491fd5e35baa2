"""Tail latency under load: ``conductor serve`` beside a Rust router, the same engines, one run.

Issue 14, item 3: the gateway's p99 at 32 concurrent streams should be at most 1.5x that of
vllm-router (``cache_aware``) in the same run. This starts ``--engines`` emulated engines
(``--instant``: steps cost no time, so what is measured is the routers, not a model), starts
``conductor serve`` and each peer router in front of all of them, and then measures the same
load (streaming completions, ``--concurrency`` in flight, prompts sharing prefixes) through each
in ``--rounds`` alternating rounds, so that whatever else loads the machine loads every router
alike. Prints per-round and pooled p50/p99 TTFT and end-to-end latency, the p99 ratios, and
writes JSON.

The peers install from PyPI (``pip install vllm-router sglang-router``, into any environment);
``--peer NAME=COMMAND`` names each one's executable, default ``vllm-router`` found on PATH or
beside this interpreter. Everything runs on 127.0.0.1, so the load generator, the engines and the
routers share this machine's cores: read the ratios, not the absolute figures.

Run: ``.venv/bin/python bench/tail_latency.py [--engines 2] [--requests 1000]
[--concurrency 32] [--rounds 3] [--peer vllm-router=/path/to/vllm-router] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadgen import report
from loadgen.cluster import (
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    REPO_ROOT,
    Proc,
    engines,
    find_serve,
    free_ports,
    gateway_args,
    make_tokenizer_dir,
    start,
    stop,
    wait_ready,
)
from loadgen.drive import run_load
from loadgen.spec import RUN_OFFSET, LoadSpec, Samples

PEER_POLICY = {"vllm-router": "cache_aware", "sglang-router": "cache_aware"}
"""The policy each peer runs: its KV-cache-aware default, the one comparable to ours."""

TARGET_P99_RATIO = 1.5
"""Issue 14, item 3: the gateway's p99 at most this many times vllm-router's."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--engines", type=int, default=2, help="emulated engines")
    p.add_argument("--requests", type=int, default=1000, help="requests per router per round")
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    p.add_argument("--rounds", type=int, default=3, help="alternating measured rounds")
    p.add_argument("--warmup", type=int, default=100, help="unmeasured requests per router")
    p.add_argument("--max-tokens", type=int, default=8, help="tokens per completion")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--shared-prefix-tokens", type=int, default=128)
    p.add_argument("--prefix-groups", type=int, default=8)
    p.add_argument("--policy", default="conductor", help="the gateway's policy")
    p.add_argument(
        "--gateway-arg", action="append", default=[], help="extra `conductor serve` argument"
    )
    p.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="NAME=COMMAND",
        help="a peer router (vllm-router or sglang-router) and its executable; default:\n"
        "vllm-router from PATH or beside this interpreter",
    )
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--log-dir", type=Path, default=REPO_ROOT / "out" / "tail_latency")
    args = p.parse_args(argv)
    for name in ("engines", "requests", "concurrency", "rounds", "max_tokens", "prompt_tokens"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    args.peers = parse_peers(p, args.peer)
    return args


def parse_peers(p: argparse.ArgumentParser, specs: Sequence[str]) -> dict[str, str]:
    if not specs:
        found = shutil.which("vllm-router") or shutil.which(
            "vllm-router", path=str(Path(sys.executable).parent)
        )
        if found is None:
            p.error("--peer: vllm-router is not installed (pip install vllm-router)")
        return {"vllm-router": found}
    peers: dict[str, str] = {}
    for spec in specs:
        name, sep, cmd = spec.partition("=")
        if not sep or name not in PEER_POLICY or not cmd:
            p.error(f"--peer: expected vllm-router=COMMAND or sglang-router=COMMAND, got {spec!r}")
        peers[name] = cmd
    return peers


def peer_args(name: str, cmd: str, port: int, urls: Sequence[str]) -> list[str]:
    """The peer's own command line: host, port, the engines, its cache-aware policy, and a
    free port of its own for its Prometheus exporter."""
    launch = ["launch"] if name == "sglang-router" else []  # its router-only subcommand
    return [
        cmd,
        *launch,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *urls,
        "--policy",
        PEER_POLICY[name],
        "--prometheus-port",
        str(free_ports(1)[0]),
    ]


def spec_for(url: str, args: argparse.Namespace, run: int) -> LoadSpec:
    return LoadSpec(
        url=url,
        requests=args.requests,
        duration_s=600.0,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        prompt_tokens=args.prompt_tokens,
        shared_prefix_tokens=args.shared_prefix_tokens,
        prefix_groups=args.prefix_groups,
        warmup=0,
        timeout_s=30.0,
        client="raw",
        offset=run * RUN_OFFSET,
    )


def merge(runs: Sequence[Samples]) -> Samples:
    """The rounds of one router as one run: :meth:`Samples.merge` (made for concurrent
    processes, it keeps the longest wall time), with the rounds' wall times added, since
    they ran one after another."""
    out = Samples()
    for s in runs:
        out.merge(s)
    out.wall_s = sum(s.wall_s for s in runs)
    return out


def start_routers(
    args: argparse.Namespace, eng: list[dict[str, Any]], model_path: Path
) -> dict[str, Proc]:
    serve, why = find_serve([sys.executable, "-m", "conductor.cli.main"])
    if serve is None:
        raise SystemExit(f"conductor serve: {why}")
    routers: dict[str, Proc] = {}
    ports = free_ports(1 + len(args.peers))
    cmd = gateway_args(
        serve,
        eng,
        ports[0],
        args.policy,
        model_path=model_path,
        max_model_len=MAX_MODEL_LEN,
        extra=args.gateway_arg,
    )
    routers["conductor"] = start("conductor", cmd, f"http://127.0.0.1:{ports[0]}", args.log_dir)
    for port, (name, exe) in zip(ports[1:], args.peers.items(), strict=True):
        cmd = peer_args(name, exe, port, [e["url"] for e in eng])
        routers[name] = start(name, cmd, f"http://127.0.0.1:{port}", args.log_dir)
    for proc in routers.values():
        wait_ready(proc, 120, paths=("/health", "/v1/models"))
    return routers


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    emulator_args = ["--instant", "--block-size", str(BLOCK_SIZE)]
    emulator_args += ["--max-model-len", str(MAX_MODEL_LEN)]
    model_path = make_tokenizer_dir(args.log_dir / "tokenizer")  # the gateway tokenizes
    emulator_args += ["--model-path", str(model_path)]  # and the engines alike
    result: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "log_dir")},
        "machine": report.machine(),
        "rounds": [],
    }
    result["config"]["peer_policy"] = {n: PEER_POLICY[n] for n in args.peers}
    with engines(args.engines, args.log_dir, emulator_args) as eng:
        routers = start_routers(args, eng, model_path)
        try:
            for k, proc in enumerate(routers.values()):  # warm-up: own prompts, unmeasured
                warm = spec_for(proc.url, args, run=100 + k)
                run_load(replace(warm, requests=args.warmup), 1)
            samples: dict[str, list[Samples]] = {name: [] for name in routers}
            for r in range(args.rounds):
                order = list(routers.items())
                if r % 2:
                    order.reverse()  # neither router always runs first
                row: dict[str, Any] = {}
                for name, proc in order:
                    s = run_load(spec_for(proc.url, args, run=1 + r), 1)
                    samples[name].append(s)
                    row[name] = report.summarize(s)
                    report.print_row(f"{name[:8]}", row[name])
                result["rounds"].append(row)
        finally:
            for proc in routers.values():
                stop(proc)
    pooled = {name: report.summarize(merge(runs)) for name, runs in samples.items()}
    result["pooled"] = pooled
    print("pooled over rounds:")
    for name, s in pooled.items():
        report.print_row(f"{name[:8]}", s)
    ratios: dict[str, dict[str, float | None]] = {}
    ours = pooled["conductor"]
    for name in args.peers:
        theirs = pooled[name]
        ratios[name] = {
            key: (round(ours[key] / theirs[key], 3) if ours[key] and theirs[key] else None)
            for key in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms")
        }
        print(f"conductor / {name}: {ratios[name]}")
    result["ratio_conductor_over_peer"] = ratios
    vr = ratios.get("vllm-router", {}).get("e2e_p99_ms")
    result["target"] = {
        "e2e_p99_ratio_to_vllm_router_at_most": TARGET_P99_RATIO,
        "met": vr is not None and vr <= TARGET_P99_RATIO,
    }
    return report.finish(result, args)


if __name__ == "__main__":
    sys.exit(main())
