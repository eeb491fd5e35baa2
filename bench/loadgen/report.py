"""Turning samples into figures: the summary of a run, the latency the gateway adds and the
targets it is judged by, the printed rows and the JSON result."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
from collections.abc import Sequence
from typing import Any

import numpy as np

from .spec import Samples

TARGET_ADDED_P50_MS = 1.0
TARGET_GATEWAY_RPS = 1000.0


def percentile_ms(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    return round(float(np.percentile(np.asarray(values), q)) * 1e3, 3)


def summarize(samples: Samples) -> dict[str, Any]:
    ok = len(samples.e2e_s)
    return {
        "ok": ok,
        "errors": samples.errors,
        "error_examples": samples.error_examples,
        "wall_s": round(samples.wall_s, 3),
        "requests_per_s": round(ok / samples.wall_s, 1) if samples.wall_s > 0 else None,
        "tokens_per_s": round(samples.tokens / samples.wall_s, 1) if samples.wall_s > 0 else None,
        "ttft_p50_ms": percentile_ms(samples.ttft_s, 50),
        "ttft_p99_ms": percentile_ms(samples.ttft_s, 99),
        "e2e_p50_ms": percentile_ms(samples.e2e_s, 50),
        "e2e_p99_ms": percentile_ms(samples.e2e_s, 99),
    }


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "uvloop": importlib.util.find_spec("uvloop") is not None,
        "httptools": importlib.util.find_spec("httptools") is not None,
    }


def print_row(label: str, s: dict[str, Any]) -> None:
    print(
        f"{label:>8s}: {s['ok']:6d} ok {s['errors']:4d} err  {s['requests_per_s']!s:>8s} req/s  "
        f"TTFT p50 {s['ttft_p50_ms']!s:>8s} p99 {s['ttft_p99_ms']!s:>8s} ms  "
        f"E2E p50 {s['e2e_p50_ms']!s:>8s} p99 {s['e2e_p99_ms']!s:>8s} ms"
    )
    engines_ = s.get("engines") or {}
    extra = []
    if engines_.get("cpu_ms_per_request") is not None:
        extra.append(f"engine CPU {engines_['cpu_ms_per_request']} ms/req")
    if s.get("gateway_cpu_ms_per_request") is not None:
        extra.append(f"gateway CPU {s['gateway_cpu_ms_per_request']} ms/req")
    if engines_.get("prefix_cache_hit_rate") is not None:
        extra.append(f"prefix-cache hit rate {engines_['prefix_cache_hit_rate']}")
    if extra:
        print(f"{'':>10s}{', '.join(extra)}")


def added_latency(direct: dict[str, Any], through: dict[str, Any]) -> dict[str, Any]:
    """The gateway's run minus the direct one, per latency figure (``None`` if either lacks it)."""
    return {
        key: (
            round(through[key] - direct[key], 3)
            if through[key] is not None and direct[key] is not None
            else None
        )
        for key in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms")
    }


def targets(added: dict[str, Any], through: dict[str, Any]) -> dict[str, Any]:
    """The targets and whether they are met: latency is judged at concurrency 1, throughput
    under load."""
    return {
        "added_e2e_p50_ms_at_most": TARGET_ADDED_P50_MS,
        "added_e2e_p50_met": added["e2e_p50_ms"] is not None
        and added["e2e_p50_ms"] <= TARGET_ADDED_P50_MS,
        "gateway_requests_per_s_at_least": TARGET_GATEWAY_RPS,
        "gateway_requests_per_s_met": (through["requests_per_s"] or 0) >= TARGET_GATEWAY_RPS,
    }


def print_added(added: dict[str, Any], through: dict[str, Any]) -> None:
    print(
        f"  added: TTFT p50 {added['ttft_p50_ms']} p99 {added['ttft_p99_ms']} ms, "
        f"E2E p50 {added['e2e_p50_ms']} p99 {added['e2e_p99_ms']} ms; "
        f"gateway sustained {through['requests_per_s']} req/s"
    )


def finish(result: dict[str, Any], args: argparse.Namespace) -> int:
    """Writes ``result`` to ``--json`` (or prints it as one line); the exit status."""
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"results written to {args.json}")
    else:
        print(json.dumps(result))
    return 0
