"""What a run cost the processes under test: the engines' prefix-cache and token counters
(``GET /metrics``) and CPU seconds (``/proc``), as deltas per run."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)


def engine_counters(eng: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The engines' prefix-cache and token counters, summed (from ``GET /metrics``)."""
    total = dict.fromkeys(COUNTERS, 0.0)
    with httpx.Client(timeout=5.0) as client:
        for e in eng:
            for line in client.get(f"{e['url']}/metrics").text.splitlines():
                name = line.split("{", 1)[0]
                if name in total:
                    total[name] += float(line.rsplit(" ", 1)[1])
    return total


def cpu_s(pids: Sequence[int]) -> float | None:
    """User + system CPU seconds the processes have used so far (Linux ``/proc``)."""
    total = 0
    try:
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    except (OSError, IndexError, ValueError):
        return None
    return total / os.sysconf("SC_CLK_TCK")


def group_pids(pgid: int) -> list[int]:
    """Every process in process group ``pgid`` (a gateway and its ``--workers`` children,
    and the nats-server it embeds; Linux ``/proc``)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            out.append(int(stat.parent.name))
    return out or [pgid]


def cpu_by_process(pids: Sequence[int]) -> dict[str, float]:
    """CPU seconds per process, keyed ``<pid> <what it runs>`` (for a breakdown)."""
    out: dict[str, float] = {}
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in cmd if w]
        what = next((w for w in words if "nats-server" in w or w.startswith("from multi")), "")
        what = "nats-server" if "nats-server" in what else ("multiprocessing" if what else "")
        if not what:
            what = "conductor " + " ".join(w for w in words if w in ("serve", "-c"))[:40]
        t = cpu_s([pid])
        if t is not None:
            out[f"{pid} {what.strip()}"] = t
    return out


def cpu_ms_per_request(before: float | None, after: float | None, ok: int) -> float | None:
    if before is None or after is None or ok == 0:
        return None
    return round((after - before) * 1e3 / ok, 3)


def cache_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    queries = after[COUNTERS[0]] - before[COUNTERS[0]]
    hits = after[COUNTERS[1]] - before[COUNTERS[1]]
    return {
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "prefix_cache_hit_rate": round(hits / queries, 4) if queries else None,
        "generation_tokens": after[COUNTERS[3]] - before[COUNTERS[3]],
    }
