"""A load driven by wrk (bench/wrk_completions.lua), summarised like the Python clients'."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .spec import MODEL, LoadSpec, check_loopback

WRK_SCRIPT = Path(__file__).resolve().parents[1] / "wrk_completions.lua"


def run_wrk(spec: LoadSpec, threads: int) -> dict[str, Any]:
    """``spec`` driven by wrk (a standard C load generator; far cheaper per request than any
    Python client): ``--duration-s`` seconds (whole seconds), the bench's prompts
    (bench/wrk_completions.lua). wrk measures whole answers, so only E2E latencies."""
    check_loopback(spec.url)
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("--client wrk needs wrk on the PATH (Debian/Ubuntu: apt-get install wrk)")
    threads = max(1, min(threads, spec.concurrency))

    def command(offset: int, duration_s: int) -> list[str]:
        return [
            wrk,
            f"-t{threads}",
            f"-c{spec.concurrency}",
            f"-d{duration_s}s",
            "--timeout",
            f"{max(1, round(spec.timeout_s))}s",
            "-s",
            str(WRK_SCRIPT),
            spec.url,
            "--",
            str(offset),
            str(spec.prefix_groups),
            str(spec.prompt_tokens),
            str(spec.shared_prefix_tokens),
            str(spec.max_tokens),
            MODEL,
        ]

    duration_s = max(1, round(spec.duration_s))
    done = subprocess.run(
        command(spec.offset, duration_s),
        capture_output=True,
        text=True,
        check=True,
        timeout=duration_s + spec.timeout_s + 30,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith('{"wrk"')), None)
    if line is None:
        raise SystemExit(f"wrk printed no result:\n{done.stdout}\n{done.stderr}")
    out = json.loads(line)["wrk"]
    errors = sum(out["errors"].values())
    wall_s = out["duration_us"] / 1e6
    ok = out["requests"] - out["errors"]["status"]
    lat = out["latency_us"]
    return {
        "ok": ok,
        "errors": errors,
        "error_examples": [f"wrk errors: {out['errors']}"] if errors else [],
        "wall_s": round(wall_s, 3),
        "requests_per_s": round(ok / wall_s, 1) if wall_s > 0 else None,
        "tokens_per_s": round(ok * spec.max_tokens / wall_s, 1) if wall_s > 0 else None,
        "ttft_p50_ms": None,
        "ttft_p99_ms": None,
        "e2e_p50_ms": round(lat["p50"] / 1e3, 3),
        "e2e_p99_ms": round(lat["p99"] / 1e3, 3),
        "e2e_p90_ms": round(lat["p90"] / 1e3, 3),
        "client": "wrk",
    }
