"""Whether the hold queue may release a request to the decode instance its placement chose
(:class:`~conductor.core.late_binding.HoldQueue`, ``decode_aware``).

It may when the instance's predicted TBT with every request already assigned to it —
decoding, or still in prefill, at the context it will reach — plus this one
(:attr:`~conductor.core.policies.base.DecodeChoice.tbt_s`, the hand-off's tail included) is
within a limit, with KV room and a batch slot. The limit is ``1 - tbt_margin`` of the TBT
SLO, or, where the SLO sits close to the smallest TBT the request can have (``idle``: alone
on an idle instance, at the context it will reach), ``idle + (1 - headroom_margin) x (SLO -
idle)`` if that is larger: a margin of the SLO would leave no room for load (TBT SLO 50 ms
over a 44 ms step: 1 ms) and the queue would hold every request until its TTFT budget ran
out. (Judging instead the
load the request will meet from its predicted join to its predicted end, with the decode
forecast, was measured and not kept: docs/policies.md.)

A request whose TTFT budget is about to run out is released anyway (admission
decides), so is one whose TBT would be over the SLO even alone on an idle instance
(waiting cannot bring it under), and a request
with ``max_tokens`` is read with the first-interval factor of the same request without it
(a short ``max_tokens`` makes its own TBT mostly its first interval, which waiting does
not shorten).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from conductor.core.output_length import output_cap
from conductor.core.policies.decode import has_room, tbt_factor

if TYPE_CHECKING:  # the scheduler's policies import the hold queue, which imports this
    from conductor.core.late_binding_rule import LateBinding
    from conductor.core.plan import Prepared
    from conductor.core.scheduler import Scheduler


def give_up_s(
    sched: Scheduler, rule: LateBinding, prepared: Prepared, now_s: float, budget_s: float
) -> float | None:
    """None if ``prepared`` may go now; else the time it must go anyway (its TTFT budget
    less its predicted TTFT and the horizon)."""
    pre = prepared.pre
    if budget_s <= pre.ttft_s + rule.horizon_s:
        return None  # out of time: release it, admission decides
    if _fits(sched, rule, prepared, now_s):
        return None
    return now_s + budget_s - pre.ttft_s - rule.horizon_s


def _fits(sched: Scheduler, rule: LateBinding, prepared: Prepared, now_s: float) -> bool:
    dec, ctx = prepared.dec, prepared.ctx
    req = ctx.request
    inst = sched.instances.get(dec.instance)
    if inst is None:
        return False
    slo = req.tbt_slo_s or sched.config.tbt_slo_s
    scale = 1.0
    if req.max_tokens is not None and sched.config.first_token == "prefill":
        free = replace(req, max_tokens=None)
        typical = sched.lengths.estimate(free, output_cap(free, sched.config.context_tokens))
        scale = tbt_factor(typical.mean) / tbt_factor(ctx.output.mean)
    out = ctx.output.mean
    idle = ctx.cost.decode_step_s(1, int(req.prompt_tokens + out)) * tbt_factor(out) * scale
    limit = max(slo * (1.0 - rule.tbt_margin), idle + (1.0 - rule.headroom_margin) * (slo - idle))
    if has_room(ctx, inst) and dec.tbt_s * scale <= limit:
        return True
    # waiting helps only if the pool can drain under the SLO: not when even an idle
    # instance (this request alone, nothing reserved, no hand-off tail) would be over it
    return idle > slo
