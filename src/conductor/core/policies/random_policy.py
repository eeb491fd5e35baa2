"""``random`` — a prefill instance chosen uniformly at random (seeded).

The chosen instance still reuses whatever its own cache holds (the engine's prefix cache
works whatever the router knows), so predictions use its local prefix.
"""

from __future__ import annotations

from typing import ClassVar

from conductor.core.policies.base import PrefillChoice, SchedulingContext
from conductor.core.policies.registry import register


@register
class RandomPolicy:
    name: ClassVar[str] = "random"

    def choose_prefill(self, ctx: SchedulingContext) -> PrefillChoice:
        inst = ctx.prefill_pool[ctx.rng.randrange(len(ctx.prefill_pool))]
        return ctx.local_choice(inst)
