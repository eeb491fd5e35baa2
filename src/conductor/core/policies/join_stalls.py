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
transfer rate, of the prompt tokens the instance did not hold). No parameter: the cost
model gives the stalls and the step, the output-length predictor ``E[out]``.
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
    decodes on ``d`` from ``now_s`` for ``life_s`` seconds, from the joins of the last
    ``life_s`` seconds (of the last :data:`~conductor.core.state.JOIN_LOG`); 0 when none
    joined. The window is found by bisection in the sorted log, and the share of the same
    window and ``k`` is remembered (the decisions between two joins mostly ask for it again)."""
    times = d.join_times
    end = len(times)
    if end == 0 or k <= 0:
        return 0.0
    first = bisect_left(times, now_s - life_s)
    if first < end - JOIN_LOG:
        first = end - JOIN_LOG
    if first == end:
        return 0.0
    memo = d.stall_memo
    if memo[0] == first and memo[1] == end and memo[2] == k:
        return memo[3]
    recent = d.join_stalls[first:end]
    recent.reverse()  # newest first, the order the shares were always summed in
    if len(recent) > k:
        recent.sort(reverse=True)
        del recent[k:]
    share = sum(recent) / k
    d.stall_memo = (first, end, k, share)
    return share
