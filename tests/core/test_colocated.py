"""``role=both`` instances: a prompt prefilled there stalls the requests decoding there
(``conductor.core.policies.colocated``), and ``conductor`` places by what that costs, each
delay over its SLO (TTFT 30 s, TBT 100 ms).

Cost model (helpers): prefill 1 ms per new token (one pass, ``prefill_s(1, 0)``, 1 ms),
decode step 10 ms + 1 ms per request, block 4 tokens; requests are predicted to generate 10
tokens, so TBT averages the single longest interval (``k = 1``) and the first-interval
factor is 1.5.
"""

from __future__ import annotations

import pytest

from conductor.core.config import SchedulerConfig
from conductor.core.events import BlocksStored
from conductor.core.plan import Plan
from conductor.core.policies.colocated import ColocatedDecode, all_colocated
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceSpec
from conductor.core.types import RequestId, Role, Tier

from .helpers import LINEAR_COST, hashes, iid, req

PROMPT = hashes(*range(1, 101))  # 100 blocks, 400 tokens


def _cluster(
    *roles: tuple[str, Role], policy: str = "conductor", params: dict[str, float] | None = None
) -> Scheduler:
    """Instances that cannot pull KV from each other (as behind the gateway)."""
    config = SchedulerConfig(
        block_size_tokens=4, output_prior_tokens=10, policy_params=params or {}
    )
    c = Scheduler(LINEAR_COST, policy=policy, config=config)
    for name, role in roles:
        c.add_instance(InstanceSpec(iid(name), role, pulls_kv=False))
    c.decode_policy = ColocatedDecode(c.decode_policy)  # as the simulator and the gateway
    return c


def _busy(c: Scheduler, name: str, decoding: int, stall_at: float, stall_s: float) -> None:
    """``decoding`` one-token requests decode on ``name``; a prefill stalled it at
    ``stall_at`` for ``stall_s``."""
    d = c.instances[iid(name)].decode
    for i in range(decoding):
        d.admit(RequestId(f"{name}-x{i}"), 1, 0, started=True)
    d.record_join(stall_at, stall_s)


def _place(c: Scheduler, rid: str, now: float = 1.0) -> Plan:
    plan = c.schedule(req(rid, PROMPT, 400), now)
    assert isinstance(plan, Plan), plan
    return plan


def test_a_prefill_placed_on_a_both_instance_is_recorded_as_a_stall_of_its_decodes() -> None:
    """400 new tokens: 400 ms of prefill, 399 ms beyond the pass the decodes run anyway.
    The two idle instances cost the same (0.4 s / 30 s + 16.5 ms / 100 ms); the first in
    pool order is taken."""
    c = _cluster(("b0", Role.BOTH), ("b1", Role.BOTH))
    plan = _place(c, "r1")
    assert (plan.prefill, plan.decode) == (iid("b0"), iid("b0"))
    assert c.instances[iid("b0")].decode.joins == [(1.0, pytest.approx(0.399))]
    assert c.instances[iid("b1")].decode.joins == []
    # its TBT there: a step of 1 request (11 ms) x 1.5; no stall before it
    assert plan.predicted_tbt_s == pytest.approx(0.0165)


def test_the_prefix_holder_loses_when_its_decodes_would_pay_for_the_prefill() -> None:
    """b0 holds half the prompt (200 ms of prefill left, against 400 ms on b1) but runs 5
    decodes and was stalled 0.5 s at t=0.9, within the new request's 10 x 16 ms decode.
    Cost on b0: TTFT 0.2 s / 30 s, plus (TBT 24 ms + 0.5 s stall + 5 x 199 ms added to its
    decodes' TBT) / 100 ms less the 0.9 that costs nothing = 14.297; on b1: 0.4 / 30 (its
    16.5 ms TBT is inside 90 ms) = 0.013: b1, with the TBT it predicts there. Placed by TTFT
    alone (another policy, or a pool that is not all `both`) it would go to b0."""
    c = _cluster(("b0", Role.BOTH), ("b1", Role.BOTH))
    c.on_event(BlocksStored(iid("b0"), PROMPT[:50], Tier.GPU))
    _busy(c, "b0", 5, 0.9, 0.5)
    plan = _place(c, "r1")
    assert (plan.prefill, plan.decode) == (iid("b1"), iid("b1"))
    assert plan.predicted_tbt_s == pytest.approx(0.0165)
    assert plan.predicted_ttft_s == pytest.approx(0.4)

    m = _cluster(("b0", Role.BOTH), ("b1", Role.BOTH), policy="mooncake")
    m.on_event(BlocksStored(iid("b0"), PROMPT[:50], Tier.GPU))
    _busy(m, "b0", 5, 0.9, 0.5)
    plan = _place(m, "r1")
    assert (plan.prefill, plan.decode) == (iid("b0"), iid("b0"))
    # the stalls are in its TBT there: (16 ms x 1.5) + 0.5 s
    assert plan.predicted_tbt_s == pytest.approx(0.524)


def test_a_stall_outside_the_request_s_decode_does_not_count() -> None:
    """The same, stalled at t=0.5: outside the 0.16 s the request would decode on b0.
    Cost on b0: 0.2 / 30 + (24 ms + 5 x 199 ms) / 100 ms - 0.9 = 9.297, still above b1's
    0.013; with one decode there instead of five, 0.2 / 30 + (18 ms + 199 ms) / 100 ms -
    0.9 = 1.277: b1 still (its 199 ms stall is one request's whole TBT); with nobody
    decoding there, 0.2 / 30 (16.5 ms is inside 90 ms) against 0.4 / 30: b0, the
    half-cached one."""
    for held, decoding, want in ((50, 5, "b1"), (50, 1, "b1"), (50, 0, "b0")):
        c = _cluster(("b0", Role.BOTH), ("b1", Role.BOTH))
        c.on_event(BlocksStored(iid("b0"), PROMPT[:held], Tier.GPU))
        _busy(c, "b0", decoding, 0.5, 0.5)
        plan = _place(c, "r1")
        assert plan.prefill == iid(want), (held, decoding)


def test_tbt_inside_ninety_percent_of_its_slo_costs_nothing() -> None:
    """b0 holds 90 of the 100 blocks (40 ms of prefill left, a 39 ms stall) and runs
    ``decoding`` requests; b1 is idle (0.4 s, 16.5 ms). One decode on b0: its TBT 18 ms +
    1 x 39 ms = 57 ms, inside 90 ms: cost 0.04 / 30 against b1's 0.4 / 30: b0, the holder.
    Two: 19.5 ms + 2 x 39 ms = 97.5 ms: 0.075 more, b1. With the margin 1 (the linear key
    counting every millisecond) one decode already sends it to b1 (0.571 against 0.178)."""
    cases = ((1, None, "b0"), (2, None, "b1"), (1, {"colocated_tbt_margin": 1.0}, "b1"))
    for decoding, params, want in cases:
        c = _cluster(("b0", Role.BOTH), ("b1", Role.BOTH), params=params)
        c.on_event(BlocksStored(iid("b0"), PROMPT[:90], Tier.GPU))
        _busy(c, "b0", decoding, 0.5, 0.0)
        plan = _place(c, "r1")
        assert plan.prefill == iid(want), (decoding, params)


def test_in_a_mixed_pool_a_both_instance_over_the_tbt_slo_goes_last() -> None:
    """p0 prefills only; b0 holds the whole prompt but its decodes, stalled 0.5 s lately,
    would miss the 100 ms TBT SLO: p0, though b0's TTFT is lower. Not stalled: b0."""
    for stall_s, want in ((0.5, "p0"), (0.0, "b0")):
        c = _cluster(("p0", Role.PREFILL), ("b0", Role.BOTH), ("d0", Role.DECODE))
        c.on_event(BlocksStored(iid("b0"), PROMPT, Tier.GPU))
        _busy(c, "b0", 1, 0.95, stall_s)
        plan = _place(c, "r1")
        assert plan.prefill == iid(want), stall_s


def test_all_colocated() -> None:
    c = _cluster(("b0", Role.BOTH), ("p0", Role.PREFILL))
    both, prefill = c.instances[iid("b0")], c.instances[iid("p0")]
    assert all_colocated([both]) and not all_colocated([both, prefill])
    assert not all_colocated([])
