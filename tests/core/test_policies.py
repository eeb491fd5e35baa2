"""Baseline policies and decode selection on small hand-built clusters (exact choices)."""

from __future__ import annotations

import pytest

from conductor.core.errors import InvalidInput, UnknownInstance, UnknownPolicy
from conductor.core.events import BlocksStored, PrefillFinished, RequestFinished
from conductor.core.plan import Plan, Rejection
from conductor.core.policies import policy_names
from conductor.core.types import RequestId, Tier

from .helpers import hashes, iid, make_conductor, req

CHAIN = hashes(*range(1, 11))


def _plan(c, r) -> Plan:  # type: ignore[no-untyped-def]
    d = c.schedule(r, now_s=0.0)
    assert isinstance(d, Plan), d
    return d


def test_registry_names() -> None:
    assert {
        "random",
        "round_robin",
        "least_loaded",
        "cache_aware_local",
        "mooncake",
        "weighted",
    } <= set(policy_names())
    with pytest.raises(UnknownPolicy, match="unknown policy 'nope'"):
        make_conductor(1, 1, policy="nope")


def test_round_robin_cycles() -> None:
    c = make_conductor(3, 1, policy="round_robin")
    got = [_plan(c, req(f"r{i}", (), 8)).prefill for i in range(5)]
    assert got == ["p0", "p1", "p2", "p0", "p1"]


def test_random_is_seeded() -> None:
    a = make_conductor(4, 1, policy="random", seed=7)
    b = make_conductor(4, 1, policy="random", seed=7)
    ra = [_plan(a, req(f"r{i}", (), 8)).prefill for i in range(10)]
    rb = [_plan(b, req(f"r{i}", (), 8)).prefill for i in range(10)]
    assert ra == rb and len(set(ra)) > 1


def test_least_loaded_ignores_cache() -> None:
    c = make_conductor(2, 1, policy="least_loaded")
    c.on_event(BlocksStored(iid("p0"), CHAIN, Tier.GPU))
    _plan(c, req("warm", (), 100))  # p0 gets 100 ms queued (first of equal loads)
    plan = _plan(c, req("r", CHAIN, 40))
    assert plan.prefill == "p1" and plan.local_tokens == 0


def test_cache_aware_local_trades_queue_for_cache() -> None:
    c = make_conductor(2, 1, policy="cache_aware_local")
    c.on_event(BlocksStored(iid("p1"), CHAIN, Tier.GPU))
    plan = _plan(c, req("r", CHAIN, 40))
    assert plan.prefill == "p1" and plan.local_tokens == 39  # last token always computed
    assert plan.predicted_ttft_s == pytest.approx(0.001)
    # with p1 queued for 1 s, p0 (40 ms without cache) wins
    c.instances[iid("p1")].prefill.assign(RequestId("x"), 1.0, 0, 0.0)
    plan = _plan(c, req("r2", CHAIN, 40))
    assert plan.prefill == "p0" and plan.fetch is None


def test_weighted_score_and_overload_filter() -> None:
    c = make_conductor(2, 1, policy="weighted", ttft_slo_s=1.0)
    c.on_event(BlocksStored(iid("p0"), CHAIN, Tier.GPU))
    assert _plan(c, req("r1", CHAIN, 40)).prefill == "p0"  # cached 39/40 + idle
    # p0 now overloaded (queue >= SLO): filtered out even though it has the cache
    c.instances[iid("p0")].prefill.assign(RequestId("x"), 2.0, 0, 0.0)
    assert _plan(c, req("r2", CHAIN, 40)).prefill == "p1"


def test_decode_picks_lowest_predicted_tbt() -> None:
    c = make_conductor(1, 2, policy="round_robin")
    first = _plan(c, req("a", (), 8))
    second = _plan(c, req("b", (), 8))
    assert first.decode == "d0" and second.decode == "d1"
    # decode step = 10 ms + 1 ms/request: with one request each, adding one gives 12 ms
    assert second.predicted_tbt_s == pytest.approx(0.0165)
    c.on_event(RequestFinished(RequestId("a"), iid("d0"), 1.0))
    assert _plan(c, req("c", (), 8)).decode == "d0"


def test_early_admission_rejects_ttft_and_tbt() -> None:
    c = make_conductor(1, 1, admission="early", ttft_slo_s=0.05, tbt_slo_s=0.01725)
    assert isinstance(c.schedule(req("a", (), 40), 0.0), Plan)  # 40 ms TTFT
    r = c.schedule(req("b", (), 40), 0.0)  # 40 ms queue + 40 ms
    assert isinstance(r, Rejection) and r.code == "ttft_slo"
    assert r.predicted_ttft_s == pytest.approx(0.08)
    assert "predicted TTFT 0.080s > SLO 0.050s" in r.reason
    c2 = make_conductor(2, 1, admission="early", tbt_slo_s=0.01725)
    a = c2.schedule(req("a", (), 4), 0.0)  # TBT 11 ms
    assert isinstance(a, Plan)
    c2.on_event(PrefillFinished(a.request_id, a.prefill, 0.003))  # early counts it once running
    r2 = c2.schedule(req("b", (), 4), 0.003)  # 12 ms
    assert isinstance(r2, Rejection) and r2.code == "tbt_slo"


def test_kv_capacity_rejection() -> None:
    c = make_conductor(1, 1, admission="early", ttft_slo_s=100.0, output_prior_tokens=50_000)
    r = c.schedule(req("big", (), 60_000), 0.0)
    assert isinstance(r, Rejection) and r.code == "kv_capacity"


def test_admission_off_never_rejects() -> None:
    c = make_conductor(1, 1, ttft_slo_s=0.001)
    assert isinstance(c.schedule(req("a", (), 400), 0.0), Plan)
    assert isinstance(c.schedule(req("b", (), 400), 0.0), Plan)


def test_baseline_admission_checks_decode_at_prefill_end() -> None:
    c = make_conductor(2, 1, admission="baseline", tbt_slo_s=0.01725)
    a = _plan(c, req("a", (), 4))
    b = _plan(c, req("b", (), 4))  # accepted at arrival: decode not checked yet
    assert c.confirm_decode(a.request_id, 0.01) == "d0"
    r = c.confirm_decode(b.request_id, 0.01)
    assert isinstance(r, Rejection) and r.code == "tbt_slo"
    assert c.inflight() == 1


def test_bad_input_is_named() -> None:
    c = make_conductor(1, 1)
    with pytest.raises(InvalidInput, match="prompt_tokens=0"):
        c.schedule(req("a", (), 0), 0.0)
    with pytest.raises(InvalidInput, match="max_tokens=0"):
        c.schedule(req("a", (), 4, max_tokens=0), 0.0)
    with pytest.raises(InvalidInput, match="block_hashes=3"):
        c.schedule(req("a", hashes(1, 2, 3), 8), 0.0)
    with pytest.raises(UnknownInstance, match="unknown instance 'ghost'"):
        c.on_event(BlocksStored(iid("ghost"), hashes(1), Tier.GPU))
    with pytest.raises(InvalidInput, match="admission='sometimes'"):
        make_conductor(1, 1, admission="sometimes")
    _plan(c, req("dup", (), 4))
    with pytest.raises(InvalidInput, match="request_id='dup'"):
        c.schedule(req("dup", (), 4), 0.0)


def test_instance_loss_drops_blocks_and_requests() -> None:
    c = make_conductor(2, 1, policy="round_robin")
    c.on_event(BlocksStored(iid("p0"), CHAIN, Tier.GPU))
    plan = _plan(c, req("a", (), 8))
    assert plan.prefill == "p0"
    lost = c.remove_instance(iid("p0"))
    assert lost == [RequestId("a")]
    assert c.index.match(CHAIN).best_blocks == 0
    assert c.inflight() == 0
    assert c.instances[iid("d0")].decode.batch_size == 0
    assert _plan(c, req("b", CHAIN, 40)).prefill == "p1"


def test_no_instance_rejection() -> None:
    c = make_conductor(1, 1)
    c.set_health(iid("d0"), healthy=False)
    r = c.schedule(req("a", (), 4), 0.0)
    assert isinstance(r, Rejection) and r.code == "no_instance"


def test_tbt_factor_models_the_long_first_interval() -> None:
    from conductor.core.policies.decode import tbt_factor

    assert tbt_factor(2) == 1.5  # one interval: the first, 1.5 steps
    assert tbt_factor(11) == 1.5  # 10 intervals: k = 1
    assert tbt_factor(21) == 1.25  # k = 2
    assert tbt_factor(1001) == pytest.approx(1.005)  # k = 100


def test_decode_prefers_the_prefill_rack_when_it_meets_the_slo() -> None:
    from conductor.core.config import SchedulerConfig
    from conductor.core.scheduler import Scheduler
    from conductor.core.state import InstanceSpec
    from conductor.core.types import Role

    from .helpers import LINEAR_COST

    c = Scheduler(
        LINEAR_COST,
        policy="round_robin",
        config=SchedulerConfig(block_size_tokens=4, output_prior_tokens=10),
    )
    c.add_instance(InstanceSpec(iid("p0"), Role.PREFILL, rack="A"))
    c.add_instance(InstanceSpec(iid("dB"), Role.DECODE, rack="B"))
    c.add_instance(InstanceSpec(iid("dA"), Role.DECODE, rack="A"))
    # dA holds one request (12 ms x 1.5 = 18 ms), dB none (16.5 ms): dB is faster, but dA
    # is in p0's rack and within the 100 ms SLO
    c.instances[iid("dA")].decode.admit(RequestId("x"), 4, 10)
    plan = _plan(c, req("r", (), 8))
    assert plan.decode == "dA"
    assert plan.predicted_tbt_s == pytest.approx(0.012 * 1.5)
    # outside the SLO the faster remote one wins
    tight = Scheduler(
        LINEAR_COST,
        policy="round_robin",
        config=SchedulerConfig(block_size_tokens=4, tbt_slo_s=0.017, output_prior_tokens=10),
    )
    for spec in c.instances.values():
        tight.add_instance(spec.spec)
    tight.instances[iid("dA")].decode.admit(RequestId("x"), 4, 10)
    assert _plan(tight, req("r", (), 8)).decode == "dB"
