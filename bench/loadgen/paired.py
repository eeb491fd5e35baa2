"""Paired latency: single requests alternately to the engine and through the gateway."""

from __future__ import annotations

import asyncio
import time

from .clients import RawConnection, one_raw
from .spec import RUN_OFFSET, LoadSpec, Samples, host_port


async def run_paired_async(direct: LoadSpec, through: LoadSpec) -> tuple[Samples, Samples]:
    """One request to the engine, one through the gateway, alternately (which goes first
    alternates too), each on its own keep-alive connection: both paths see the same machine
    at the same moments, so the difference of their latencies is the gateway's own, not the
    drift of a shared machine between two runs. Each ``wall_s`` is its path's busy time."""
    specs = (direct, through)
    conns = [RawConnection(*host_port(s.url)) for s in specs]
    outs = (Samples(), Samples())
    try:
        for k in range(direct.warmup):
            for j in (0, 1):
                await one_raw(conns[j], specs[j].offset + RUN_OFFSET // 2 + k, specs[j], Samples())
        deadline = time.perf_counter() + direct.duration_s
        for k in range(direct.requests):
            if time.perf_counter() >= deadline:
                break
            for j in (0, 1) if k % 2 == 0 else (1, 0):
                start = time.perf_counter()
                async with asyncio.timeout(specs[j].timeout_s):
                    await one_raw(conns[j], specs[j].offset + k, specs[j], outs[j])
                outs[j].wall_s += time.perf_counter() - start
    finally:
        for conn in conns:
            conn.close()
    return outs
