"""Effective request capacity (FAST §5.2): the largest replay speed at which the SLO
attainment (rejections count as misses) stays at or above a target, per TBT threshold.

Search: start at speed 1, double (or halve) until the target is crossed, then bisect
``bisect_steps`` times. Attainment is not strictly monotone in speed (bursts), so the result
is the largest *tested* speed that met the target below the first failing one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from conductor.core.types import Request
from conductor.sim.config import SimConfig
from conductor.sim.simulator import simulate


def scale_arrivals(requests: Sequence[Request], speed: float) -> list[Request]:
    """Replay ``speed`` times faster (arrival times divided by ``speed``)."""
    return [replace(r, arrival_s=r.arrival_s / speed) for r in requests]


@dataclass(frozen=True, slots=True)
class CapacityPoint:
    policy: str
    tbt_slo_ms: float
    speed: float
    attainment: float
    tested: tuple[tuple[float, float], ...]


def find_capacity(
    requests: Sequence[Request],
    cfg: SimConfig,
    *,
    outputs: Sequence[int],
    target: float = 0.9,
    bisect_steps: int = 4,
    max_speed: float = 16.0,
    min_speed: float = 1 / 16,
    on_run: Callable[[float, float], None] | None = None,
) -> CapacityPoint:
    """Largest speed with attainment >= ``target`` for ``cfg`` (its SLOs and policy);
    ``outputs``: what each request generates (see :func:`~conductor.sim.simulator.simulate`)."""

    def attainment(speed: float) -> float:
        return simulate(scale_arrivals(requests, speed), cfg, outputs=outputs).slo_attainment

    return search_capacity(
        attainment,
        cfg,
        target=target,
        bisect_steps=bisect_steps,
        max_speed=max_speed,
        min_speed=min_speed,
        on_run=on_run,
    )


def search_capacity(
    run: Callable[[float], float],
    cfg: SimConfig,
    *,
    target: float = 0.9,
    bisect_steps: int = 4,
    max_speed: float = 16.0,
    min_speed: float = 1 / 16,
    on_run: Callable[[float, float], None] | None = None,
) -> CapacityPoint:
    """The search of :func:`find_capacity` over ``run(speed)`` -> SLO attainment (each speed
    run once); ``cfg`` names the policy and the TBT SLO of the point."""
    cache: dict[float, float] = {}

    def attainment(speed: float) -> float:
        if speed not in cache:
            cache[speed] = run(speed)
            if on_run is not None:
                on_run(speed, cache[speed])
        return cache[speed]

    lo, hi = 0.0, 0.0
    s = 1.0
    if attainment(s) >= target:
        lo = s
        while s < max_speed:
            s *= 2
            if attainment(s) >= target:
                lo = s
            else:
                hi = s
                break
        if hi == 0.0:
            return _point(cfg, lo, cache)
    else:
        hi = s
        while s > min_speed:
            s /= 2
            if attainment(s) >= target:
                lo = s
                break
            hi = s
        if lo == 0.0:
            return _point(cfg, 0.0, cache)
    for _ in range(bisect_steps):
        mid = (lo + hi) / 2
        if attainment(mid) >= target:
            lo = mid
        else:
            hi = mid
    return _point(cfg, lo, cache)


def _point(cfg: SimConfig, speed: float, cache: dict[float, float]) -> CapacityPoint:
    return CapacityPoint(
        cfg.policy,
        cfg.scheduler.tbt_slo_s * 1e3,
        speed,
        cache.get(speed, 0.0),
        tuple(sorted(cache.items())),
    )
