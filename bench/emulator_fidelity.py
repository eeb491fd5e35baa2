"""The emulated engine against a real vLLM engine, on the same requests (issue 12, item 5).

1. Start a real vLLM CPU engine serving ``.tiny-model`` (tests/engines/fixtures.py).
2. Profile it with ``conductor profile`` (unless ``--cost-file`` is given).
3. Replay a slice of the bundled conversation trace against it with ``conductor replay``
   (lengths scaled to the tiny model), reading its ``vllm:prefix_cache_*`` counters before
   and after; stop it.
4. Start ``conductor emulate --cost-file`` (the profile) with the same block size and KV
   capacity, replay the same slice (same seed: the same token ids), read its counters.
5. Compare per request (TTFT, TBT) and in aggregate (mean/p50/p90 TTFT, mean TBT, the
   engines' own prefix hit rates); print a table and write JSON.

The engine, the emulator and the load generator share this machine's cores (the two runs
are sequential, never together); say so when quoting the figures.

Run: ``.venv/bin/python bench/emulator_fidelity.py [--limit 200] [--speed 4]
[--cost-file F] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.engines.fixtures import (  # noqa: E402
    BLOCK_SIZE_TOKENS,
    SERVED_MODEL_NAME,
    TINY_MODEL,
    free_ports,
    missing_prerequisites,
    start_vllm_engine,
)

CLI = [sys.executable, "-m", "conductor.cli.main"]


def counters(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
            if line.startswith(name + "{"):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def replay(url: str, args: argparse.Namespace, out: Path) -> tuple[dict[str, Any], list[Any]]:
    before = counters(url)
    rows = out.with_suffix(".requests.json")
    cmd = [*CLI, "replay", "--url", url, "--limit", str(args.limit), "--speed", str(args.speed)]
    cmd += ["--token-scale", str(args.token_scale), "--output-scale", str(args.output_scale)]
    cmd += ["--max-output-tokens", str(args.max_output_tokens)]
    cmd += ["--max-prompt-tokens", str(args.max_prompt_tokens), "--model-path", str(TINY_MODEL)]
    cmd += ["--json", str(out), "--requests-json", str(rows), "--seed", str(args.seed)]
    subprocess.run(cmd, check=True, cwd=REPO)
    after = counters(url)
    summary = json.loads(out.read_text())
    hits = after["vllm:prefix_cache_hits_total"] - before.get("vllm:prefix_cache_hits_total", 0)
    queries = after["vllm:prefix_cache_queries_total"] - before.get(
        "vllm:prefix_cache_queries_total", 0
    )
    summary["engine_hit_rate"] = hits / queries if queries else 0.0
    return summary, json.loads(rows.read_text())


def wait_http(url: str, timeout_s: float = 60.0) -> None:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not healthy after {timeout_s} s")


def compare(
    real: list[Any], emu: list[Any], sreal: dict[str, Any], semu: dict[str, Any]
) -> dict[str, Any]:
    by_id = {r["request_id"]: r for r in emu}
    ttft_err, tbt_err = [], []
    for r in real:
        e = by_id.get(r["request_id"])
        if e is None or r["ttft_s"] is None or e["ttft_s"] is None:
            continue
        ttft_err.append((e["ttft_s"] - r["ttft_s"]) / r["ttft_s"])
        if r["tbt_s"] and e["tbt_s"]:
            tbt_err.append((e["tbt_s"] - r["tbt_s"]) / r["tbt_s"])

    def pct(xs: list[float]) -> dict[str, float]:
        a = np.abs(np.asarray(xs))
        return {
            "mean": round(float(a.mean()), 4),
            "p50": round(float(np.percentile(a, 50)), 4),
            "p90": round(float(np.percentile(a, 90)), 4),
            "signed_mean": round(float(np.mean(xs)), 4),
        }

    def rel(key: str, stat: str) -> float:
        return round((semu[key][stat] - sreal[key][stat]) / sreal[key][stat], 4)

    return {
        "requests_compared": len(ttft_err),
        "per_request_ttft_abs_error": pct(ttft_err),
        "per_request_tbt_abs_error": pct(tbt_err) if tbt_err else None,
        "mean_ttft_error": rel("ttft_s", "mean"),
        "p50_ttft_error": rel("ttft_s", "p50"),
        "p90_ttft_error": rel("ttft_s", "p90"),
        "mean_tbt_error": rel("tbt_ms", "mean"),
        "hit_rate_real": round(sreal["engine_hit_rate"], 4),
        "hit_rate_emulated": round(semu["engine_hit_rate"], 4),
        "hit_rate_error_points": round(
            100 * (semu["engine_hit_rate"] - sreal["engine_hit_rate"]), 2
        ),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--speed", type=float, default=4.0)
    p.add_argument("--token-scale", type=float, default=0.0625)
    p.add_argument("--output-scale", type=float, default=0.1)
    p.add_argument("--max-output-tokens", type=int, default=64)
    p.add_argument(
        "--max-prompt-tokens", type=int, default=None, help="default: 2048 - max output tokens"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cost-file", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    if args.max_prompt_tokens is None:
        args.max_prompt_tokens = 2048 - args.max_output_tokens
    why = missing_prerequisites()
    if why is not None:
        print(f"cannot run: {why}", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="emu-fidelity-"))
    port, emu_port = free_ports(2)
    engine = start_vllm_engine(port, None, ["--enable-prompt-tokens-details"])
    try:
        print(f"vLLM healthy after {engine.wait_healthy():.0f} s", file=sys.stderr)
        cost = args.cost_file
        if cost is None:
            cost = work / "cost.toml"
            cmd = [*CLI, "profile", "--url", engine.base_url, "--model-path", str(TINY_MODEL)]
            subprocess.run([*cmd, "--out", str(cost)], check=True, cwd=REPO)
        real, real_rows = replay(engine.base_url, args, work / "real.json")
    finally:
        engine.stop()
    from conductor.core.cost_file import parse_cost_file

    capacity = parse_cost_file(cost.read_text()).cost.kv_capacity_tokens
    emu_url = f"http://127.0.0.1:{emu_port}"
    cmd = [*CLI, "emulate", "--port", str(emu_port), "--cost-file", str(cost)]
    cmd += [
        "--block-size",
        str(BLOCK_SIZE_TOKENS),
        "--cache-blocks",
        str(capacity // BLOCK_SIZE_TOKENS),
    ]
    cmd += [
        "--max-model-len",
        "2048",
        "--model",
        SERVED_MODEL_NAME,
        "--model-path",
        str(TINY_MODEL),
    ]
    emu_proc = subprocess.Popen(cmd, cwd=REPO)
    try:
        wait_http(emu_url)
        emu, emu_rows = replay(emu_url, args, work / "emu.json")
    finally:
        emu_proc.terminate()
        emu_proc.wait(timeout=30)
    result = {
        "command": " ".join(sys.argv),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "cost_file": str(cost),
        "real": real,
        "emulated": emu,
        "fidelity": compare(real_rows, emu_rows, real, emu),
    }
    f = result["fidelity"]
    print(
        f"{f['requests_compared']} requests: per-request |TTFT error| mean"
        f" {f['per_request_ttft_abs_error']['mean']:.1%}, p50"
        f" {f['per_request_ttft_abs_error']['p50']:.1%}, p90"
        f" {f['per_request_ttft_abs_error']['p90']:.1%}; mean TTFT {real['ttft_s']['mean']:.4f} s"
        f" real vs {emu['ttft_s']['mean']:.4f} s emulated ({f['mean_ttft_error']:+.1%}); p90"
        f" {f['p90_ttft_error']:+.1%}; mean TBT {f['mean_tbt_error']:+.1%}; hit rate"
        f" {f['hit_rate_real']:.3f} real vs {f['hit_rate_emulated']:.3f} emulated"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
