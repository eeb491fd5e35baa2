"""``least_loaded`` — the paper's "load-balancing" prefill scheduling.

``p = argmin_i T_queue(i)``: the smallest predicted queue time (sum of predicted prefill times
of the work already assigned). Cache is ignored for the choice; the chosen instance still
reuses its own cache.
"""

from __future__ import annotations

from typing import ClassVar

from conductor.core.policies.base import PrefillChoice, SchedulingContext
from conductor.core.policies.registry import register


@register
class LeastLoadedPolicy:
    name: ClassVar[str] = "least_loaded"

    def choose_prefill(self, ctx: SchedulingContext) -> PrefillChoice:
        now = ctx.now_s
        best = min(ctx.prefill_pool, key=lambda i: i.prefill.queue_s(now))
        return ctx.local_choice(best)
