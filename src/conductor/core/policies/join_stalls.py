"""The stalls a decoding request sits through when others join its decode instance
(``SchedulerConfig.handoff == "load"``).

A decode engine that reads a joining request's KV inside its step (vLLM's ExampleConnector,
``conductor emulate``) lengthens that step, for every request decoding there, by the load's
seconds. TBT — the mean of a request's ``k = ceil(0.1 * (E[out] - 1))`` longest intervals —
then takes those stretched intervals first: with ``J`` joins while it decodes, of stalls
``s_1 >= s_2 >= ...``, ``TBT ~ step + (s_1 + ... + s_min(J, k)) / k``.

Who will join is not known; how often requests joined the instance lately is. The
prediction takes the joins of the last ``life`` seconds — ``life = E[out] * step``, as long
as the new request will decode there — as the joins of its own decode (a stationary
arrival stream), each with the stall it caused (the load's seconds at the cost model's
transfer rate, of the prompt tokens the instance did not hold). The requests already placed
on the instance whose prefill is still running will join it too, each with its load's
stall (booked at placement, :attr:`~conductor.core.state.DecodeState.pending_stalls`):
they count beside the window's (without them a burst released at once from the hold
queue went to one instance unseen). No parameter: the cost model gives the stalls and the
step, the output-length predictor ``E[out]``.
"""

from __future__ import annotations

from bisect import bisect_left

from conductor.core.policies.base import SchedulingContext
from conductor.core.state import JOIN_LOG, DecodeState
from conductor.core.types import InstanceId


def load_stall_s(ctx: SchedulingContext, prefill: InstanceId, decode: InstanceId) -> float:
    """How long ``decode``'s step will stall loading the request's KV: the cost model's
    transfer of the prompt tokens it does not hold, with ``handoff="load"`` and a separate
    decode instance; else 0."""
    if ctx.config.handoff != "load" or decode == prefill:
        return 0.0
    return ctx.cost.transfer_s(ctx.handoff_tokens(decode))


def join_stall_s(d: DecodeState, now_s: float, life_s: float, k: int) -> float:
    """The stalls' share of TBT (``(s_1 + ... + s_min(J, k)) / k``) for a request that
    decodes on ``d`` from ``now_s`` for ``life_s`` seconds: the joins of the last ``life_s``
    seconds (of the last :data:`~conductor.core.state.JOIN_LOG`) and those still to come of
    the requests placed on ``d`` and still in prefill (``d.pending_stalls``); 0 when there are
    none. The window is found by bisection in the sorted log, and its share and stalls for
    the same window and ``k`` are remembered (the decisions between two joins mostly ask for
    them again); the pending ones are added to the remembered stalls, at most ``k`` of
    them, and that share too is remembered until the window, ``k`` or the pending change."""
    times = d.join_times
    end = len(times)
    pending = d.pending_stalls
    if k <= 0 or (end == 0 and not pending):
        return 0.0
    first = bisect_left(times, now_s - life_s)
    if first < end - JOIN_LOG:
        first = end - JOIN_LOG
    memo = d.stall_memo
    if memo[0] == first and memo[1] == end and memo[2] == k:
        share, top = memo[3], memo[4]
    else:
        top = d.join_stalls[first:end]
        top.reverse()  # newest first, the order the shares were always summed in
        if len(top) > k:
            top.sort(reverse=True)
            del top[k:]
        share = sum(top) / k
        d.stall_memo = (first, end, k, share, top)
    if not pending:
        return share
    version = d.pending_version
    pm = d.pending_memo
    if pm[0] == first and pm[1] == end and pm[2] == k and pm[3] == version:
        return pm[4]
    if len(top) + len(pending) <= k:  # the whole window, oldest first, then the pending
        stalls = top[::-1]
        stalls.extend(pending.values())
    else:  # the k longest of both
        stalls = top + list(pending.values())
        stalls.sort(reverse=True)
        del stalls[k:]
    share = sum(stalls) / k
    d.pending_memo = (first, end, k, version, share)
    return share
