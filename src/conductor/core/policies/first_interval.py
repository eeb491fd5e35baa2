"""``conductor``'s decode placement: the lowest predicted TBT *including the first
interval* — the KV hand-off's tail after the prefill ends.

Load-balancing decoding (:func:`~conductor.core.policies.decode.least_tbt`) predicts
``TBT = step * (1 + 0.5 / k)``: the step time with the request added (every request
assigned to the instance, also those still in prefill, at the context it will reach), the
first interval taken as one and a half steps (the wait for the running iteration, then its
own), ``k = ceil(0.1 * (E[out] - 1))`` the number of longest intervals TBT averages. The
first interval is longer when the prompt's KV is still on its way when the prefill ends:
the hand-off streams from the prefill's start over the prefill instance's egress and the
decode instance's ingress, behind the transfers booked on them and those planned that are
requested before it (FIFO in request order: a hand-off is requested when its prefill ends;
:meth:`~conductor.core.nic.NicBook.handoff_tail_s`); what is left of it after the
prefill's end (``tail``) adds to the first interval, so

``TBT(d) = step(d) * (1 + 0.5 / k) + tail(d) / k``.

The tail differs between decode instances by their ingress: a burst of requests placed on
one instance (e.g. the one that just freed room) queues their hand-offs on its NIC; and by
what each already holds of the prompt (its prefix cache, from its KV events: an earlier turn
of the conversation it decoded), which the hand-off need not carry. The
rest — KV room, batch limit, ``fits``, the same-rack preference — is
:func:`~conductor.core.policies.decode.least_tbt`'s. No parameter: every term is the cost
model's or the NIC book's.

When the decode engine makes the first token (``SchedulerConfig.first_token ==
"decode"``: vLLM's P/D proxy, ``conductor serve``) the hand-off and the join wait are in
TTFT and every interval is a decode step, so the predicted TBT is ``step(d)`` and the
instance is the one with the least ``step(d) + tail(d)``: what it adds to TTFT beyond the
wait for its running step, the tail one for one.
"""

from __future__ import annotations

from conductor.core.policies.base import DecodeChoice, PrefillChoice, SchedulingContext
from conductor.core.policies.decode import decode_choice, tbt_factor, tbt_intervals
from conductor.core.policies.join_stalls import join_stall_s
from conductor.core.state import InstanceState
from conductor.core.types import InstanceId


def first_interval_tbt(ctx: SchedulingContext, prefill: PrefillChoice) -> DecodeChoice:
    req = ctx.request
    slo = ctx.tbt_slo_s
    out = ctx.output
    need = int(req.prompt_tokens + out.mean)
    room_need = req.prompt_tokens + out.high
    decode_first = ctx.config.first_token == "decode"
    factor = 1.0 if decode_first else tbt_factor(out.mean)
    per_tail = 1.0 if decode_first else 2.0 * (factor - 1.0)  # in TTFT; else 1 / k in TBT
    stalls = ctx.config.handoff == "load"  # joins' KV loads stall the step (join_stalls)
    k = tbt_intervals(out.mean)
    cost = ctx.cost
    step_s = cost.decode.step_s  # cost.decode_step_s without its call
    nic = ctx.nic
    end = ctx.now_s + prefill.ttft_s
    start = end - prefill.prefill_s
    src = prefill.instance
    bw = None
    for p in ctx.prefill_pool:
        if p.spec.instance_id == src:
            bw = p.spec.nic_bytes_per_s
            break
    seconds = cost.transfer_s(req.prompt_tokens, bw)
    holdings = ctx.decode_held_blocks()
    held = holdings.get
    carried: dict[int, float] = {}  # blocks held -> the shorter hand-off's seconds
    # the hand-off's earliest start on every decode instance: the stream's start and the
    # prefill instance's egress, as requested at the prefill's end (NicBook.handoff_tail_s,
    # inlined: the ingress is per instance)
    planned_in: dict[InstanceId, float] = {}
    base = start
    if nic is not None:
        planned_in, planned_out = nic.planned_before(end)
        e = nic.egress_free_s(src, planned_out)
        if e > base:
            base = e
    late = base + seconds - end  # the tail on a free ingress (may be < 0)
    best: InstanceState | None = None
    best_tbt = best_key = 0.0
    fallback: InstanceState | None = None
    fallback_tbt = fallback_key = 0.0
    for inst in ctx.decode_pool:
        d = inst.decode
        spec = inst.spec
        kv = spec.kv_capacity_tokens
        if kv is None:
            kv = cost.kv_capacity_tokens
        most = spec.max_batch_size
        if most is None:
            most = cost.max_batch_size
        batch = d.batch_size
        reserved = d.kv_reserved_tokens
        room = reserved + room_need <= kv and batch < most
        if not room and best is not None:
            continue
        step = step_s(batch + 1, reserved + need)
        tbt = step * factor
        tail = 0.0
        iid = spec.instance_id
        if iid != src:
            ingress = planned_in.get(iid, 0.0)
            has = held(iid) if holdings else 0
            if has:  # it holds part of the prompt already: the hand-off carries the rest
                secs = carried.get(has, -1.0)
                if secs < 0.0:
                    secs = carried[has] = cost.transfer_s(req.prompt_tokens - ctx.tokens(has), bw)
                tail = (ingress if ingress > base else base) + secs - end
            else:
                tail = ingress + seconds - end if ingress > base else late
        if stalls:
            # the stalls only add: an instance that loses without them loses with them
            # (float addition is monotonic), so their window is not looked at
            if room and best is not None:
                least = tbt + tail * per_tail if tail > 0.0 else tbt
                if least >= best_key:
                    continue
            tbt += join_stall_s(d, ctx.now_s, out.mean * step, k)
        key = tbt  # what the choice minimises: TBT, or with decode_first TBT + tail
        if tail > 0.0:
            key += tail * per_tail
            if not decode_first:
                tbt = key
        if room:
            if best is None or key < best_key:
                best, best_tbt, best_key = inst, tbt, key
        elif fallback is None or key < fallback_key:
            fallback, fallback_tbt, fallback_key = inst, tbt, key
    return decode_choice(ctx, prefill, slo, best, best_tbt, fallback, fallback_tbt)
