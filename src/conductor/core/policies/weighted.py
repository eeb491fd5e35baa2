"""``weighted`` — the seed article's score: ``alpha * cached/total + beta * (1 - load)``.

``cached`` is the instance's local prefix in tokens, ``total`` the prompt length, and
``load = T_queue / TTFT_SLO`` (0 idle, 1 at the SLO). Instances with ``load >= 1``
(overloaded) are filtered out unless all are; highest score wins, first on ties.
Parameters (``policy_params``): ``alpha`` (default 1.0), ``beta`` (default 1.0).
"""

from __future__ import annotations

from typing import ClassVar

from conductor.core.policies.base import PrefillChoice, SchedulingContext
from conductor.core.policies.registry import register


@register
class WeightedPolicy:
    name: ClassVar[str] = "weighted"

    def choose_prefill(self, ctx: SchedulingContext) -> PrefillChoice:
        alpha = ctx.config.policy_params.get("alpha", 1.0)
        beta = ctx.config.policy_params.get("beta", 1.0)
        slo = ctx.ttft_slo_s
        total = ctx.request.prompt_tokens
        scored = []
        for inst in ctx.prefill_pool:
            load = inst.prefill.queue_s(ctx.now_s) / slo
            score = alpha * ctx.local_tokens(inst) / total + beta * (1.0 - load)
            scored.append((load >= 1.0, -score, inst))
        pool = [s for s in scored if not s[0]] or scored
        best = pool[0]
        for s in pool[1:]:
            if s[1] < best[1]:
                best = s
        return ctx.local_choice(best[2])
