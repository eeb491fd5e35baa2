"""The ``conductor`` policy: min over (local, fetch) per instance, exact choices.

Cost model (helpers): prefill 1 ms per new token, transfer 10 us per token, block 4 tokens.
"""

from __future__ import annotations

import pytest

from conductor.core.config import SchedulerConfig
from conductor.core.events import BlocksStored
from conductor.core.plan import Plan
from conductor.core.policies import policy_config_defaults
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceSpec
from conductor.core.types import RequestId, Role, Tier

from .helpers import LINEAR_COST, hashes, iid, make_conductor, req

CHAIN = hashes(*range(1, 11))  # 40 tokens


def _plan(c, r) -> Plan:  # type: ignore[no-untyped-def]
    d = c.schedule(r, now_s=0.0)
    assert isinstance(d, Plan), d
    return d


def test_fetches_when_the_holder_is_busy() -> None:
    c = make_conductor(2, 1, policy="conductor")
    c.on_event(BlocksStored(iid("p0"), CHAIN[:8], Tier.DRAM))
    c.instances[iid("p0")].prefill.assign(RequestId("x"), 1.0, 0, 0.0)
    plan = _plan(c, req("r", CHAIN, 40))
    assert plan.prefill == "p1" and plan.fetch is not None and plan.fetch.tokens == 32
    assert plan.predicted_ttft_s == pytest.approx(32 * 10e-6 + 0.008)


def test_computes_locally_when_the_fetch_is_slower_than_recomputing() -> None:
    """A 1000x slower NIC on p1: fetching 32 tokens costs 320 ms, recomputing them 32 ms.
    mooncake's threshold rule would fetch (local prefix 0 -> infinite ratio)."""
    slow = LINEAR_COST.with_(transfer_bytes_per_s=327680 * 100)  # 10 ms per token
    for policy, fetch in (("conductor", False), ("mooncake", True)):
        c = make_conductor(2, 1, policy=policy, cost=slow)
        c.on_event(BlocksStored(iid("p0"), CHAIN[:8], Tier.DRAM))
        c.instances[iid("p0")].prefill.assign(RequestId("x"), 1.0, 0, 0.0)
        plan = _plan(c, req("r", CHAIN, 40))
        assert plan.prefill == "p1"
        assert (plan.fetch is not None) is fetch
    assert plan.predicted_ttft_s == pytest.approx(32 * 0.01 + 0.008)  # mooncake's worse pick


def test_ties_go_to_the_less_queued_instance() -> None:
    c = make_conductor(3, 1, policy="conductor")
    # p0 has 10 ms queued and the 10-token prefix (saves 10 ms); p1, p2 idle without it
    c.on_event(BlocksStored(iid("p0"), CHAIN[:2], Tier.DRAM))
    c.instances[iid("p0")].prefill.assign(RequestId("x"), 0.008, 0, 0.0)
    c.instances[iid("p2")].prefill.assign(RequestId("y"), 0.0, 5, 0.0)  # 0 s, 5 tokens
    plan = _plan(c, req("r", (), 40))
    assert plan.prefill == "p1"  # p0: 8 ms queued; p1 vs p2: same TTFT, p1 fewer tokens


def _ended(c, name: str, at: float) -> None:  # type: ignore[no-untyped-def]
    state = c.instances[iid(name)].prefill
    state.assign(RequestId(f"done-{name}"), 1.0, 4, at - 1.0)
    state.finish(RequestId(f"done-{name}"), at)


def test_idle_ties_go_to_the_emptier_cache_then_the_longest_idle() -> None:
    """A prompt no instance holds, every instance idle: it goes where the fewest blocks are
    cached (a new prefix group does not pile onto the first instance of the pool), and
    between equally full caches to the instance idle the longest (its last prefill ended
    first)."""
    c = make_conductor(3, 1, policy="conductor")
    c.on_event(BlocksStored(iid("p0"), hashes(100, 101), Tier.DRAM))
    c.on_event(BlocksStored(iid("p1"), hashes(200), Tier.DRAM))
    c.on_event(BlocksStored(iid("p2"), hashes(300), Tier.DRAM))
    _ended(c, "p1", 5.0)
    _ended(c, "p2", 3.0)
    plan = c.schedule(req("r", hashes(7, 8), 8), now_s=10.0)
    assert isinstance(plan, Plan) and plan.prefill == "p2"  # p0 holds 2; p2 idle since 3 s
    c = make_conductor(2, 1, policy="conductor")
    c.on_event(BlocksStored(iid("p1"), hashes(200), Tier.DRAM))
    _ended(c, "p0", 9.0)
    _ended(c, "p1", 1.0)
    plan = c.schedule(req("s", hashes(9), 4), now_s=10.0)
    assert isinstance(plan, Plan) and plan.prefill == "p0"  # the emptier cache first


def _no_fetch(work_price: float | None = None) -> Scheduler:
    """Four prefill instances that reuse only their own caches (as behind a gateway)."""
    params = {} if work_price is None else {"work_price": work_price}
    config = SchedulerConfig(block_size_tokens=4, output_prior_tokens=10, policy_params=params)
    c = Scheduler(LINEAR_COST, policy="conductor", config=config)
    for i in range(4):
        c.add_instance(InstanceSpec(iid(f"p{i}"), Role.PREFILL, pulls_kv=False))
    c.add_instance(InstanceSpec(iid("d0"), Role.DECODE))
    c.on_event(BlocksStored(iid("p0"), CHAIN[:8], Tier.DRAM))  # 32 of the prompt's 40 tokens
    c.instances[iid("p0")].prefill.assign(RequestId("x"), 0.050, 0, 0.0)
    return c


def test_recomputing_a_held_prefix_is_priced_by_the_pool_s_load() -> None:
    """p0 holds 32 of 40 tokens but is busy for 50 ms: 58 ms there, 40 ms recomputing on an
    idle instance. With p0 the only busy one the recompute costs 40 + 0.5 x 1/3 x 32 =
    45.3 ms and wins; with p2 and p3 busy too, 40 + 0.5 x 3/1 x 32 = 88 ms: it waits for
    p0. Without the price (``work_price`` 0) it recomputes either way."""
    for price, others_busy, chosen, ttft in (
        (None, False, "p1", 0.040),
        (None, True, "p0", 0.058),
        (0.0, True, "p1", 0.040),
    ):
        c = _no_fetch(price)
        if others_busy:
            for name in ("p2", "p3"):
                c.instances[iid(name)].prefill.assign(RequestId(f"y{name}"), 0.060, 0, 0.0)
        plan = _plan(c, req("r", CHAIN, 40))
        assert (plan.prefill, plan.fetch) == (chosen, None)
        assert plan.predicted_ttft_s == pytest.approx(ttft)  # the price is not in the TTFT


def test_conductor_brings_admission_and_cpp() -> None:
    assert policy_config_defaults("conductor") == {"admission": "early", "cpp_enabled": True}
    assert policy_config_defaults("mooncake") == {}


def test_decode_and_prefill_both_role() -> None:
    c = make_conductor(0, 0, policy="conductor")
    c.add_instance(InstanceSpec(iid("both"), Role.BOTH))
    plan = _plan(c, req("r", CHAIN, 40))
    assert (plan.prefill, plan.decode) == ("both", "both")
