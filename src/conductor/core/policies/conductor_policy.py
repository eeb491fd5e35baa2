"""``conductor`` — our default: Mooncake's Algorithm 1, with every option priced.

Per prefill instance ``i`` (local prefix ``l_i``, best prefix ``b`` held by some holder):

* ``TTFT_local(i) = T_queue(i) + T_prefill(len, l_i)``
* ``TTFT_fetch(i) = T_queue(i) + T_transfer(b - l_i) + T_prefill(len, b)`` when ``b > l_i``

``TTFT(i) = min`` of the two (Algorithm 1 takes one of them by the fixed
``kvcache_balancing_threshold`` rule; pricing both can only lower the predicted TTFT, and
it keeps the choice right when a transfer is slow, e.g. a congested or cross-rack path).
``p = argmin_i TTFT(i)``; exact ties go to the instance with the least queued time, then
the fewest queued tokens, then the fewest cached blocks, then the one idle longest (its
predicted end of work the earliest), then pool order: a prompt nobody holds, at light load,
goes to the emptiest cache, so new prefix groups (a system prompt, a new conversation)
spread over the pool rather than all starting on its first instance and then queueing
there behind each other. The fetch becomes a replica on ``p`` (hot-spot
migration, lines 20-21). Where an instance's cache size is known and its cache is full, the
key adds what its store would evict: ``w x prefill_s(evicted blocks' tokens, 0)``, ``w``
the measured chance that an evicted block is asked for again
(:mod:`conductor.core.eviction_regret`; ``policy_params["eviction_weight"]`` overrides it);
the predicted TTFT does not include it. The key also prices the compute an instance would
spend on prefix blocks that another instance holds (recomputing a held document because
its holder is busy): ``w x (prefill_s(local) - prefill_s(b))`` with ``w = WORK_PRICE x
busy / max(idle, 1)`` over the prefill pool (instances with predicted work left, and
without): at light load such compute takes nothing from anyone and costs nothing; with most
instances busy it delays the requests after it, and waiting for the holder is cheaper
(:data:`WORK_PRICE`; ``policy_params["work_price"]`` overrides it, 0 switches it off; the
predicted TTFT does not include it either). A fetch recomputes nothing and pays nothing;
the colocated key below has no such price (measured there and not kept, docs/policies.md).

On a pool of only ``role=both`` instances (aggregated engines: each decodes what it
prefills, and a prompt's chunks stall the decodes sharing its steps) the key is
``TTFT(i) / TTFT_SLO + max(0, (TBT(i) + B_i x stall_i / k) / TBT_SLO - 0.9)`` instead
(:func:`~conductor.core.policies.colocated.colocated_cost_s`: TBT costs from 90% of its SLO,
:data:`~conductor.core.tbt.TBT_MARGIN`; ``policy_params["colocated_tbt_margin"]``
overrides the 0.1, 1 gives the linear key it replaced); in a mixed pool a ``both``
instance whose decodes would miss the TBT SLO goes after the others.

Decode: the lowest predicted TBT with the KV hand-off's tail in the first interval
(:mod:`conductor.core.policies.first_interval`). Late binding (``late_binding``,
:mod:`conductor.core.late_binding`): requests are held, shortest prefill first with aging
and a deadline guard, until a prefill instance is predicted free (compute and NIC; horizon
0) and a decode instance is predicted within 90% of the TBT SLO; the shells (the simulator,
the gateway) run the queue. Both were chosen on generated workloads only (docs/policies.md).

The rest of Conductor comes from the scheduler configuration that the shells build for this
policy (``config_defaults``): early rejection against both SLOs (arXiv §7.2) and
chunked pipeline parallel prefill for prompts whose single-node TTFT would miss the SLO.
Those defaults were fixed from the cost model and checked on one generated workload
(``conductor trace synth --kind mixed --seed 1``), never on the traces we report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from conductor.core.late_binding_rule import HOLD_AGE_WEIGHT, HOLD_HEADROOM_MARGIN, LateBinding
from conductor.core.policies.base import DecodeChoice, PrefillChoice, SchedulingContext
from conductor.core.policies.colocated import (
    all_colocated,
    colocated_tbt_cost,
    colocated_tbt_s,
)
from conductor.core.policies.decode import least_tbt
from conductor.core.policies.first_interval import first_interval_tbt
from conductor.core.policies.registry import register
from conductor.core.state import InstanceState
from conductor.core.tbt import TBT_MARGIN
from conductor.core.types import Role

WORK_PRICE = 0.5
"""How the ``conductor`` key prices a second of prefill compute that reuses less than the
best held prefix, per busy prefill instance per idle one (see the module docstring).
Chosen on generated workloads only (``conductor trace synth``, seeds 42 and 7, the 48
default, no-fetch and ``conductor serve``-like cases of docs/policies.md "Pricing the
recompute") among a constant 0.5, 1, 2, 4 and load-scaled forms; never on a reported trace."""


@register
class ConductorPolicy:
    name: ClassVar[str] = "conductor"
    config_defaults: ClassVar[dict[str, object]] = {"admission": "early", "cpp_enabled": True}
    late_binding: ClassVar[LateBinding] = LateBinding(
        horizon_s=0.0,
        tbt_margin=TBT_MARGIN,
        age_weight=HOLD_AGE_WEIGHT,
        reject_ahead=True,
        headroom_margin=HOLD_HEADROOM_MARGIN,
    )

    def choose_prefill(self, ctx: SchedulingContext) -> PrefillChoice:
        """``argmin_i min(TTFT_local(i), TTFT_fetch(i))`` with the tie-break above.

        Everything but the queue and a fetch's wait for the NICs depends only on (local
        prefix in blocks, NIC, sole holder of the best prefix), so it is computed once per
        such class; only the winner's
        choice object is built (by ``ctx.local_choice`` / ``ctx.fetch_choice``)."""
        now = ctx.now_s
        local_blocks = ctx.match.local_blocks.get
        holders = ctx.match.best_holders
        sole = holders[0] if len(holders) == 1 else None
        best_tokens = ctx.best_tokens()
        estimates: dict[tuple[int, float | None, bool], tuple[float, float, float]] = {}
        winner: InstanceState | None = None
        winner_key = (False, 0.0, 0.0, 0)
        pool = ctx.prefill_pool
        colocated = all_colocated(pool)
        slo = ctx.tbt_slo_s
        ttft_slo = ctx.ttft_slo_s
        winner_fetches = False
        params = ctx.config.policy_params
        weight = params.get("eviction_weight", ctx.eviction_regret)
        margin = params.get("colocated_tbt_margin", TBT_MARGIN)
        n_blocks = len(ctx.request.block_hashes)
        bs = ctx.config.block_size_tokens
        evict_s: dict[int, float] = {}  # blocks evicted -> their price (many share one)
        work = 0.0 if colocated else _work_weight(pool, now, params.get("work_price", WORK_PRICE))
        best_compute = ctx.prefill_s(best_tokens) if work > 0.0 else 0.0
        # transfers requested by now are booked before the first fetch is priced, whether
        # or not that fetch's NIC wait is then read
        nic = ctx.nic
        booked = nic is None
        for inst in pool:
            spec = inst.spec
            iid = spec.instance_id
            k = (local_blocks(iid, 0), spec.nic_bytes_per_s, iid == sole or not spec.pulls_kv)
            est = estimates.get(k)
            if est is None:
                est = estimates[k] = _estimate(ctx, best_tokens, *k)
            local, fetch, fetch_compute = est
            queue = ctx.wait_s(inst, local, ctx.tokens(k[0]))
            # in a pool with `both` and other instances, a `both` one whose decodes would
            # miss the TBT SLO (its prefills' stalls included) goes after the others
            over = not colocated and spec.role is Role.BOTH and colocated_tbt_s(ctx, inst) > slo
            if fetch < local:  # the NIC wait (>= 0) matters only to a fetch that can win
                if not booked:
                    assert nic is not None
                    nic.release_due(now)
                    booked = True
                if not colocated and winner is not None and (over, queue + fetch) > winner_key[:2]:
                    continue  # loses, whatever its wait (local >= fetch here)
                fetch += ctx.nic_wait_s(ctx.fetch_source(iid), iid)
            fetches = fetch < local
            rest = fetch if fetches else local
            ttft = queue + rest
            tbt_cost = 0.0  # on `both` instances: the key's TBT part (TTFT-independent)
            if colocated:
                compute = fetch_compute if fetches else local
                tbt_cost = colocated_tbt_cost(ctx, inst, compute, margin)
                cost = ttft / ttft_slo + tbt_cost
            else:
                cost = ttft
                if work > 0.0 and not fetches and local > best_compute:
                    cost += work * (local - best_compute)  # recomputing what another holds
            if weight > 0.0 and (
                winner is None
                or over < winner_key[0]
                or (over == winner_key[0] and cost < winner_key[1])
            ):
                # it may win: what its store would evict, at the chance that is needed again
                evict = ctx.evicted_blocks(inst, n_blocks - k[0])
                if evict:
                    price = evict_s.get(evict)
                    if price is None:
                        price = evict_s[evict] = weight * ctx.cost.prefill_s(evict * bs, 0)
                    ttft += price
                    cost = ttft / ttft_slo + tbt_cost if colocated else cost + price
            key = (over, cost, queue, inst.prefill.queued_tokens)
            if (
                winner is None
                or key < winner_key
                or (key == winner_key and _spread(ctx, inst) < _spread(ctx, winner))
            ):
                winner, winner_key, winner_fetches = inst, key, fetches
        assert winner is not None, "prefill pool is empty"
        return ctx.fetch_choice(winner) if winner_fetches else ctx.local_choice(winner)

    def choose_decode(self, ctx: SchedulingContext, prefill: PrefillChoice) -> DecodeChoice:
        """The lowest predicted TBT with the KV hand-off's tail in the first interval
        (:mod:`conductor.core.policies.first_interval`), unless the run switches it off
        (``policy_params["first_interval"] == 0``: Mooncake's load-balancing decoding)."""
        if ctx.config.policy_params.get("first_interval", 1.0) == 0.0:
            return least_tbt(ctx, prefill)
        return first_interval_tbt(ctx, prefill)


def _estimate(
    ctx: SchedulingContext,
    best_tokens: int,
    local_blocks: int,
    nic_bytes_per_s: float | None,
    no_fetch: bool,
) -> tuple[float, float, float]:
    """(TTFT - queue) computing locally, and fetching first (inf when there is nothing to
    fetch, or ``no_fetch``: the instance holds the only copy or cannot pull KV; the NIC wait
    is the caller's, per instance), and the fetch's compute alone."""
    local = ctx.tokens(local_blocks)
    compute_local = ctx.prefill_s(local)
    if best_tokens > local and not no_fetch:
        compute = ctx.prefill_s(best_tokens)
        fetch = ctx.cost.transfer_s(best_tokens - local, nic_bytes_per_s) + compute
        return compute_local, fetch, compute
    return compute_local, math.inf, math.inf


def _work_weight(pool: Sequence[InstanceState], now_s: float, price: float) -> float:
    """``price x busy / max(idle, 1)``: prefill instances with predicted work left at
    ``now_s`` per instance without (at least one counted)."""
    if price <= 0.0:
        return 0.0
    busy = sum(1 for inst in pool if inst.prefill.busy_until_s > now_s)
    return price * busy / max(len(pool) - busy, 1)


def _spread(ctx: SchedulingContext, inst: InstanceState) -> tuple[int, float]:
    """The exact tie-break after the queue: the fewest cached blocks, then the earliest
    predicted end of work (idle longest)."""
    index = ctx.index
    held = index.local_count(inst.spec.instance_id) if index is not None else 0
    return held, inst.prefill.busy_until_s
