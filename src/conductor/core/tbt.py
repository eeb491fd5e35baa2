"""FAST's TBT (§5.1): the mean of the longest 10% of a request's token intervals — defined
once here for the scheduler's prediction (:func:`conductor.core.policies.decode.tbt_intervals`),
the simulator's records (:func:`conductor.sim.records.tail_mean_tbt`, numpy) and the gateway's
relay (:mod:`conductor.gateway.stream_tbt`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

TBT_TAIL_SHARE = 0.1
"""The share of a request's token intervals, the longest ones, that its TBT averages."""

TBT_MARGIN = 0.1
"""The share of a TBT SLO ``conductor`` keeps for prediction error: a decode predicted
within ``(1 - TBT_MARGIN) x SLO`` is taken to meet it (late binding's decode condition;
on aggregated engines, where a placement's TBT starts to cost). Chosen on generated
workloads (docs/policies.md)."""


def tail_count(intervals: float) -> int:
    """How many of ``intervals`` token intervals TBT averages: ``ceil(0.1 x n)``, at least 1."""
    return max(1, math.ceil(intervals * TBT_TAIL_SHARE))


def tail_mean(intervals: Sequence[float]) -> float | None:
    """The TBT of these token intervals (None if there are none)."""
    n = len(intervals)
    if n == 0:
        return None
    k = tail_count(n)
    if k >= n:
        return sum(intervals) / n
    return sum(sorted(intervals)[-k:]) / k
