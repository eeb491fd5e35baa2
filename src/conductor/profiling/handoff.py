"""The P→D KV hand-off, measured through a disaggregated gateway: the ``[transfer]`` table
of a profiled cost file (``conductor profile --handoff-url``).

For each prompt length (fresh blocks every time, so nothing is cached anywhere), one request
straight to the profiled prefill engine (``max_tokens`` 1: the prefill leg alone) and one of
the same length through the gateway in front of a prefill and a decode engine (its prefill
leg, the KV hand-off, the decode engine's first token). Their difference is the hand-off as
a client sees it: moving the prompt's KV and the decode engine's first step. The cost
model's transfer is the move alone (the simulator and the scheduler add the decode step
themselves), so :func:`kv_moves` takes the profiled step (one request at the prompt's
context) off each length's median; a line through (prompt tokens, KV move seconds) gives
``latency_s`` (its intercept, at least 0) and ``bytes_per_s`` (a token's KV bytes over its
slope).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from conductor.core.costmodel import CostModel


@dataclass(frozen=True, slots=True)
class HandoffSample:
    """One length: seconds to the first token straight from the prefill engine and through
    the disaggregated gateway (fresh prompts of ``prompt_tokens`` both)."""

    prompt_tokens: int
    prefill_s: float
    pd_ttft_s: float

    @property
    def handoff_s(self) -> float:
        return self.pd_ttft_s - self.prefill_s


@dataclass(frozen=True, slots=True)
class HandoffFit:
    """``handoff_s = latency_s + s_per_token * prompt_tokens`` over ``n`` samples."""

    latency_s: float
    s_per_token: float
    n: int
    max_residual_s: float

    def at(self, prompt_tokens: int) -> float:
        return self.latency_s + self.s_per_token * prompt_tokens


def fit_handoff(samples: Sequence[tuple[int, float]]) -> HandoffFit:
    """The least-squares line through (prompt tokens, hand-off seconds); at least two
    distinct lengths."""
    if len({n for n, _ in samples}) < 2:
        raise ValueError("a hand-off fit needs samples at two prompt lengths at least")
    x = np.asarray([n for n, _ in samples], dtype=float)
    y = np.asarray([s for _, s in samples], dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (intercept + slope * x)
    return HandoffFit(float(intercept), float(slope), len(samples), float(np.abs(resid).max()))


def per_length_medians(samples: Sequence[HandoffSample]) -> list[tuple[int, float]]:
    """(prompt tokens, median hand-off seconds) per length, in length order: the prefill
    leg and the P/D request are different requests timed one after the other, and a stall
    hits each on its own, so the line goes through medians, not single samples."""
    by: dict[int, list[float]] = {}
    for h in samples:
        by.setdefault(h.prompt_tokens, []).append(h.handoff_s)
    return [(n, float(np.median(by[n]))) for n in sorted(by)]


def kv_moves(medians: Sequence[tuple[int, float]], cost: CostModel) -> list[tuple[int, float]]:
    """Each (prompt tokens, median hand-off seconds) less the decode engine's first step as
    ``cost`` predicts it (one request holding the prompt's context): the KV move alone."""
    return [(n, s - cost.decode_step_s(1, n)) for n, s in medians]


def transfer_of(fit: HandoffFit, kv_bytes_per_token: int) -> tuple[float, float] | None:
    """``(bytes_per_s, latency_s)`` of the cost model's transfer read from ``fit``, or None
    when the hand-off did not grow with the prompt (a slope at or below zero: noise swamped
    it). An intercept below zero reads as latency 0: engines move whole KV blocks and
    compute the prompt's last partial block on the decode side, so the hand-off of an
    ``n``-token prompt moves about ``n - block`` tokens' KV and the line through it crosses
    zero below one block's transfer time when the fixed cost is smaller than that."""
    if fit.s_per_token <= 0:
        return None
    return kv_bytes_per_token / fit.s_per_token, max(0.0, fit.latency_s)
