"""``lmetric`` — LMetric's multiplicative score, as a baseline.

Sources: the LMetric paper (arXiv 2603.15202: ``score = new_prefill_tokens × batch_size``,
no hyperparameters) and SGLang's port ``sgl-model-gateway/src/policies/lmetric.rs``
(``new_prefill_work × (load + 1)``, "Blitz Router"); summarised in
``reference/peer-routers.md`` §2.1 and ``simulation-and-cost-models.md`` §4.2. Our own
code, written from those descriptions.

Per prefill instance ``i``::

    new_prefill_tokens_i = prompt_tokens - local_tokens_i
    score_i              = new_prefill_tokens_i * (load_i + 1)

``load_i`` = in-flight requests (prefills assigned and not finished + decode batch).
``argmin score``; ties as SGLang's ``min_by_key((score, load, new_work, idx))``: lower
load, then fewer new tokens, then pool order. No parameters.

Differences: SGLang estimates ``matched`` from an approximate character tree of routed
text; ours is the instance's local (GPU + DRAM) prefix from the precise index, in tokens,
with the last prompt token always computed (so ``new_prefill_tokens >= 1``). Decode
placement: the Scheduler's default.
"""

from __future__ import annotations

from typing import ClassVar

from conductor.core.policies.base import PrefillChoice, SchedulingContext
from conductor.core.policies.registry import register
from conductor.core.policies.selection import inflight_requests


def lmetric_key(ctx: SchedulingContext, k: int) -> tuple[int, int, int, int]:
    """``(score, load, new_prefill_tokens, pool index)`` of the ``k``-th prefill instance."""
    inst = ctx.prefill_pool[k]
    new = ctx.request.prompt_tokens - ctx.local_tokens(inst)
    load = inflight_requests(inst)
    return new * (load + 1), load, new, k


@register
class LMetricPolicy:
    name: ClassVar[str] = "lmetric"

    def choose_prefill(self, ctx: SchedulingContext) -> PrefillChoice:
        best = min(range(len(ctx.prefill_pool)), key=lambda k: lmetric_key(ctx, k))
        return ctx.local_choice(ctx.prefill_pool[best])
