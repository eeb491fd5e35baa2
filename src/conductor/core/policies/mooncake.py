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

from conductor.core.policies.base import PrefillChoice, SchedulingContext
from conductor.core.policies.registry import register
from conductor.core.state import InstanceState


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
        """``argmin_i TTFT_i``, the first on ties.

        Candidates are compared by their float TTFT, summed in the order of
        :attr:`PrefillChoice.ttft_s` (queue + transfer + prefill) from the estimators of
        ``ctx.local_choice`` / ``ctx.fetch_choice``; the cost-model calls are memoised for
        this request (most instances share a local prefix length). Only the winner's choice
        object is built, by those same methods, so the plan is the one ``argmin_ttft`` over
        every candidate's choice would give.
        """
        best = ctx.best_tokens()
        thr = ctx.config.kvcache_balancing_threshold
        now = ctx.now_s
        prompt = ctx.request.prompt_tokens
        cost = ctx.cost
        tokens = ctx.tokens
        local_blocks = ctx.match.local_blocks.get
        holders = ctx.match.best_holders  # non-empty whenever best > 0
        local_prefill: dict[int, float] = {}  # T_prefill(len, local) by local tokens
        transfer: dict[tuple[int, float | None], float] = {}  # T_transfer by (tokens, NIC)
        fetch_prefill: float | None = None  # T_prefill(len, best)
        winner: InstanceState | None = None
        winner_ttft = 0.0
        winner_fetches = False
        for inst in ctx.prefill_pool:
            spec = inst.spec
            iid = spec.instance_id
            local = tokens(local_blocks(iid, 0))
            queue = inst.prefill.queue_s(now)
            # fetch_choice's condition: the ratio rule, a source other than iid, more to gain
            fetches = (
                wants_fetch(best, local, thr)
                and local < best
                and (holders[0] != iid or len(holders) > 1)
            )
            if fetches:
                key = (best - local, spec.nic_bytes_per_s)
                moved = transfer.get(key)
                if moved is None:
                    moved = transfer[key] = cost.transfer_s(*key)
                if fetch_prefill is None:
                    fetch_prefill = cost.prefill_s(prompt, best)
                ttft = queue + moved + fetch_prefill
            else:
                compute = local_prefill.get(local)
                if compute is None:
                    compute = local_prefill[local] = cost.prefill_s(prompt, local)
                ttft = queue + compute  # + 0.0 transfer: exact
            if winner is None or ttft < winner_ttft:
                winner, winner_ttft, winner_fetches = inst, ttft, fetches
        assert winner is not None, "prefill pool is empty"
        return ctx.fetch_choice(winner) if winner_fetches else ctx.local_choice(winner)
