"""``cache_aware_local`` — the paper's "local cache-aware" prefill scheduling.

``p = argmin_i [T_queue(i) + T_prefill(len, local_prefix(i))]``: predicted TTFT using only each
instance's own cache; no remote fetch.
"""

from __future__ import annotations

from typing import ClassVar

from conductor.core.policies.base import PrefillChoice, SchedulingContext, argmin_ttft
from conductor.core.policies.registry import register


@register
class CacheAwareLocalPolicy:
    name: ClassVar[str] = "cache_aware_local"

    def choose_prefill(self, ctx: SchedulingContext) -> PrefillChoice:
        return argmin_ttft([ctx.local_choice(i) for i in ctx.prefill_pool])
