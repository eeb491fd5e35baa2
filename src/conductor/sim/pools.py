"""Several models: one pool per model, each an independent simulated cluster.

A trace naming several models (records' ``model``) is replayed over one pool per model. The
pools share nothing (their own instances, prefix caches, NICs and scheduler state: index,
load, admission, output-length prediction), so a pooled run is exactly one
:func:`~conductor.sim.simulator.simulate` per pool on its own sub-trace, and the reports are
merged: each pool's summary as it is, under ``per_model``, and the totals over every request
(:func:`~conductor.sim.records.summarize` of all the pools' records, goodput over the whole
trace's span). The simulator core is untouched.

A pool's size is a :class:`PoolShape` (``4P+4D``, ``2P+2D+1B``: prefill, decode and
``role=both`` instances); :func:`split_cluster` divides one cluster equally over the models.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from conductor.core.errors import InvalidInput
from conductor.core.types import Request
from conductor.sim.capacity import CapacityPoint, scale_arrivals, search_capacity
from conductor.sim.config import SimConfig
from conductor.sim.records import summarize
from conductor.sim.simulator import SimResult, simulate

__all__ = [
    "Pool",
    "PoolShape",
    "PoolsResult",
    "find_pools_capacity",
    "parse_pool",
    "simulate_pools",
    "split_cluster",
]

_TERM = re.compile(r"(\d+)([PDB])", re.IGNORECASE)
_SHAPE_HELP = "must be like 4P+4D or 2P+2D+1B (counts of prefill, decode, both instances)"


@dataclass(frozen=True, slots=True)
class PoolShape:
    """A pool's instances: ``prefill``, ``decode`` and ``both`` (prefill and decode)."""

    prefill: int
    decode: int
    both: int = 0

    @classmethod
    def parse(cls, text: str) -> PoolShape:
        """``4P+4D``, ``2P+2D+1B``, ``2B`` (terms in any order, each letter at most once;
        a missing letter is 0); raises :class:`InvalidInput` naming ``pool``."""
        counts: dict[str, int] = {}
        for term in text.replace(" ", "").split("+"):
            match = _TERM.fullmatch(term)
            if match is None or match[2].upper() in counts:
                raise InvalidInput("pool", text, _SHAPE_HELP)
            counts[match[2].upper()] = int(match[1])
        shape = cls(counts.get("P", 0), counts.get("D", 0), counts.get("B", 0))
        shape.check(text)
        return shape

    def check(self, shown: object) -> None:
        """Raises :class:`InvalidInput` (``pool``, ``shown``) unless the pool can prefill and
        decode (a prefill or both instance, and a decode or both instance)."""
        if self.prefill + self.both < 1 or self.decode + self.both < 1:
            why = "needs an instance that prefills (P or B) and one that decodes (D or B)"
            raise InvalidInput("pool", shown, why)

    def __str__(self) -> str:
        terms = ((self.prefill, "P"), (self.decode, "D"), (self.both, "B"))
        return "+".join(f"{n}{kind}" for n, kind in terms if n) or "0P+0D"

    def config(self, base: SimConfig) -> SimConfig:
        """``base`` with this pool's instance counts."""
        return replace(base, n_prefill=self.prefill, n_decode=self.decode, n_both=self.both)


def parse_pool(text: str) -> tuple[str, PoolShape]:
    """``NAME=SHAPE`` (``llama-8b=4P+4D``; the last ``=`` splits, so names may hold one);
    raises :class:`InvalidInput` naming ``pool``."""
    name, sep, shape = text.rpartition("=")
    if not sep or not name.strip():
        raise InvalidInput("pool", text, "must be MODEL=SHAPE, e.g. a=4P+4D")
    return name.strip(), PoolShape.parse(shape)


def split_cluster(
    models: Sequence[str], prefill: int, decode: int, both: int
) -> dict[str, PoolShape]:
    """``prefill``/``decode``/``both`` instances divided as equally as possible over
    ``models``, in that order (the first ``n % len(models)`` models get one more of each
    kind); raises :class:`InvalidInput` naming ``pool`` when a pool would lack a prefill- or
    a decode-capable instance."""
    k = len(models)

    def share(n: int, i: int) -> int:
        return n // k + (1 if i < n % k else 0)

    out: dict[str, PoolShape] = {}
    for i, model in enumerate(models):
        shape = PoolShape(share(prefill, i), share(decode, i), share(both, i))
        try:
            shape.check(str(shape))
        except InvalidInput as exc:
            why = (
                f"{PoolShape(prefill, decode, both)} split over {k} models leaves {model!r} with"
                f" {shape}, which {exc.why}; size each pool with --pool MODEL=SHAPE"
            )
            raise InvalidInput("pool", model, why) from None
        out[model] = shape
    return out


@dataclass(frozen=True, slots=True)
class Pool:
    """One model's pool: its sub-trace (``requests``, what each generates in ``outputs``)
    and its cluster ``cfg``."""

    model: str
    requests: Sequence[Request]
    outputs: Sequence[int]
    cfg: SimConfig

    @property
    def shape(self) -> PoolShape:
        return PoolShape(self.cfg.n_prefill, self.cfg.n_decode, self.cfg.n_both)


@dataclass(slots=True)
class PoolsResult:
    """A pooled run: every pool's own result (in the pools' order) and the ``total``, whose
    records are all the pools' (pool by pool), whose config is the first pool's with every
    pool's instances, and whose summary holds the totals plus ``pools`` (model -> shape)
    and ``per_model`` (model -> that pool's summary)."""

    pools: dict[str, SimResult]
    total: SimResult


def _check_pools(pools: Sequence[Pool]) -> None:
    if not pools:
        raise InvalidInput("pools", 0, "must hold at least one pool")
    seen: set[str] = set()
    first = pools[0].cfg.scheduler
    for pool in pools:
        if pool.model in seen:
            raise InvalidInput("pools", pool.model, "two pools for one model")
        seen.add(pool.model)
        if not pool.requests:
            raise InvalidInput("pools", pool.model, "the pool has no requests")
        s = pool.cfg.scheduler
        if (s.ttft_slo_s, s.tbt_slo_s) != (first.ttft_slo_s, first.tbt_slo_s):
            raise InvalidInput("pools", pool.model, "every pool must have the same SLOs")


def simulate_pools(pools: Sequence[Pool]) -> PoolsResult:
    """Simulate each pool on its own sub-trace and merge the reports. Raises
    :class:`InvalidInput` for no pools, two pools for one model, a pool without requests, or
    pools with different SLOs (the totals need one definition of a good request)."""
    _check_pools(pools)
    results: dict[str, SimResult] = {}
    for pool in pools:
        results[pool.model] = simulate(pool.requests, pool.cfg, outputs=pool.outputs)
    return PoolsResult(results, _total(pools, results))


def _total(pools: Sequence[Pool], results: Mapping[str, SimResult]) -> SimResult:
    first = pools[0].cfg
    arrivals = [r.arrival_s for pool in pools for r in pool.requests]
    duration = max(arrivals) - min(arrivals)
    records = [record for res in results.values() for record in res.records]
    wall = sum(res.sim_wall_s for res in results.values())
    head = next(iter(results.values())).summary
    sched = first.scheduler
    summary: dict[str, object] = {
        key: head[key]
        for key in (
            "policy",
            "admission",
            "cpp",
            "oracle_lengths",
            "cost_error",
            "cost_bias",
            "cost_correction",
            "kv_fetch",
            "prefill_lanes",
        )
    }
    summary.update(
        summarize(
            records, ttft_slo_s=sched.ttft_slo_s, tbt_slo_s=sched.tbt_slo_s, duration_s=duration
        )
    )
    summary["sim_wall_s"] = round(wall, 3)
    summary["pools"] = {pool.model: str(pool.shape) for pool in pools}
    summary["per_model"] = {model: res.summary for model, res in results.items()}
    cluster = replace(
        first,
        n_prefill=sum(p.cfg.n_prefill for p in pools),
        n_decode=sum(p.cfg.n_decode for p in pools),
        n_both=sum(p.cfg.n_both for p in pools),
    )
    copies = sum(res.copies for res in results.values())
    return SimResult(cluster, records, summary, wall, duration, copies=copies)


def find_pools_capacity(
    pools: Sequence[Pool],
    *,
    target: float = 0.9,
    bisect_steps: int = 4,
    max_speed: float = 16.0,
    min_speed: float = 1 / 16,
) -> tuple[CapacityPoint, dict[str, float]]:
    """The largest speed (every pool's arrivals sped up together, the mix unchanged) whose
    *total* SLO attainment stays >= ``target``
    (:func:`~conductor.sim.capacity.search_capacity`), and each model's attainment there
    (0.0 each when no tested speed met the target)."""
    _check_pools(pools)
    per_model: dict[float, dict[str, float]] = {}

    def attainment(speed: float) -> float:
        scaled = [replace(p, requests=scale_arrivals(p.requests, speed)) for p in pools]
        res = simulate_pools(scaled)
        per_model[speed] = {m: r.slo_attainment for m, r in res.pools.items()}
        return res.total.slo_attainment

    point = search_capacity(
        attainment,
        pools[0].cfg,
        target=target,
        bisect_steps=bisect_steps,
        max_speed=max_speed,
        min_speed=min_speed,
    )
    return point, per_model.get(point.speed, dict.fromkeys((p.model for p in pools), 0.0))
