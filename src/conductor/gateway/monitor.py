"""Health checks and load polling of engines (one HTTP call each; the loops live in the
service). The load comes from the engine's Prometheus text at ``/metrics``, parsed with
``prometheus_client.parser``."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"


@dataclass(frozen=True, slots=True)
class ReportedLoad:
    """What an engine says about itself (summed over its label sets, e.g. DP ranks)."""

    running: int
    waiting: int
    kv_usage: float
    """Fraction 0..1 of the KV cache in use (vLLM names it ``_perc`` but reports 0..1)."""


def parse_vllm_metrics(text: str) -> ReportedLoad:
    """The load gauges of a vLLM ``/metrics`` page; missing gauges count as 0. Raises
    ``ValueError`` when the text is not Prometheus exposition format."""
    sums = {RUNNING: 0.0, WAITING: 0.0, KV_USAGE: 0.0}
    counts = dict.fromkeys(sums, 0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in sums:
                sums[sample.name] += float(sample.value)
                counts[sample.name] += 1
    usage = sums[KV_USAGE] / counts[KV_USAGE] if counts[KV_USAGE] else 0.0
    return ReportedLoad(round(sums[RUNNING]), round(sums[WAITING]), usage)


async def check_health(client: httpx.AsyncClient, base_url: str, timeout_s: float) -> str | None:
    """None if ``GET /health`` answers 200 in time, else why not."""
    try:
        resp = await client.get(f"{base_url}/health", timeout=timeout_s)
    except httpx.TimeoutException:
        return "timeout"
    except httpx.HTTPError as exc:
        return type(exc).__name__
    if resp.status_code != 200:
        return f"status {resp.status_code}"
    return None


async def poll_load(client: httpx.AsyncClient, base_url: str, timeout_s: float) -> ReportedLoad:
    """The engine's reported load; raises ``httpx.HTTPError`` or ``ValueError``."""
    resp = await client.get(f"{base_url}/metrics", timeout=timeout_s)
    resp.raise_for_status()
    return parse_vllm_metrics(resp.text)
