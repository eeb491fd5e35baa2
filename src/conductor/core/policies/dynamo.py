"""``dynamo`` — NVIDIA Dynamo's KV-router cost (current main), as a baseline.

Source: ai-dynamo/dynamo ``lib/kv-router/src/scheduling/selector/default.rs`` and
``scheduling/config.rs``, docs "routing concepts"; summarised in
``reference/peer-routers.md`` §1.1. Our own code, written from those descriptions.

Per prefill instance ``i``; ``b`` = block size, ``P`` = prompt tokens, ``R = ceil(P / b)``::

    raw_prefill_blocks_i = queued_prefill_tokens_i / b + R
    credit_blocks_i      = overlap_score_credit * device_i + host_cache_hit_weight * host_i
    decode_blocks_i      = context_tokens_i / b + R    if i also decodes, else 0
    cost_i = prefill_load_scale * max(0, raw_prefill_blocks_i - credit_blocks_i)
             + decode_blocks_i + decode_active_request_weight * active_requests_i

``argmin cost``; exact ties go to a uniform draw among the tied from the seeded ``ctx.rng``
(Dynamo breaks ties at random). With ``router_temperature`` ``T > 0`` the instance is
sampled instead (one ``ctx.rng.random()`` draw) with
``p_i ∝ exp(-(cost_i - min) / ((max - min) * T))``, uniform when all costs are equal.

Parameters (``SchedulerConfig.policy_params``), Dynamo's defaults: ``prefill_load_scale``
1.0, ``overlap_score_credit`` 1.0, ``host_cache_hit_weight`` 0.75,
``decode_active_request_weight`` 0.0, ``router_temperature`` 0.0.

How Dynamo's quantities map onto ours:

* ``queued_prefill_tokens`` = ``PrefillState.queued_tokens``: uncached tokens of the
  prefills assigned and not finished — Dynamo's "active prefill tokens" (ISL − overlap,
  released at the first token).
* ``device_i`` = ``match.gpu_blocks[i]``; ``host_i`` = ``match.local_blocks[i] - device_i``,
  the blocks of the instance's own prefix past its GPU part (held in its DRAM). Dynamo's
  disk tier (0.25) and shared-cache credit (multiplier 0 by default) have no counterpart:
  our shared STORE tier earns no credit.
* Decode term: Dynamo's prefill router in disaggregated mode disables active-block tracking,
  so a pure prefill instance's decode term is 0. An instance that also decodes
  (``Role.BOTH``) is scored like a Dynamo aggregated worker — its active decode blocks
  (``context_tokens / b``, aggregated, where Dynamo counts whole blocks per request) plus the
  request's — and :meth:`DynamoPolicy.choose_decode` keeps the request on it.
* ``active_requests_i`` = queued prefill requests + decode batch.
* Decode placement (:func:`least_active_blocks`): load-only, as Dynamo's decode router in
  disaggregated mode (overlap credit forced to 0): ``cost_d = context_tokens_d / b + R +
  decode_active_request_weight * batch_d``, same argmin / temperature rule, among the decode
  instances with KV room (all of them if none has) — the room filter is ours, the same one
  the default decode policy applies, so that comparisons isolate the prefill choice.
* Not modelled: credit decay (off by default), taints, busy thresholds, the router queue,
  the cold pool, conditional disaggregation, output-block tracking (off by default).
"""

from __future__ import annotations

import math
from typing import ClassVar

from conductor.core.errors import InvalidInput
from conductor.core.policies.base import DecodeChoice, PrefillChoice, SchedulingContext
from conductor.core.policies.decode import has_room, predicted_tbt_s
from conductor.core.policies.registry import register
from conductor.core.policies.selection import (
    argmin_index,
    inflight_requests,
    param,
    softmax_index,
)
from conductor.core.state import InstanceState

DEFAULTS: dict[str, float] = {
    "prefill_load_scale": 1.0,
    "overlap_score_credit": 1.0,
    "host_cache_hit_weight": 0.75,
    "decode_active_request_weight": 0.0,
    "router_temperature": 0.0,
}


def request_blocks(ctx: SchedulingContext) -> int:
    """``R = ceil(prompt_tokens / block_size)``: the request's blocks."""
    return math.ceil(ctx.request.prompt_tokens / ctx.config.block_size_tokens)


def credit_blocks(ctx: SchedulingContext, inst: InstanceState) -> float:
    """Overlap credit: device blocks at ``overlap_score_credit``, host (DRAM) blocks past
    them at ``host_cache_hit_weight``."""
    iid = inst.spec.instance_id
    device = ctx.match.gpu_blocks.get(iid, 0)
    host = ctx.match.local_blocks.get(iid, 0) - device
    return (
        param(ctx, DEFAULTS, "overlap_score_credit") * device
        + param(ctx, DEFAULTS, "host_cache_hit_weight") * host
    )


def prefill_cost(ctx: SchedulingContext, inst: InstanceState) -> float:
    """Dynamo's cost of routing the request's prefill to ``inst``, in blocks."""
    b = ctx.config.block_size_tokens
    r = request_blocks(ctx)
    raw = inst.prefill.queued_tokens / b + r
    adjusted = max(0.0, raw - credit_blocks(ctx, inst))
    decode = inst.decode.context_tokens / b + r if inst.spec.role.decodes else 0.0
    weight = param(ctx, DEFAULTS, "decode_active_request_weight")
    return (
        param(ctx, DEFAULTS, "prefill_load_scale") * adjusted
        + decode
        + weight * inflight_requests(inst)
    )


def decode_cost(ctx: SchedulingContext, inst: InstanceState) -> float:
    """Load-only decode cost: active decode blocks + the request's (+ per-request term)."""
    d = inst.decode
    blocks = d.context_tokens / ctx.config.block_size_tokens + request_blocks(ctx)
    return blocks + param(ctx, DEFAULTS, "decode_active_request_weight") * d.batch_size


def select(ctx: SchedulingContext, costs: list[float]) -> int:
    """Argmin with a seeded random tie-break, or softmax sampling when ``T > 0``."""
    t = param(ctx, DEFAULTS, "router_temperature")
    if t < 0.0:
        raise InvalidInput("router_temperature", t, "must be >= 0")
    if t > 0.0:
        return softmax_index(costs, t, ctx.rng)
    return argmin_index(costs, ctx.rng)


def least_active_blocks(ctx: SchedulingContext, prefill: PrefillChoice) -> DecodeChoice:
    """Dynamo's decode routing; see the module docstring."""
    chosen: InstanceState | None = None
    for inst in ctx.decode_pool:
        if inst.spec.instance_id == prefill.instance:  # aggregated worker: stays put
            chosen = inst
            break
    if chosen is None:
        pool = [i for i in ctx.decode_pool if has_room(ctx, i)] or list(ctx.decode_pool)
        chosen = pool[select(ctx, [decode_cost(ctx, i) for i in pool])]
    tbt = predicted_tbt_s(ctx, chosen)
    slo = ctx.tbt_slo_s
    return DecodeChoice(chosen.spec.instance_id, tbt, has_room(ctx, chosen) and tbt <= slo)


@register
class DynamoPolicy:
    """Prefill: KV-aware block cost; decode: load-only (brings its own decode policy)."""

    name: ClassVar[str] = "dynamo"

    def choose_prefill(self, ctx: SchedulingContext) -> PrefillChoice:
        pool = ctx.prefill_pool
        return ctx.local_choice(pool[select(ctx, [prefill_cost(ctx, i) for i in pool])])

    def choose_decode(self, ctx: SchedulingContext, prefill: PrefillChoice) -> DecodeChoice:
        return least_active_blocks(ctx, prefill)


class DynamoDecode:
    """:func:`least_active_blocks` as a standalone :class:`DecodePolicy`."""

    def choose_decode(self, ctx: SchedulingContext, prefill: PrefillChoice) -> DecodeChoice:
        return least_active_blocks(ctx, prefill)
