"""``sglang`` — SGLang model gateway's ``cache_aware`` policy, as a baseline.

Source: sgl-project/sglang ``sgl-model-gateway/src/policies/cache_aware.rs`` (algorithm
comment and code), CLI defaults from ``bindings/python/src/sglang_router/router_args.py``;
summarised in ``reference/peer-routers.md`` §2.1. Our own code, written from those
descriptions.

``load_i`` = in-flight requests on prefill instance ``i`` (prefills assigned and not
finished + its decode batch, 0 on a pure prefill instance)::

    if max(load) - min(load) > balance_abs_threshold
       and max(load) > balance_rel_threshold * min(load):
        pick the min-load instance                                      (imbalanced)
    else:
        m = the instance with the longest local prefix, ratio = local_tokens_m / prompt_tokens
        pick m if ratio > cache_threshold, else the min-load instance

Ties: the min-load instance is the first in pool order (Rust ``min_by_key``); among
instances sharing the longest prefix, the lower load wins, then pool order (SGLang takes an
arbitrary tenant of the deepest tree node; SMG's event-driven mode breaks ties by lower
load).

Parameters (``SchedulerConfig.policy_params``), SGLang's CLI defaults: ``cache_threshold``
0.3, ``balance_abs_threshold`` 64, ``balance_rel_threshold`` 1.5 (the Rust library defaults
are 0.5 / 32 / 1.1).

Deliberate difference: SGLang matches against an *approximate* per-worker radix tree of the
raw text it has routed (router-side history, LRU-evicted), so it believes a worker holds
what it was sent. Ours reads the *precise* prefix index fed by KV events (``local_tokens``:
the instance's GPU + DRAM prefix, the last prompt token never counted as cached), so this
baseline is, if anything, better informed than SGLang itself. Its "insert the prompt into
the chosen worker's tree" step has no counterpart: the index learns from events.
Decode placement: the Scheduler's default (SGLang's separate ``--decode-policy`` is not
modelled).
"""

from __future__ import annotations

from typing import ClassVar

from conductor.core.policies.base import PrefillChoice, SchedulingContext
from conductor.core.policies.registry import register
from conductor.core.policies.selection import inflight_requests, param

DEFAULTS: dict[str, float] = {
    "cache_threshold": 0.3,
    "balance_abs_threshold": 64.0,
    "balance_rel_threshold": 1.5,
}


def is_imbalanced(loads: list[int], abs_threshold: float, rel_threshold: float) -> bool:
    """SGLang's switch: ``max - min > abs`` and ``max > rel * min``."""
    lo = min(loads)
    hi = max(loads)
    return hi - lo > abs_threshold and hi > rel_threshold * lo


@register
class SglangPolicy:
    name: ClassVar[str] = "sglang"

    def choose_prefill(self, ctx: SchedulingContext) -> PrefillChoice:
        pool = ctx.prefill_pool
        loads = [inflight_requests(i) for i in pool]
        min_load = pool[loads.index(min(loads))]
        if is_imbalanced(
            loads,
            param(ctx, DEFAULTS, "balance_abs_threshold"),
            param(ctx, DEFAULTS, "balance_rel_threshold"),
        ):
            return ctx.local_choice(min_load)
        matched = [ctx.local_tokens(i) for i in pool]
        longest = max(matched)
        ratio = longest / ctx.request.prompt_tokens
        if ratio > param(ctx, DEFAULTS, "cache_threshold"):
            holders = [k for k, m in enumerate(matched) if m == longest]
            best = min(holders, key=lambda k: loads[k])  # lower load, then pool order
            return ctx.local_choice(pool[best])
        return ctx.local_choice(min_load)
