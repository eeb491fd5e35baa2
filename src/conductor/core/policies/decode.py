"""Load-balancing decoding scheduling (Mooncake Algorithm 1, line 24).

For every decode instance predict the step time it would have with this request added,
``TBT = decode_step(B + 1, kv_reserved + prompt + E[output])`` — the context every request on
it is expected to reach by its last token (each reservation is prompt + predicted output,
:class:`~conductor.core.state.DecodeState`), because TBT (the mean of the longest 10% of a
request's intervals) is set by the late, long-context steps — times :func:`tbt_factor` for the
long first interval, and pick the lowest among those whose KV room (for the request's prompt
and the high quantile of its predicted output) and batch limit admit the request.
``E[output] = E[min(L, cap)]`` comes from the output-length predictor, never the true
length. ``fits`` is False when none meets the TBT SLO or
none has room (the best effort is still returned so admission can report it).
"""

from __future__ import annotations

from conductor.core.policies.base import DecodeChoice, PrefillChoice, SchedulingContext
from conductor.core.state import InstanceState
from conductor.core.tbt import tail_count
from conductor.core.types import InstanceId


def tbt_intervals(output_tokens: float) -> int:
    """``k``: how many of a request's longest token intervals its TBT averages (FAST: the
    longest 10%)."""
    return tail_count(output_tokens - 1)


def tbt_factor(output_tokens: float) -> float:
    """TBT (FAST: mean of the longest 10% of a request's token intervals) in units of the
    decode step. The first interval is longer: the request waits for the running iteration
    to end (half a step on average) and then runs a full one, so with
    ``k = ceil(0.1 * intervals)`` longest intervals, ``TBT = step * (1 + 0.5 / k)``."""
    return 1.0 + 0.5 / tbt_intervals(output_tokens)


def predicted_tbt_s(ctx: SchedulingContext, inst: InstanceState) -> float:
    d = inst.decode
    out = ctx.output.mean
    step = ctx.cost.decode_step_s(
        d.batch_size + 1, int(d.kv_reserved_tokens + ctx.request.prompt_tokens + out)
    )
    return step * tbt_factor(out)


def kv_capacity(ctx: SchedulingContext, inst: InstanceState) -> int:
    cap = inst.spec.kv_capacity_tokens
    return cap if cap is not None else ctx.cost.kv_capacity_tokens


def max_batch(ctx: SchedulingContext, inst: InstanceState) -> int:
    most = inst.spec.max_batch_size
    return most if most is not None else ctx.cost.max_batch_size


def has_room(ctx: SchedulingContext, inst: InstanceState) -> bool:
    d = inst.decode
    need = ctx.request.prompt_tokens + ctx.output.high
    spec = inst.spec
    cap = (
        spec.kv_capacity_tokens
        if spec.kv_capacity_tokens is not None
        else ctx.cost.kv_capacity_tokens
    )
    batch = spec.max_batch_size if spec.max_batch_size is not None else ctx.cost.max_batch_size
    return d.kv_reserved_tokens + need <= cap and d.batch_size < batch


def _rack_of(ctx: SchedulingContext, iid: InstanceId) -> str | None:
    for inst in ctx.prefill_pool:
        if inst.spec.instance_id == iid:
            return inst.spec.rack
    return None


def _same_rack(
    ctx: SchedulingContext, prefill: PrefillChoice, best: InstanceState, slo: float
) -> DecodeChoice | None:
    """Decode near the prefill node: when the lowest-TBT instance sits in another rack than
    the prefill instance, the lowest-TBT instance of the prefill's rack that also meets the
    TBT SLO and has room (the KV hand-off then stays inside the rack), else None."""
    rack = _rack_of(ctx, prefill.instance)
    if rack is None or best.spec.rack == rack:
        return None
    choice: DecodeChoice | None = None
    for inst in ctx.decode_pool:
        if inst.spec.rack != rack or not has_room(ctx, inst):
            continue
        tbt = predicted_tbt_s(ctx, inst)
        if tbt <= slo and (choice is None or tbt < choice.tbt_s):
            choice = DecodeChoice(inst.spec.instance_id, tbt, True)
    return choice


def least_tbt(ctx: SchedulingContext, prefill: PrefillChoice) -> DecodeChoice:
    """The lowest predicted TBT among instances with room, the first on ties; else the
    lowest among all (``fits`` False). The loop inlines :func:`predicted_tbt_s` and
    :func:`has_room` (same formulas) and builds only the returned choice object."""
    req = ctx.request
    slo = ctx.tbt_slo_s
    out = ctx.output
    need = int(req.prompt_tokens + out.mean)  # the context it adds
    room_need = req.prompt_tokens + out.high  # the KV it must find
    factor = tbt_factor(out.mean)
    cost = ctx.cost
    step_s = cost.decode_step_s
    default_kv = cost.kv_capacity_tokens
    default_batch = cost.max_batch_size
    best: InstanceState | None = None
    best_tbt = 0.0
    fallback: InstanceState | None = None
    fallback_tbt = 0.0
    for inst in ctx.decode_pool:
        d = inst.decode
        spec = inst.spec
        batch = d.batch_size
        kv = spec.kv_capacity_tokens
        if kv is None:
            kv = default_kv
        most = spec.max_batch_size
        if most is None:
            most = default_batch
        room = d.kv_reserved_tokens + room_need <= kv and batch < most
        if room:
            tbt = step_s(batch + 1, d.kv_reserved_tokens + need) * factor
            if best is None or tbt < best_tbt:
                best, best_tbt = inst, tbt
        elif best is None:  # the fallback only matters while no instance has room
            tbt = step_s(batch + 1, d.kv_reserved_tokens + need) * factor
            if fallback is None or tbt < fallback_tbt:
                fallback, fallback_tbt = inst, tbt
    return decode_choice(ctx, prefill, slo, best, best_tbt, fallback, fallback_tbt)


def decode_choice(
    ctx: SchedulingContext,
    prefill: PrefillChoice,
    slo: float,
    best: InstanceState | None,
    best_tbt: float,
    fallback: InstanceState | None,
    fallback_tbt: float,
) -> DecodeChoice:
    """The choice from a scan of the decode pool: ``best`` (the lowest TBT among instances
    with room; a same-rack one instead when both meet the SLO, :func:`_same_rack`), else
    ``fallback`` (the lowest among all, ``fits`` False)."""
    if best is not None:
        if best_tbt <= slo and len(ctx.decode_pool) > 1:
            near = _same_rack(ctx, prefill, best, slo)
            if near is not None:
                return near
        return DecodeChoice(best.spec.instance_id, best_tbt, best_tbt <= slo)
    assert fallback is not None, "decode pool is empty"
    return DecodeChoice(fallback.spec.instance_id, fallback_tbt, False)


class LeastTbtDecode:
    """The default :class:`DecodePolicy`."""

    def choose_decode(self, ctx: SchedulingContext, prefill: PrefillChoice) -> DecodeChoice:
        return least_tbt(ctx, prefill)
