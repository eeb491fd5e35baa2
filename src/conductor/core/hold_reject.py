"""The hold queue's rejection at arrival (:mod:`conductor.core.late_binding`,
``LateBinding.reject_ahead``): a request that would miss its TTFT SLO even in its best case
behind the requests held ahead of it is answered now, not when its budget has run out.

The best case: the requests ahead list-scheduled in the queue's order on the prefill
instances as they are predicted to come free, then it; every prefill time with the longest
prefix cached anywhere when it arrived, or shared with a prompt still in prefill or held
ahead of it (its blocks are stored by the time this one runs), whichever is shorter. Later
arrivals that overtake it and the queue's deadline guard can only delay it further, so the
check errs towards keeping a request.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from conductor.core.plan import Rejection
from conductor.core.types import BlockHash, Request

if TYPE_CHECKING:  # the scheduler's policies import the hold queue, which imports this
    from conductor.core.scheduler import Scheduler


class Prefixes:
    """The blocks of some prompts, to find how many leading blocks of another one they hold.

    Block hashes are chained — each depends on every block before it (vLLM's and ours,
    :mod:`conductor.core.hashing`; a trace's hash ids likewise) — so a prompt's first ``i``
    blocks are some added prompt's first ``i`` iff its ``i``-th block is among the added
    blocks: a set answers that, and the longest such ``i`` is found by bisection, O(log n)
    lookups per prompt and O(n) C-level work per prompt added. (Comparing with every added
    prompt instead cost O(prompts x blocks) per query: with hundreds of requests held
    behind one system prompt, the gateway's event loop spent 88% of its time here.) With
    hashes that are not chained the answer is never shorter than the longest prefix truly
    shared, so the check still errs towards keeping a request."""

    def __init__(self, chains: Iterable[Sequence[BlockHash]]) -> None:
        self._blocks: set[BlockHash] = set()
        for c in chains:
            self.add(c)

    def add(self, chain: Sequence[BlockHash]) -> None:
        self._blocks.update(chain)

    def shared(self, chain: Sequence[BlockHash]) -> int:
        """The most leading blocks of ``chain`` an added chain has too."""
        blocks = self._blocks
        if not chain or chain[0] not in blocks:
            return 0
        lo, hi = 1, len(chain)  # chain[lo - 1] is held; the answer is in [lo, hi]
        if chain[hi - 1] in blocks:
            return hi
        hi -= 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if chain[mid - 1] in blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo


def best_prefill_s(sched: Scheduler, request: Request, prefill_s: float, known: Prefixes) -> float:
    """``request``'s prefill time ``prefill_s`` (predicted at arrival), or less with the
    prefix it shares with ``known`` cached."""
    shared = known.shared(request.block_hashes) * sched.config.block_size_tokens
    if not shared:
        return prefill_s
    cached = min(shared, request.prompt_tokens - 1)
    return min(prefill_s, sched.cost.prefill_s(request.prompt_tokens, cached))


def doomed(
    sched: Scheduler,
    ahead: Sequence[tuple[Request, float]],
    new: tuple[Request, float, float],
    frees: list[float],
    now_s: float,
) -> Rejection | None:
    """A ``ttft_slo`` rejection for ``new`` (``(request, prefill_s predicted at arrival,
    TTFT SLO)``, arriving at ``now_s``) when its best-case TTFT behind ``ahead`` (``(request,
    prefill_s)`` in the queue's order) on prefill instances free at ``frees`` misses its SLO;
    None otherwise (also without prefill instances)."""
    if not frees:
        return None
    known = Prefixes(sched.prefilling_requests())
    free = [t if t > now_s else now_s for t in frees]
    heapq.heapify(free)
    for req, prefill_s in ahead:
        heapq.heapreplace(free, free[0] + best_prefill_s(sched, req, prefill_s, known))
        known.add(req.block_hashes)
    request, prefill_s, slo = new
    ttft = free[0] - now_s + best_prefill_s(sched, request, prefill_s, known)
    if ttft <= slo:
        return None
    n = len(ahead)
    why = (
        f"predicted TTFT {ttft:.3f}s > SLO {slo:.3f}s waiting behind {n} held"
        f" request{'' if n == 1 else 's'}"
    )
    return Rejection(request.request_id, "ttft_slo", why, ttft)
