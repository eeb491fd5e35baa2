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

        ``TTFT_i - T_queue(i)`` depends only on the instance's local prefix (in blocks), its
        NIC and whether it is the sole holder of the best prefix (then there is nothing to
        fetch), so it is computed once per such class and memoised (a fetch's wait for the
        NICs is added per instance); most instances share one. Candidates are compared by
        their float TTFT, summed in the order of
        :attr:`PrefillChoice.ttft_s` with the estimators of ``ctx.local_choice`` /
        ``ctx.fetch_choice``. Only the winner's choice object is built, by those methods,
        so the plan is the one ``argmin_ttft`` over every candidate's choice would give.
        """
        local_blocks = ctx.match.local_blocks.get
        holders = ctx.match.best_holders
        sole = holders[0] if len(holders) == 1 else None
        # (local blocks, NIC, sole holder) -> (T_transfer, T_prefill, fetches)
        estimates: dict[tuple[int, float | None, bool], tuple[float, float, bool]] = {}
        winner: InstanceState | None = None
        winner_ttft = 0.0
        winner_fetches = False
        for inst in ctx.prefill_pool:
            spec = inst.spec
            iid = spec.instance_id
            key = (local_blocks(iid, 0), spec.nic_bytes_per_s, iid == sole or not spec.pulls_kv)
            est = estimates.get(key)
            if est is None:
                est = estimates[key] = _estimate(ctx, *key)
            transfer, compute, fetches = est
            if fetches:
                transfer += ctx.nic_wait_s(ctx.fetch_source(iid), iid)
            cached = ctx.best_tokens() if fetches else ctx.tokens(key[0])
            ttft = ctx.wait_s(inst, compute, cached) + transfer + compute
            if winner is None or ttft < winner_ttft:
                winner, winner_ttft, winner_fetches = inst, ttft, fetches
        assert winner is not None, "prefill pool is empty"
        return ctx.fetch_choice(winner) if winner_fetches else ctx.local_choice(winner)


def _estimate(
    ctx: SchedulingContext, local_blocks: int, nic_bytes_per_s: float | None, no_fetch: bool
) -> tuple[float, float, bool]:
    """``(T_transfer, T_prefill, fetches)`` of an instance with ``local_blocks`` cached:
    Algorithm 1's branch, as ``ctx.fetch_choice`` / ``ctx.local_choice`` compute it
    (``no_fetch``: it holds the only copy, or cannot pull KV)."""
    local = ctx.tokens(local_blocks)
    best = ctx.best_tokens()
    # fetch_choice falls back to local when there is no other source or nothing to gain
    if (
        wants_fetch(best, local, ctx.config.kvcache_balancing_threshold)
        and not no_fetch
        and local < best
    ):
        return ctx.cost.transfer_s(best - local, nic_bytes_per_s), ctx.prefill_s(best), True
    return 0.0, ctx.prefill_s(local), False
