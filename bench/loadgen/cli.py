"""The command line of ``bench/gateway_load.py`` (:data:`DESCRIPTION` is its ``--help``) and
the run it asks for: engines, the direct run, the gateway run, the comparison."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import report
from .cluster import (
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    REPO_ROOT,
    Serve,
    engines,
    find_serve,
    free_ports,
    gateway_args,
    make_tokenizer_dir,
    start,
    stop,
    wait_ready,
)
from .drive import run_async
from .measure import measure, warm_up
from .paired import run_paired_async
from .spec import RUN_OFFSET, LoadSpec, check_loopback
from .usage import (
    cache_delta,
    cpu_by_process,
    cpu_ms_per_request,
    cpu_s,
    engine_counters,
    group_pids,
)

DESCRIPTION = """\
Load test: completions straight to an emulated engine vs through ``conductor serve``.

Starts ``--engines`` emulated engines (``python -m conductor.cli.main emulate --instant``:
steps cost no time, so what is measured is HTTP and the gateway, not a model), sends
``--requests`` streaming completions (at most ``--duration-s`` seconds, ``--concurrency`` in
flight) straight to the first engine, then, if this checkout has ``conductor serve``, starts
the gateway in front of all engines and sends the same load through it. Prints both, the
latency the gateway adds (p50/p99 differences) and its sustained requests/s, and writes JSON.

Everything runs on 127.0.0.1; a ``--target`` URL must be a loopback address. The figures
depend on the machine: the load generator, the engines and the gateway share its cores
(``--procs`` spreads the load generator over several processes).

Run: ``.venv/bin/python bench/gateway_load.py [--engines 2] [--requests 2000]
[--concurrency 32] [--max-tokens 8] [--json out/gateway_load.json]``, or
``--target http://127.0.0.1:PORT`` to load a server that is already running.
"""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=DESCRIPTION, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--engines", type=int, default=2, help="emulated engines to start")
    p.add_argument("--requests", type=int, default=2000, help="requests per run (at most)")
    p.add_argument("--duration-s", type=float, default=60.0, help="seconds per run (at most)")
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    p.add_argument("--warmup", type=int, default=100, help="unmeasured requests first")
    p.add_argument("--max-tokens", type=int, default=8, help="tokens per completion")
    p.add_argument("--prompt-tokens", type=int, default=256, help="tokens per prompt")
    p.add_argument("--shared-prefix-tokens", type=int, default=128, help="of which shared")
    p.add_argument("--prefix-groups", type=int, default=8, help="distinct shared prefixes")
    p.add_argument("--procs", type=int, default=1, help="load generator processes")
    p.add_argument("--timeout-s", type=float, default=30.0, help="per-request timeout")
    p.add_argument(
        "--client",
        choices=("raw", "httpx", "wrk"),
        default="raw",
        help="raw: a minimal keep-alive HTTP/1.1 client (default; measures TTFT too);\n"
        "wrk: the wrk load generator (C; the least CPU per request, E2E latency only,\n"
        "runs --duration-s seconds, --procs threads); httpx: httpx.AsyncClient (costs a few\n"
        "ms of CPU per streamed request)",
    )
    p.add_argument(
        "--speedup", type=float, default=None, help="pace engines at cost model / X (not instant)"
    )
    p.add_argument("--policy", default="conductor", help="gateway scheduling policy")
    p.add_argument(
        "--gateway-arg", action="append", default=[], help="extra `conductor serve` argument"
    )
    p.add_argument("--no-gateway", action="store_true", help="only the direct run")
    p.add_argument(
        "--paired",
        action="store_true",
        help="latency at concurrency 1 with the raw client: alternate single requests to the\n"
        "engine and through the gateway in one run (the fairest added-latency figure on a\n"
        "shared machine; req/s is then 1 / mean latency of each path)",
    )
    p.add_argument(
        "--gateway-cmd",
        default=f"{shlex.quote(sys.executable)} -m conductor.cli.main",
        help="command that `serve ...` is appended to (default: this checkout's CLI)",
    )
    p.add_argument(
        "--model-path",
        type=Path,
        default=None,
        help="tokenizer folder for engines and gateway (default: none for the engines'\n"
        "byte tokenizer; a generated one if the gateway needs --model-path)",
    )
    p.add_argument("--target", default=None, help="load this running server instead")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--log-dir", type=Path, default=REPO_ROOT / "out" / "gateway_load")
    args = p.parse_args(argv)
    for name in (
        "engines",
        "requests",
        "concurrency",
        "max_tokens",
        "prompt_tokens",
        "prefix_groups",
        "procs",
    ):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    for name in ("warmup", "shared_prefix_tokens"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.duration_s <= 0 or args.timeout_s <= 0:
        p.error("--duration-s and --timeout-s must be > 0")
    if args.speedup is not None and args.speedup <= 0:
        p.error("--speedup must be > 0")
    if args.shared_prefix_tokens > args.prompt_tokens:
        p.error("--shared-prefix-tokens must be <= --prompt-tokens")
    if args.target is not None:
        check_loopback(args.target)
    if args.paired and (args.client != "raw" or args.concurrency != 1 or args.procs != 1):
        p.error("--paired needs --client raw, --concurrency 1 and --procs 1")
    if args.paired and (args.no_gateway or args.target is not None):
        p.error("--paired compares the engine with the gateway: drop --no-gateway/--target")
    return args


def spec_for(url: str, args: argparse.Namespace, run: int = 0) -> LoadSpec:
    return LoadSpec(
        url=url,
        requests=args.requests,
        duration_s=args.duration_s,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        prompt_tokens=args.prompt_tokens,
        shared_prefix_tokens=args.shared_prefix_tokens,
        prefix_groups=args.prefix_groups,
        warmup=args.warmup,
        timeout_s=args.timeout_s,
        client=args.client,
        offset=run * RUN_OFFSET,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    load_cfg = {
        k: getattr(args, k)
        for k in (
            "engines",
            "requests",
            "duration_s",
            "concurrency",
            "warmup",
            "max_tokens",
            "prompt_tokens",
            "shared_prefix_tokens",
            "prefix_groups",
            "procs",
            "speedup",
            "policy",
            "client",
        )
    }
    result: dict[str, Any] = {"config": load_cfg, "machine": report.machine()}
    if args.target is not None:
        spec = spec_for(args.target, args)
        warm_up(spec, args)
        result["target"] = measure(spec, args)
        report.print_row("target", result["target"])
        return report.finish(result, args)

    args.log_dir.mkdir(parents=True, exist_ok=True)
    serve: Serve | None = None
    why = "--no-gateway"
    if not args.no_gateway:
        serve, why = find_serve(shlex.split(args.gateway_cmd))
    model_path: Path | None = args.model_path
    if model_path is None and serve is not None and serve.has("--model-path"):
        model_path = make_tokenizer_dir(args.log_dir / "tokenizer")
    emulator_args = ["--instant"] if args.speedup is None else ["--speedup", str(args.speedup)]
    emulator_args += ["--block-size", str(BLOCK_SIZE), "--max-model-len", str(MAX_MODEL_LEN)]
    if model_path is not None:
        emulator_args += ["--model-path", str(model_path)]
    result["config"]["model_path"] = None if model_path is None else str(model_path)
    with engines(args.engines, args.log_dir, emulator_args) as eng:
        result["engines"] = eng
        pids = [e["pid"] for e in eng]
        direct: dict[str, Any] = {}
        if not args.paired:
            spec = spec_for(eng[0]["url"], args)
            warm_up(spec, args)
            before, cpu0 = engine_counters(eng), cpu_s(pids)
            direct = measure(spec, args)
            direct["engines"] = cache_delta(before, engine_counters(eng))
            direct["engines"]["cpu_ms_per_request"] = cpu_ms_per_request(
                cpu0, cpu_s(pids), direct["ok"]
            )
            result["direct"] = direct
            report.print_row("direct", direct)
        if serve is None:
            result["gateway"] = {"skipped": why}
            print(f"gateway: skipped: {why}")
            return report.finish(result, args)
        port = free_ports(1)[0]
        url = f"http://127.0.0.1:{port}"
        cmd = gateway_args(
            serve,
            eng,
            port,
            args.policy,
            model_path=model_path,
            max_model_len=MAX_MODEL_LEN,
            extra=args.gateway_arg,
        )
        result["gateway_cmd"] = cmd
        gw = start("gateway", cmd, url, args.log_dir)
        try:
            wait_ready(gw, 120, paths=("/health", "/v1/models"))
            spec = spec_for(url, args, run=1)
            if args.paired:
                before, cpu0, gw_cpu0 = (
                    engine_counters(eng),
                    cpu_s(pids),
                    cpu_s(group_pids(gw.popen.pid)),
                )
                pair = run_async(run_paired_async(spec_for(eng[0]["url"], args), spec))
                direct, through = report.summarize(pair[0]), report.summarize(pair[1])
                direct["paired"] = through["paired"] = True
                result["direct"] = direct
                report.print_row("direct", direct)
            else:
                warm_up(spec, args)
                by0 = cpu_by_process(group_pids(gw.popen.pid))
                before, cpu0, gw_cpu0 = (
                    engine_counters(eng),
                    cpu_s(pids),
                    cpu_s(group_pids(gw.popen.pid)),
                )
                through = measure(spec, args)
                by1 = cpu_by_process(group_pids(gw.popen.pid))
                through["gateway_cpu_ms_per_request_by_process"] = {
                    k: cpu_ms_per_request(by0[k], v, through["ok"])
                    for k, v in by1.items()
                    if k in by0
                }
            through["engines"] = cache_delta(before, engine_counters(eng))
            served = through["ok"] + (direct["ok"] if args.paired else 0)
            through["engines"]["cpu_ms_per_request"] = cpu_ms_per_request(cpu0, cpu_s(pids), served)
            through["gateway_cpu_ms_per_request"] = cpu_ms_per_request(
                gw_cpu0, cpu_s(group_pids(gw.popen.pid)), through["ok"]
            )
        finally:
            stop(gw)
        result["gateway"] = through
        report.print_row("gateway", through)
        added = report.added_latency(direct, through)
        result["added_latency_ms"] = added
        result["targets"] = report.targets(added, through)
        report.print_added(added, through)
    return report.finish(result, args)
