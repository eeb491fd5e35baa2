"""Driving a load with the Python clients: ``concurrency`` workers on one event loop, or
the load shared out over several processes."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Coroutine
from dataclasses import asdict
from typing import Any, TypeVar

import httpx

from .clients import RawConnection, one_httpx, one_raw
from .spec import RUN_OFFSET, LoadSpec, Samples, check_loopback, host_port

T = TypeVar("T")


async def _drive(spec: LoadSpec, count: int, first_index: int, deadline: float | None) -> Samples:
    out = Samples()
    next_index = first_index
    stop = first_index + count
    workers = min(spec.concurrency, max(1, count))

    def take() -> int | None:
        nonlocal next_index
        if next_index >= stop or (deadline is not None and time.perf_counter() >= deadline):
            return None
        next_index += 1
        return next_index - 1

    start = time.perf_counter()
    if spec.client == "httpx":
        limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)
        timeout = httpx.Timeout(spec.timeout_s)
        async with httpx.AsyncClient(base_url=spec.url, limits=limits, timeout=timeout) as client:

            async def httpx_worker() -> None:
                while (i := take()) is not None:
                    await one_httpx(client, i, spec, out)

            async with asyncio.TaskGroup() as tg:
                for _ in range(workers):
                    tg.create_task(httpx_worker())
    else:
        host, port = host_port(spec.url)

        async def raw_worker() -> None:
            conn = RawConnection(host, port)
            try:
                while (i := take()) is not None:
                    async with asyncio.timeout(spec.timeout_s):
                        await one_raw(conn, i, spec, out)
            finally:
                conn.close()

        async with asyncio.TaskGroup() as tg:
            for _ in range(workers):
                tg.create_task(raw_worker())
    out.wall_s = time.perf_counter() - start
    return out


async def run_load_async(spec: LoadSpec) -> Samples:
    if spec.warmup:
        await _drive(spec, spec.warmup, RUN_OFFSET // 2 + spec.offset, None)
    return await _drive(spec, spec.requests, spec.offset, time.perf_counter() + spec.duration_s)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _run_in_process(spec: LoadSpec) -> Samples:
    return run_async(run_load_async(spec))


def run_load(spec: LoadSpec, procs: int) -> Samples:
    """Run ``spec`` from ``procs`` processes (each with its share of requests and
    concurrency) and merge their samples."""
    check_loopback(spec.url)
    if procs <= 1:
        return _run_in_process(spec)
    shares = []
    for p in range(procs):
        shares.append(
            LoadSpec(
                **{
                    **asdict(spec),
                    "requests": spec.requests // procs + (p < spec.requests % procs),
                    "concurrency": max(1, spec.concurrency // procs),
                    "warmup": spec.warmup // procs,
                    "offset": spec.offset + p * spec.requests,
                }
            )
        )
    merged = Samples()
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        for samples in pool.map(_run_in_process, shares):
            merged.merge(samples)
    return merged
