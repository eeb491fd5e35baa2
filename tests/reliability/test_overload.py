"""Overload at 10x the cluster's measured capacity: the gateway sheds load with 429s (never
another error, never a hang), /health keeps answering 200, its memory stays within a stated
bound, and it recovers fully (nothing left in flight, the next request served).

Shedding at arrival is admission's, so that test runs with late binding off; with it (the
default), a burst waits in the queue, each request until its TTFT budget runs out (then
429), and the gateway recovers the same way (with a TTFT SLO inside the request timeout)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.reliability.cluster import MODEL, Cluster, cluster
from tests.reliability.load import CLIENT_TIMEOUT_S, one, run_load

OVERLOAD = 10.0
MAX_TOKENS = 400
"""Long enough that 10x the capacity in requests per second stays near what the 2-core box
can send and refuse besides the engines (the profiled decode step is about 2.4 ms)."""
CAPACITY_STREAMS = 12
"""Streams the cluster serves within its TBT SLO (2 engines x about 10,
tests/reliability/cluster.py), with some room: their throughput is the capacity."""
SECONDS = 4.0
RSS_BOUND = 64 * 1024 * 1024
"""What 10x overload may add to the gateway's RSS while it lasts."""


async def open_loop(url: str, rate_rps: float, seconds: float) -> tuple[Counter[str], list[float]]:
    """Requests at ``rate_rps`` whatever the answers (open loop) for ``seconds``, and
    /health probed every 0.1 s meanwhile (its latencies)."""
    outcomes: Counter[str] = Counter()
    health: list[float] = []
    health_errors: list[str] = []
    # below the suite's connection cap (256), which would otherwise answer 503 first
    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S, limits=limits) as c:

        async def request(i: int) -> None:
            kind, _ = await one(c, f"overload request {i} asks for words", MAX_TOKENS)
            outcomes[kind] += 1

        async def probe() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=5) as h:
                t_end = time.monotonic() + seconds
                while time.monotonic() < t_end:
                    t0 = time.monotonic()
                    try:
                        resp = await h.get("/health")
                    except httpx.TransportError as exc:
                        health_errors.append(repr(exc))
                        continue
                    assert resp.status_code == 200
                    health.append(time.monotonic() - t0)
                    await asyncio.sleep(0.1)

        tasks = [asyncio.create_task(probe())]
        t0 = time.monotonic()
        i = 0
        while (now := time.monotonic() - t0) < seconds:
            if i < now * rate_rps:
                tasks.append(asyncio.create_task(request(i)))
                i += 1
            else:
                await asyncio.sleep(1.0 / rate_rps)
        await asyncio.gather(*tasks)
    assert health_errors == []
    return outcomes, health


@pytest.fixture(scope="module")
def placing_at_arrival(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """The suite's cluster with late binding off: every request is decided at arrival."""
    extra = ("--set", "late_binding=false")
    with cluster(tmp_path_factory.mktemp("logs"), model_dir, extra=extra) as c:
        yield c


@pytest.fixture(scope="module")
def holding(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The suite's cluster with late binding (the default) and a TTFT SLO of 10 s, well
    inside its 20 s request timeout: a request may wait in the queue up to its TTFT SLO
    and must still have the time to generate (with the default 30 s it could be placed
    with a second left, and its stream cut by the deadline)."""
    extra = ("--ttft-slo-s", "10")
    with cluster(tmp_path_factory.mktemp("logs"), model_dir, extra=extra) as c:
        yield c


def metric_lines(client: httpx.Client, prefix: str) -> list[str]:
    return [line for line in client.get("/metrics").text.splitlines() if line.startswith(prefix)]


def assert_recovered(url: str) -> None:
    """Nothing left in flight nor held; ready; the next request is served."""
    with httpx.Client(base_url=url, timeout=30) as client:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            inflight = metric_lines(client, "conductor_inflight_requests ")
            if inflight == ["conductor_inflight_requests 0.0"]:
                break
            time.sleep(0.2)
        assert inflight == ["conductor_inflight_requests 0.0"]
        assert metric_lines(client, "conductor_held_requests ") == ["conductor_held_requests 0.0"]
        assert client.get("/ready").status_code == 200
        resp = client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "calm", "max_tokens": 4}
        )
        assert resp.status_code == 200


def test_ten_times_capacity_is_shed_with_429_and_fully_recovered(
    placing_at_arrival: Cluster,
) -> None:
    c = placing_at_arrival
    t0 = time.monotonic()
    measured = asyncio.run(
        run_load(c.url, seconds=2.0, concurrency=CAPACITY_STREAMS, max_tokens=MAX_TOKENS)
    )
    capacity_rps = measured["ok"] / (time.monotonic() - t0)
    assert set(measured) == {"ok"}, measured
    rss0 = c.gateway.rss_bytes()
    outcomes, health = asyncio.run(open_loop(c.url, OVERLOAD * capacity_rps, SECONDS))
    rss_peak = c.gateway.rss_bytes()
    print(
        f"capacity {capacity_rps:.1f} req/s, at {OVERLOAD:g}x: {dict(outcomes)}, "
        f"/health max {max(health) * 1e3:.0f} ms, RSS +{(rss_peak - rss0) / 2**20:.1f} MiB"
    )
    assert set(outcomes) <= {"ok", "http_429"}, outcomes
    assert outcomes["http_429"] > 0 and outcomes["ok"] > 0, outcomes
    assert max(health) < 1.0, max(health)  # liveness under overload, not a benchmark
    assert rss_peak - rss0 < RSS_BOUND
    assert_recovered(c.url)


def test_with_late_binding_a_ten_times_burst_waits_in_the_queue_and_recovers(
    holding: Cluster,
) -> None:
    """The same burst with late binding: held (some requests waited in the queue), only
    200s and 429s, /health alive, memory bounded, and nothing left afterwards."""
    c = holding
    t0 = time.monotonic()
    measured = asyncio.run(
        run_load(c.url, seconds=2.0, concurrency=CAPACITY_STREAMS, max_tokens=MAX_TOKENS)
    )
    capacity_rps = measured["ok"] / (time.monotonic() - t0)
    assert set(measured) == {"ok"}, measured
    with httpx.Client(base_url=c.url, timeout=30) as client:
        count = 'conductor_hold_seconds_count{outcome="placed"} '
        at_once = 'conductor_hold_seconds_bucket{le="0.0",outcome="placed"} '
        before = metric_lines(client, count), metric_lines(client, at_once)
    rss0 = c.gateway.rss_bytes()
    outcomes, health = asyncio.run(open_loop(c.url, OVERLOAD * capacity_rps, SECONDS))
    rss_peak = c.gateway.rss_bytes()
    print(
        f"capacity {capacity_rps:.1f} req/s, at {OVERLOAD:g}x: {dict(outcomes)}, "
        f"/health max {max(health) * 1e3:.0f} ms, RSS +{(rss_peak - rss0) / 2**20:.1f} MiB"
    )
    assert set(outcomes) <= {"ok", "http_429"}, outcomes
    assert outcomes["ok"] > 0, outcomes
    assert max(health) < 1.0, max(health)
    assert rss_peak - rss0 < RSS_BOUND
    with httpx.Client(base_url=c.url, timeout=30) as client:
        placed = float(metric_lines(client, count)[0].split()[-1])
        placed_at_once = float(metric_lines(client, at_once)[0].split()[-1])
    held_before = float(before[0][0].split()[-1]) - float(before[1][0].split()[-1])
    assert placed - placed_at_once > held_before  # the burst was held, not placed at once
    assert_recovered(c.url)
