"""Load-balancing decoding scheduling (Mooncake Algorithm 1, line 24).

For every decode instance predict the step time it would have with this request added,
``TBT = decode_step(B + 1, sum_ctx + prompt_tokens)``, and pick the lowest among those whose
KV room and batch limit admit the request. ``fits`` is False when none meets the TBT SLO or
none has room (the best effort is still returned so admission can report it).
"""

from __future__ import annotations

from conductor.core.policies.base import DecodeChoice, PrefillChoice, SchedulingContext
from conductor.core.state import InstanceState


def predicted_tbt_s(ctx: SchedulingContext, inst: InstanceState) -> float:
    d = inst.decode
    return ctx.cost.decode_step_s(d.batch_size + 1, d.context_tokens + ctx.request.prompt_tokens)


def has_room(ctx: SchedulingContext, inst: InstanceState) -> bool:
    need = ctx.request.prompt_tokens + ctx.request.output_tokens
    return _room_for(inst, need, ctx.cost.kv_capacity_tokens, ctx.cost.max_batch_size)


def _room_for(inst: InstanceState, need: int, default_kv: int, default_batch: int) -> bool:
    """KV room for ``need`` more tokens and a free batch slot (spec limits, else defaults)."""
    d = inst.decode
    spec = inst.spec
    cap = spec.kv_capacity_tokens if spec.kv_capacity_tokens is not None else default_kv
    batch = spec.max_batch_size if spec.max_batch_size is not None else default_batch
    return d.kv_reserved_tokens + need <= cap and d.batch_size < batch


def least_tbt(ctx: SchedulingContext, prefill: PrefillChoice) -> DecodeChoice:
    """The lowest predicted TBT among instances with room, the first on ties; else the
    lowest among all (``fits`` False). Only the returned choice object is built."""
    del prefill
    req = ctx.request
    slo = req.tbt_slo_s or ctx.config.tbt_slo_s
    prompt = req.prompt_tokens
    need = prompt + req.output_tokens
    cost = ctx.cost
    step_s = cost.decode_step_s
    default_kv = cost.kv_capacity_tokens
    default_batch = cost.max_batch_size
    best: InstanceState | None = None
    best_tbt = 0.0
    fallback: InstanceState | None = None
    fallback_tbt = 0.0
    for inst in ctx.decode_pool:
        if _room_for(inst, need, default_kv, default_batch):
            d = inst.decode
            tbt = step_s(d.batch_size + 1, d.context_tokens + prompt)  # predicted_tbt_s
            if best is None or tbt < best_tbt:
                best, best_tbt = inst, tbt
        elif best is None:  # the fallback only matters while no instance has room
            d = inst.decode
            tbt = step_s(d.batch_size + 1, d.context_tokens + prompt)
            if fallback is None or tbt < fallback_tbt:
                fallback, fallback_tbt = inst, tbt
    if best is not None:
        return DecodeChoice(best.spec.instance_id, best_tbt, best_tbt <= slo)
    assert fallback is not None, "decode pool is empty"
    return DecodeChoice(fallback.spec.instance_id, fallback_tbt, False)


class LeastTbtDecode:
    """The default :class:`DecodePolicy`."""

    def choose_decode(self, ctx: SchedulingContext, prefill: PrefillChoice) -> DecodeChoice:
        return least_tbt(ctx, prefill)
