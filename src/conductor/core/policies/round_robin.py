"""``round_robin`` — prefill instances in turn (``i = counter mod N``)."""

from __future__ import annotations

from typing import ClassVar

from conductor.core.policies.base import PrefillChoice, SchedulingContext
from conductor.core.policies.registry import register


@register
class RoundRobinPolicy:
    name: ClassVar[str] = "round_robin"

    def choose_prefill(self, ctx: SchedulingContext) -> PrefillChoice:
        inst = ctx.prefill_pool[ctx.round_robin_counter % len(ctx.prefill_pool)]
        return ctx.local_choice(inst)
