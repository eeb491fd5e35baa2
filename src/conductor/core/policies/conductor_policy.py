"""``conductor`` — our default: Mooncake's Algorithm 1, with every option priced.

Per prefill instance ``i`` (local prefix ``l_i``, best prefix ``b`` held by some holder):

* ``TTFT_local(i) = T_queue(i) + T_prefill(len, l_i)``
* ``TTFT_fetch(i) = T_queue(i) + T_transfer(b - l_i) + T_prefill(len, b)`` when ``b > l_i``

``TTFT(i) = min`` of the two (Algorithm 1 takes one of them by the fixed
``kvcache_balancing_threshold`` rule; pricing both can only lower the predicted TTFT, and
it keeps the choice right when a transfer is slow, e.g. a congested or cross-rack path).
``p = argmin_i TTFT(i)``; exact ties go to the instance with the least queued time, then
the fewest queued tokens, then pool order. The fetch becomes a replica on ``p`` (hot-spot
migration, lines 20-21).

The rest of Conductor comes from the scheduler configuration that the shells build for this
policy (``config_defaults``): early rejection against both SLOs (arXiv §7.2) and
chunked pipeline parallel prefill for prompts whose single-node TTFT would miss the SLO.
Those defaults were fixed from the cost model and checked on one generated workload
(``conductor trace synth --kind mixed --seed 1``), never on the traces we report.
"""

from __future__ import annotations

from typing import ClassVar

from conductor.core.policies.base import PrefillChoice, SchedulingContext
from conductor.core.policies.registry import register


@register
class ConductorPolicy:
    name: ClassVar[str] = "conductor"
    config_defaults: ClassVar[dict[str, object]] = {"admission": "early", "cpp_enabled": True}

    def choose_prefill(self, ctx: SchedulingContext) -> PrefillChoice:
        best_tokens = ctx.best_tokens()
        now = ctx.now_s
        winner: PrefillChoice | None = None
        key: tuple[float, float, int] | None = None
        for inst in ctx.prefill_pool:
            choice = ctx.local_choice(inst)
            if best_tokens > choice.local_tokens:
                fetch = ctx.fetch_choice(inst)
                if fetch.ttft_s < choice.ttft_s:
                    choice = fetch
            k = (choice.ttft_s, inst.prefill.queue_s(now), inst.prefill.queued_tokens)
            if key is None or k < key:
                winner, key = choice, k
        assert winner is not None
        return winner
