"""Decode where the prefill ran when that instance decodes too (aggregated engines).

``decode = prefill`` if the chosen prefill instance has role ``both`` and is in the decode
pool, with the TBT :func:`colocated_tbt_s` predicts there and ``fits`` = KV room and
``TBT <= SLO``; otherwise the wrapped decode policy decides. A shell that runs a request
entirely on a ``both`` engine (no KV hand-off between engines) uses this so the decode
reservation lands on the engine that really decodes.

On such an engine every prompt prefilled there lengthens the steps of the requests decoding
there (vLLM mixes prefill chunks and decodes in one step; the simulator's engines too): the
scheduler records each prefill it places on a ``both`` instance as a stall of its predicted
compute beyond one pass (:func:`colocated_stall_s`), and the TBT of a request decoding there
is the decode step's plus the stalls' share, from the stalls of the last ``E[out] x step``
seconds (:func:`~conductor.core.policies.join_stalls.join_stall_s`: the prefills it will
sit through, taken from the recent past). No parameter: the cost model gives the stalls.
"""

from __future__ import annotations

from collections.abc import Sequence

from conductor.core.policies.base import (
    DecodeChoice,
    DecodePolicy,
    PrefillChoice,
    SchedulingContext,
)
from conductor.core.policies.decode import has_room, tbt_factor, tbt_intervals
from conductor.core.policies.join_stalls import join_stall_s
from conductor.core.state import InstanceState
from conductor.core.tbt import TBT_MARGIN
from conductor.core.types import Role


def colocated_tbt_s(ctx: SchedulingContext, inst: InstanceState) -> float:
    """The request's predicted TBT decoding on ``inst`` where it is prefilled: the decode
    step with it added (every assigned request at the context it will reach) times the
    first-interval factor, plus the share of the prefill stalls it will sit through."""
    d = inst.decode
    out = ctx.output.mean
    step = ctx.cost.decode_step_s(
        d.batch_size + 1, int(d.kv_reserved_tokens + ctx.request.prompt_tokens + out)
    )
    tbt = step * tbt_factor(out)
    if d.join_times:
        tbt += join_stall_s(d, ctx.now_s, out * step, tbt_intervals(out))
    return tbt


def colocated_stall_s(ctx: SchedulingContext, prefill: PrefillChoice) -> float:
    """What ``prefill`` adds to the steps of the requests decoding on its ``both``
    instance: its predicted compute beyond the pass those steps run anyway."""
    return _beyond_one_pass(ctx, prefill.prefill_s)


def _beyond_one_pass(ctx: SchedulingContext, compute_s: float) -> float:
    """A prefill's compute beyond the pass the decodes sharing its steps run anyway."""
    return max(0.0, compute_s - ctx.cost.prefill_s(1, 0))


def all_colocated(pool: Sequence[InstanceState]) -> bool:
    """Whether every instance of ``pool`` decodes what it prefills (role ``both``)."""
    for inst in pool:
        if inst.spec.role is not Role.BOTH:
            return False
    return bool(pool)


def colocated_cost_s(
    ctx: SchedulingContext,
    inst: InstanceState,
    ttft_s: float,
    compute_s: float,
    tbt_margin: float = TBT_MARGIN,
) -> float:
    """What placing the request on the ``both`` instance ``inst`` costs the requests there,
    each delay as a share of its SLO: its own TTFT (``ttft_s``) over the TTFT SLO; over the
    TBT SLO, its own predicted TBT there (:func:`colocated_tbt_s`) plus what its prefill
    (``compute_s``, of which the stall is what lies beyond one pass) adds to the TBT of each
    of the ``B`` requests decoding there, ``stall / k`` — counted only beyond ``1 -
    tbt_margin`` of the SLO: ``max(0, (TBT + B x stall / k) / TBT_SLO - (1 - margin))``.
    The stall term is LMetric's ``new work x load`` in TBT's units: it keeps
    ``conductor``'s prefills, on a pool of ``both`` instances, from piling onto the
    instance that holds their prefix while its decodes miss their TBT; measured against the
    SLOs, a second of TTFT weighs what it costs the attainment (1/30 of a 30 s budget), not
    what a second of TBT does (ten 100 ms budgets). Below the threshold TBT costs nothing:
    a TBT well inside its SLO loses no request, so there the TTFT (the prefix cache) decides
    (a margin of 1 counts all of it, the linear key this replaced)."""
    return ttft_s / ctx.ttft_slo_s + colocated_tbt_cost(ctx, inst, compute_s, tbt_margin)


def colocated_tbt_cost(
    ctx: SchedulingContext, inst: InstanceState, compute_s: float, tbt_margin: float
) -> float:
    """:func:`colocated_cost_s`'s TBT part, which does not depend on the TTFT: a caller that
    adds to the TTFT (an eviction price) reuses it."""
    out = ctx.output.mean
    stall = _beyond_one_pass(ctx, compute_s)
    share = inst.decode.batch_size * stall / tbt_intervals(out)
    tbt = (colocated_tbt_s(ctx, inst) + share) / ctx.tbt_slo_s - (1.0 - tbt_margin)
    return tbt if tbt > 0.0 else 0.0


class ColocatedDecode:
    """A :class:`DecodePolicy` wrapper; see the module docstring."""

    def __init__(self, inner: DecodePolicy) -> None:
        self.inner = inner

    def choose_decode(self, ctx: SchedulingContext, prefill: PrefillChoice) -> DecodeChoice:
        for inst in ctx.decode_pool:
            if inst.spec.instance_id == prefill.instance and inst.spec.role is Role.BOTH:
                tbt = colocated_tbt_s(ctx, inst)
                slo = ctx.tbt_slo_s
                return DecodeChoice(prefill.instance, tbt, tbt <= slo and has_room(ctx, inst))
        return self.inner.choose_decode(ctx, prefill)
