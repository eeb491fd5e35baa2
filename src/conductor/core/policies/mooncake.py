"""``mooncake`` — Algorithm 1 of Mooncake (FAST'25 version), cache-aware and -balancing.

For each prefill instance ``i`` with local prefix ``l_i`` and the best prefix ``b`` anywhere:

* if ``b / l_i > kvcache_balancing_threshold`` (``l_i = 0`` counts as an infinite ratio):
  ``TTFT_i = T_transfer(b - l_i) + T_queue(i) + T_prefill(len, b)`` (fetch the remote prefix);
* else ``TTFT_i = T_queue(i) + T_prefill(len, l_i)``.

``p = argmin_i TTFT_i``. When ``b / l_p > threshold`` the plan carries the hot-spot migration
``TransferKVCache(best_instance, p)`` (lines 20-21): the fetched blocks become a replica on p.
At ``ratio == threshold`` the FAST version computes locally (strict ``>``).
"""

from __future__ import annotations

from typing import ClassVar

from conductor.core.policies.base import PrefillChoice, SchedulingContext, argmin_ttft
from conductor.core.policies.registry import register


def wants_fetch(best_tokens: int, local_tokens: int, threshold: float) -> bool:
    """Line 5 of Algorithm 1 (FAST): ``best / local > threshold``, ``local = 0`` -> inf."""
    if best_tokens <= 0:
        return False
    if local_tokens <= 0:
        return True
    return best_tokens > threshold * local_tokens


@register
class MooncakePolicy:
    name: ClassVar[str] = "mooncake"

    def choose_prefill(self, ctx: SchedulingContext) -> PrefillChoice:
        best = ctx.best_tokens()
        thr = ctx.config.kvcache_balancing_threshold
        choices = []
        for inst in ctx.prefill_pool:
            if wants_fetch(best, ctx.local_tokens(inst), thr):
                choices.append(ctx.fetch_choice(inst))
            else:
                choices.append(ctx.local_choice(inst))
        return argmin_ttft(choices)
