"""``llmd`` — the llm-d router's (EPP) default scoring profile, as a baseline.

Source: llm-d/llm-d-inference-scheduler ``pkg/epp/config/loader/defaults.go`` (default
plugins and weights) and the scorer descriptions of the llm-d router / Gateway API
Inference Extension; summarised in ``reference/peer-routers.md`` §3.1. Our own code,
written from those descriptions.

Per prefill instance ``i``, each scorer in ``[0, 1]``::

    queue_i  = (maxQ - q_i) / (maxQ - minQ)     (1.0 for all when maxQ == minQ)
    kv_i     = 1 - kv_usage_i
    prefix_i = matched_blocks_i / total_blocks
    score_i  = 2 * queue_i + 2 * kv_i + 3 * prefix_i

``argmax score``; exact ties go to a uniform draw among the tied from the seeded ``ctx.rng``
(llm-d's ``max-score-picker`` shuffles the candidates, then takes the first maximum).

Parameters (``SchedulerConfig.policy_params``), llm-d's defaults: ``queue_scorer_weight``
2, ``kv_cache_utilization_scorer_weight`` 2, ``prefix_cache_scorer_weight`` 3.

How the engine metrics map onto ours:

* ``q_i`` (``vllm:num_requests_waiting``) = ``PrefillState.queued_requests``: prefills
  assigned and not finished (the one running included — our bookkeeping does not separate it).
* ``kv_usage_i`` (``vllm:kv_cache_usage_perc``) is a proxy: ``(queued_tokens +
  kv_reserved_tokens) / kv_capacity``, clamped to 1. On a pure prefill instance that is the
  uncached tokens of its queued prefills over its KV capacity (``spec.kv_capacity_tokens``,
  else ``cost.kv_capacity_tokens``); on an instance that also decodes, its decode KV
  reservations (prompt + expected output of its batch) are added.
* ``matched_blocks_i`` = the instance's local (GPU + DRAM) prefix from the precise index
  (llm-d's ``precise-prefix-cache-scorer`` reads an index fed by KV events; the default
  ``prefix-cache-scorer`` uses an approximate router-side LRU); ``total_blocks`` = the
  request's block hashes (prefix score 0 when it has none).
* Not modelled: filters (affinity, SLO headroom), admission and flow control, the P/D
  decider. Decode placement: the Scheduler's default.
"""

from __future__ import annotations

from typing import ClassVar

from conductor.core.policies.base import PrefillChoice, SchedulingContext
from conductor.core.policies.registry import register
from conductor.core.policies.selection import argmax_index, param
from conductor.core.state import InstanceState

DEFAULTS: dict[str, float] = {
    "queue_scorer_weight": 2.0,
    "kv_cache_utilization_scorer_weight": 2.0,
    "prefix_cache_scorer_weight": 3.0,
}


def queue_scores(queues: list[int]) -> list[float]:
    """``(maxQ - q) / (maxQ - minQ)``; all 1.0 when every queue is equal."""
    lo = min(queues)
    hi = max(queues)
    if hi == lo:
        return [1.0] * len(queues)
    return [(hi - q) / (hi - lo) for q in queues]


def kv_usage(ctx: SchedulingContext, inst: InstanceState) -> float:
    """Proxy for the engine's KV-cache usage fraction; see the module docstring."""
    cap = inst.spec.kv_capacity_tokens
    capacity = cap if cap is not None else ctx.cost.kv_capacity_tokens
    used = inst.prefill.queued_tokens + inst.decode.kv_reserved_tokens
    return min(1.0, used / capacity) if capacity > 0 else 1.0


def prefix_score(ctx: SchedulingContext, inst: InstanceState) -> float:
    total = ctx.match.n_blocks
    if total == 0:
        return 0.0
    return ctx.match.local_blocks.get(inst.spec.instance_id, 0) / total


def scores(ctx: SchedulingContext) -> list[float]:
    """The weighted score of every prefill instance, in pool order."""
    pool = ctx.prefill_pool
    wq = param(ctx, DEFAULTS, "queue_scorer_weight")
    wk = param(ctx, DEFAULTS, "kv_cache_utilization_scorer_weight")
    wp = param(ctx, DEFAULTS, "prefix_cache_scorer_weight")
    qs = queue_scores([i.prefill.queued_requests for i in pool])
    return [
        wq * q + wk * (1.0 - kv_usage(ctx, i)) + wp * prefix_score(ctx, i)
        for q, i in zip(qs, pool, strict=True)
    ]


@register
class LlmdPolicy:
    name: ClassVar[str] = "llmd"

    def choose_prefill(self, ctx: SchedulingContext) -> PrefillChoice:
        return ctx.local_choice(ctx.prefill_pool[argmax_index(scores(ctx), ctx.rng)])
