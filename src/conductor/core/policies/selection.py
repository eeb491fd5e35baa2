"""Helpers shared by the peer-router baselines: argmin/argmax with a stated tie-break,
Dynamo-style softmax sampling over costs, and the in-flight request count.

Ties are *exact* float equality, as in the peers' own code (Dynamo's
``minimum_cost_index`` compares ``cost == best_cost``). With ``rng=None`` a tie goes to the
earliest candidate (pool order); with a seeded ``rng`` it goes to a uniformly drawn one
among the tied candidates, and the rng is consumed only when there is a tie of two or more,
so choices without ties never depend on the seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from conductor.core.policies.base import SchedulingContext
from conductor.core.state import InstanceState


def param(ctx: SchedulingContext, defaults: dict[str, float], name: str) -> float:
    """``ctx.config.policy_params[name]``, else the policy's documented default."""
    return ctx.config.policy_params.get(name, defaults[name])


def inflight_requests(inst: InstanceState) -> int:
    """Requests a router would count as in flight on ``inst``: prefills assigned and not
    finished, plus the decode batch (0 on a pure prefill instance)."""
    return inst.prefill.queued_requests + inst.decode.batch_size


def _pick(tied: list[int], rng: random.Random | None) -> int:
    if rng is None or len(tied) == 1:
        return tied[0]
    return tied[rng.randrange(len(tied))]


def argmin_index(costs: Sequence[float], rng: random.Random | None = None) -> int:
    """Index of the smallest cost; ties as described in the module docstring."""
    best = min(costs)
    return _pick([i for i, c in enumerate(costs) if c == best], rng)


def argmax_index(scores: Sequence[float], rng: random.Random | None = None) -> int:
    """Index of the largest score; ties as described in the module docstring."""
    best = max(scores)
    return _pick([i for i, s in enumerate(scores) if s == best], rng)


def softmax_weights(costs: Sequence[float], temperature: float) -> list[float]:
    """Dynamo's sampling distribution over costs (lower is better), summing to 1:
    ``p_i ∝ exp(-(c_i - min) / ((max - min) * T))``; uniform when all costs are equal."""
    if temperature <= 0.0:
        raise ValueError("temperature must be > 0")
    lo = min(costs)
    hi = max(costs)
    if hi == lo:
        return [1.0 / len(costs)] * len(costs)
    scale = (hi - lo) * temperature
    w = [math.exp(-(c - lo) / scale) for c in costs]
    total = sum(w)
    return [x / total for x in w]


def softmax_index(costs: Sequence[float], temperature: float, rng: random.Random) -> int:
    """Sample an index from :func:`softmax_weights` with one ``rng.random()`` draw
    (inverse CDF in candidate order, as Dynamo's ``softmax_sample_index``)."""
    u = rng.random()
    cumulative = 0.0
    weights = softmax_weights(costs, temperature)
    for i, p in enumerate(weights):
        cumulative += p
        if u <= cumulative:
            return i
    return len(weights) - 1
