"""Decode where the prefill ran when that instance decodes too (aggregated engines).

``decode = prefill`` if the chosen prefill instance has role ``both`` and is in the decode
pool, with ``TBT = decode_step(B + 1, sum_ctx + prompt)`` there and ``fits`` = KV room and
``TBT <= SLO``; otherwise the wrapped decode policy decides. A shell that runs a request
entirely on a ``both`` engine (no KV hand-off between engines) uses this so the decode
reservation lands on the engine that really decodes.
"""

from __future__ import annotations

from conductor.core.policies.base import (
    DecodeChoice,
    DecodePolicy,
    PrefillChoice,
    SchedulingContext,
)
from conductor.core.policies.decode import has_room, predicted_tbt_s
from conductor.core.types import Role


class ColocatedDecode:
    """A :class:`DecodePolicy` wrapper; see the module docstring."""

    def __init__(self, inner: DecodePolicy) -> None:
        self.inner = inner

    def choose_decode(self, ctx: SchedulingContext, prefill: PrefillChoice) -> DecodeChoice:
        for inst in ctx.decode_pool:
            if inst.spec.instance_id == prefill.instance and inst.spec.role is Role.BOTH:
                tbt = predicted_tbt_s(ctx, inst)
                slo = ctx.request.tbt_slo_s or ctx.config.tbt_slo_s
                return DecodeChoice(prefill.instance, tbt, tbt <= slo and has_room(ctx, inst))
        return self.inner.choose_decode(ctx, prefill)
