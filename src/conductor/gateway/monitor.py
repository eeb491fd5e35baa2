"""Health checks and load polling of engines (one HTTP call each; the loops live in the
service). The load comes from the engine's Prometheus text at ``/metrics``: only the three
gauges are read, by a line scan (a vLLM page holds hundreds of histogram lines; parsing them
all with ``prometheus_client.parser`` cost more CPU than a hundred requests)."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

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


_FIRST = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:#")


def parse_vllm_metrics(text: str) -> ReportedLoad:
    """The load gauges of a vLLM ``/metrics`` page, summed over label sets (KV usage
    averaged); missing gauges count as 0. Raises ``ValueError`` when the text is not
    Prometheus exposition format (a line that starts like no sample or comment, or a gauge
    sample without a number)."""
    sums = {RUNNING: 0.0, WAITING: 0.0, KV_USAGE: 0.0}
    counts = dict.fromkeys(sums, 0)
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        if line[0] not in _FIRST:
            raise ValueError(f"not Prometheus text: {line[:80]!r}")
        if not line.startswith("vllm:"):
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name, rest = line[:brace], line[line.rindex("}") + 1 :]
        else:
            name, rest = line[:space], line[space:]
        if name in sums:
            fields = rest.split()
            if not fields:
                raise ValueError(f"sample without a value: {line[:80]!r}")
            sums[name] += float(fields[0])
            counts[name] += 1
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
