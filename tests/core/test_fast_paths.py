"""The optimised loops of ``mooncake`` and ``least_tbt`` choose exactly what the plain
formulas choose: ``argmin_ttft`` over every candidate's ``local_choice`` / ``fetch_choice``,
and the lowest TBT among instances with room (else among all), first on ties."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from conductor.core.costmodel import preset
from conductor.core.events import BlocksStored
from conductor.core.policies.base import (
    DecodeChoice,
    PrefillChoice,
    SchedulingContext,
    argmin_ttft,
)
from conductor.core.policies.decode import has_room, least_tbt, predicted_tbt_s
from conductor.core.policies.mooncake import MooncakePolicy, wants_fetch
from conductor.core.state import InstanceSpec
from conductor.core.types import BlockHash, InstanceId, RequestId, Role, Tier

from .helpers import LINEAR_COST, make_conductor, req

CHAIN = tuple(BlockHash(i) for i in range(1, 13))


def _reference_prefill(ctx: SchedulingContext) -> PrefillChoice:
    """Algorithm 1 as the policy first wrote it: one choice object per candidate."""
    best = ctx.best_tokens()
    thr = ctx.config.kvcache_balancing_threshold
    return argmin_ttft(
        [
            ctx.fetch_choice(i)
            if wants_fetch(best, ctx.local_tokens(i), thr)
            else ctx.local_choice(i)
            for i in ctx.prefill_pool
        ]
    )


def _reference_decode(ctx: SchedulingContext) -> DecodeChoice:
    slo = ctx.request.tbt_slo_s or ctx.config.tbt_slo_s
    best: DecodeChoice | None = None
    fallback: DecodeChoice | None = None
    for inst in ctx.decode_pool:
        tbt = predicted_tbt_s(ctx, inst)
        if has_room(ctx, inst):
            if best is None or tbt < best.tbt_s:
                best = DecodeChoice(inst.spec.instance_id, tbt, tbt <= slo)
        elif fallback is None or tbt < fallback.tbt_s:
            fallback = DecodeChoice(inst.spec.instance_id, tbt, False)
    out = best or fallback
    assert out is not None
    return out


prefill_inst = st.tuples(
    st.sampled_from([0.0, 0.0, 0.05, 0.2, 1.0]),  # queued seconds (ties are common)
    st.sampled_from([None, None, 1e9, 5e10]),  # NIC bytes/s
    st.integers(0, 12),  # cached blocks
    st.sampled_from([Tier.GPU, Tier.DRAM, Tier.STORE]),
    st.integers(0, 12),  # blocks also held in the STORE tier (beyond the local ones)
)
decode_inst = st.tuples(
    st.integers(0, 5),  # running requests
    st.sampled_from([None, 2, 4]),  # max batch
    st.one_of(st.none(), st.integers(0, 120)),  # KV capacity (tokens; boundaries hit)
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(prefill_inst, min_size=1, max_size=6),
    st.lists(decode_inst, min_size=1, max_size=5),
    st.integers(0, 3),  # store nodes holding a prefix
    st.integers(1, 12),  # request blocks
    st.sampled_from([1.0, 1.5, 3.0]),
    st.booleans(),
)
def test_fast_loops_choose_like_the_formulas(
    prefills: list[tuple[float, float | None, int, Tier, int]],
    decodes: list[tuple[int, int | None, int | None]],
    store_blocks: int,
    n_blocks: int,
    threshold: float,
    roofline: bool,
) -> None:
    cost = preset("llama3-8b-h100") if roofline else LINEAR_COST
    c = make_conductor(0, 0, cost=cost, kvcache_balancing_threshold=threshold)
    for i, (queue_s, nic, blocks, tier, stored) in enumerate(prefills):
        iid = InstanceId(f"p{i}")
        c.add_instance(InstanceSpec(iid, Role.PREFILL, nic_bytes_per_s=nic))
        c.instances[iid].prefill.assign(RequestId(f"q{i}"), queue_s, 0, 0.0)
        if blocks:
            c.on_event(BlocksStored(iid, CHAIN[:blocks], tier))
        if stored:  # e.g. the sole holder of the best prefix, partly remote to itself
            c.on_event(BlocksStored(iid, CHAIN[:stored], Tier.STORE))
    for i, (running, batch, kv) in enumerate(decodes):
        iid = InstanceId(f"d{i}")
        c.add_instance(InstanceSpec(iid, Role.DECODE, kv_capacity_tokens=kv, max_batch_size=batch))
        for j in range(running):
            c.instances[iid].decode.admit(RequestId(f"x{i}-{j}"), 4 * (j + 1), 3)
    if store_blocks:
        c.add_store_node(InstanceId("store"))
        c.on_event(BlocksStored(InstanceId("store"), CHAIN[: 4 * store_blocks], Tier.STORE))
    r = req("r", CHAIN[:n_blocks], 4 * n_blocks - 1)
    ctx = c.context(r, 0.0)
    assert ctx is not None
    assert MooncakePolicy().choose_prefill(ctx) == _reference_prefill(ctx)
    assert least_tbt(ctx, _reference_prefill(ctx)) == _reference_decode(ctx)


def test_sole_holder_of_the_best_prefix_computes_locally() -> None:
    """p0 holds 2 blocks locally and 8 in the STORE tier: nobody else to fetch from, so its
    TTFT is the local one (32 ms), and the idle-ish p1 that fetches from p0 wins."""
    c = make_conductor(2, 1)
    c.on_event(BlocksStored(InstanceId("p0"), CHAIN[:2], Tier.GPU))
    c.on_event(BlocksStored(InstanceId("p0"), CHAIN[:8], Tier.STORE))
    c.instances[InstanceId("p1")].prefill.assign(RequestId("busy"), 0.01, 0, 0.0)
    ctx = c.context(req("r", CHAIN[:10], 40), 0.0)
    assert ctx is not None
    choice = MooncakePolicy().choose_prefill(ctx)
    assert choice == _reference_prefill(ctx)
    assert choice.instance == "p1" and choice.fetch_source == "p0" and choice.fetch_tokens == 32
