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
    """Block-hash chains (prompts), to find the longest prefix one shares with any."""

    def __init__(self, chains: Iterable[Sequence[BlockHash]]) -> None:
        self._by_first: dict[BlockHash, list[Sequence[BlockHash]]] = {}
        for c in chains:
            self.add(c)

    def add(self, chain: Sequence[BlockHash]) -> None:
        if chain:
            self._by_first.setdefault(chain[0], []).append(chain)

    def shared(self, chain: Sequence[BlockHash]) -> int:
        """The most leading blocks of ``chain`` any added chain has too."""
        if not chain:
            return 0
        best = 0
        for other in self._by_first.get(chain[0], ()):
            lo, hi = 1, min(len(chain), len(other))  # chain[:lo] == other[:lo]
            if chain[:hi] == other[:hi]:
                lo = hi
            while lo < hi:  # the longest common prefix, by bisection on equal slices
                mid = (lo + hi + 1) // 2
                if chain[:mid] == other[:mid]:
                    lo = mid
                else:
                    hi = mid - 1
            best = max(best, lo)
        return best


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
