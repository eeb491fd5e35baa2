"""Peer-router baselines (dynamo, sglang, lmetric, llmd, preble) on hand-built clusters:
exact choices against each published formula, with the arithmetic in the comments.

Cost model from helpers: prefill = 1 ms per new token, decode step = 10 ms + 1 ms per
request, KV capacity 100 000 tokens; block size 4 tokens.
"""

from __future__ import annotations

import math
import random

import pytest

from conductor.core.config import SchedulerConfig
from conductor.core.errors import InvalidInput
from conductor.core.events import BlocksStored
from conductor.core.plan import Plan
from conductor.core.policies import SchedulingContext, dynamo, llmd, policy_names
from conductor.core.policies.decode import LeastTbtDecode
from conductor.core.policies.preble import PreblePolicy
from conductor.core.policies.selection import argmin_index, softmax_index, softmax_weights
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceSpec
from conductor.core.types import BlockHash, InstanceId, Request, RequestId, Role, Tier

from .helpers import LINEAR_COST, hashes, iid, make_conductor, req

CHAIN = hashes(*range(1, 11))  # 10 blocks = 40 tokens


def _plan(c: Scheduler, r: Request, now_s: float = 0.0) -> Plan:
    d = c.schedule(r, now_s=now_s)
    assert isinstance(d, Plan), d
    return d


def _cluster(policy: str, roles: dict[str, Role], **cfg: object) -> Scheduler:
    cfg.setdefault("output_prior_tokens", 10)  # requests are predicted to generate 10 tokens
    config = SchedulerConfig(block_size_tokens=4, **cfg)  # type: ignore[arg-type]
    c = Scheduler(LINEAR_COST, policy=policy, config=config)
    for name, role in roles.items():
        c.add_instance(InstanceSpec(InstanceId(name), role))
    return c


def _store(c: Scheduler, inst: str, blocks: tuple[BlockHash, ...], tier: Tier) -> None:
    c.on_event(BlocksStored(iid(inst), blocks, tier))


def _queue(c: Scheduler, inst: str, tokens: int, n: int = 1) -> None:
    """``n`` unfinished prefills of ``tokens`` uncached tokens each on ``inst``."""
    p = c.instances[iid(inst)].prefill
    for k in range(n):
        p.assign(RequestId(f"q-{inst}-{p.queued_requests}-{k}"), 0.0, tokens, 0.0)


def _decoding(c: Scheduler, inst: str, tokens: int, n: int = 1, output: int = 0) -> None:
    """``n`` requests of ``tokens`` context each in ``inst``'s decode batch."""
    d = c.instances[iid(inst)].decode
    for k in range(n):
        d.admit(RequestId(f"d-{inst}-{d.batch_size}-{k}"), tokens, output)


def _ctx(c: Scheduler, r: Request) -> SchedulingContext:
    ctx = c.context(r, 0.0)
    assert ctx is not None
    return ctx


def test_peer_policies_are_registered() -> None:
    assert {"dynamo", "sglang", "lmetric", "llmd", "preble"} <= set(policy_names())


# -- Scheduler: a policy may bring its own decode policy ---------------------------------


def test_conductor_uses_a_policys_own_decode_only_when_it_has_one() -> None:
    assert isinstance(make_conductor(1, 1).decode_policy, LeastTbtDecode)
    for name in ("sglang", "lmetric", "llmd", "preble"):
        assert isinstance(make_conductor(1, 1, policy=name).decode_policy, LeastTbtDecode)
    c = make_conductor(1, 1, policy="dynamo")
    own: object = c.decode_policy
    assert own is c.policy
    explicit = LeastTbtDecode()
    c2 = Scheduler(LINEAR_COST, policy="dynamo", decode_policy=explicit)
    assert c2.decode_policy is explicit


# -- dynamo ------------------------------------------------------------------------------


def test_dynamo_docs_worked_example() -> None:
    # Dynamo's docs: W1 8+10=18, W2 5+5=10, W3 2+9=11 -> W2. Aggregated workers (Role.BOTH);
    # request 16 tokens, R = 4 blocks; cost = max(0, queued/4 + R - credit) + (ctx/4 + R).
    c = _cluster("dynamo", {"w1": Role.BOTH, "w2": Role.BOTH, "w3": Role.BOTH})
    _queue(c, "w1", 16)  # W1: 16/4 + 4 - 0 = 8;   decode 24/4 + 4 = 10 -> 18
    _decoding(c, "w1", 24)
    _queue(c, "w2", 4)  # W2:  4/4 + 4 - 0 = 5;   decode  4/4 + 4 =  5 -> 10
    _decoding(c, "w2", 4)
    _store(c, "w3", CHAIN[:2], Tier.GPU)  # W3: 0 + 4 - 2 = 2; decode 20/4 + 4 = 9 -> 11
    _decoding(c, "w3", 20)
    r = req("r", CHAIN[:4], 16)
    ctx = _ctx(c, r)
    assert [dynamo.prefill_cost(ctx, i) for i in ctx.prefill_pool] == [18.0, 10.0, 11.0]
    plan = _plan(c, r)
    assert plan.prefill == "w2"
    assert plan.decode == "w2"  # an aggregated worker keeps its request's decode


def test_dynamo_tier_credit_device_1_host_075() -> None:
    # Disaggregated: pure prefill instances have decode term 0. Request 40 tokens, R = 10.
    # p0: DRAM blocks 1-8 -> credit 0.75*8 = 6 -> cost 10 - 6 = 4
    # p1: GPU blocks 1-5  -> credit 5          -> cost 10 - 5 = 5      => p0
    roles = {"p0": Role.PREFILL, "p1": Role.PREFILL, "d0": Role.DECODE}
    c = _cluster("dynamo", roles)
    _store(c, "p0", CHAIN[:8], Tier.DRAM)
    _store(c, "p1", CHAIN[:5], Tier.GPU)
    r = req("r", CHAIN, 40)
    assert [dynamo.prefill_cost(_ctx(c, r), i) for i in c.pools()[0]] == [4.0, 5.0]
    plan = _plan(c, r)
    assert plan.prefill == "p0" and plan.local_tokens == 32
    # host_cache_hit_weight 0.5: p0 = 10 - 4 = 6 > p1 = 5 => p1
    c2 = _cluster("dynamo", roles, policy_params={"host_cache_hit_weight": 0.5})
    _store(c2, "p0", CHAIN[:8], Tier.DRAM)
    _store(c2, "p1", CHAIN[:5], Tier.GPU)
    assert _plan(c2, r).prefill == "p1"


def test_dynamo_mixed_tiers_clamp_scale_and_request_weight() -> None:
    roles = {"p0": Role.PREFILL, "p1": Role.PREFILL, "d0": Role.DECODE}
    c = _cluster(
        "dynamo",
        roles,
        policy_params={"prefill_load_scale": 2.0, "decode_active_request_weight": 0.5},
    )
    # p0: GPU 1-4 + DRAM 5-10: credit 4 + 0.75*6 = 8.5; queued 8 tokens (2 requests of 4):
    #     2 * max(0, 8/4 + 10 - 8.5) + 0.5 * 2 requests = 2 * 3.5 + 1 = 8
    _store(c, "p0", CHAIN[:4], Tier.GPU)
    _store(c, "p0", CHAIN[4:], Tier.DRAM)
    _queue(c, "p0", 4, n=2)
    # p1: GPU 1-10, credit 10 > raw 10: clamped to 0 -> cost 0   => p1
    _store(c, "p1", CHAIN, Tier.GPU)
    r = req("r", CHAIN, 40)
    assert [dynamo.prefill_cost(_ctx(c, r), i) for i in c.pools()[0]] == [8.0, 0.0]
    assert _plan(c, r).prefill == "p1"


def test_dynamo_decode_is_load_only_fewest_blocks() -> None:
    roles = {"p0": Role.PREFILL, "d0": Role.DECODE, "d1": Role.DECODE}
    # d0: 1 request, 40 context tokens -> 10 + R(10) = 20 blocks; TBT step(2) = 12 ms
    # d1: 2 requests, 4 tokens each    ->  2 + 10    = 12 blocks; TBT step(3) = 13 ms
    c = _cluster("dynamo", roles)
    _decoding(c, "d0", 40)
    _decoding(c, "d1", 4, n=2)
    plan = _plan(c, req("r", CHAIN, 40))
    assert plan.decode == "d1"  # dynamo: fewest active blocks
    # 13 ms step x 1.5 for the long first interval (10 output tokens: k = 1)
    assert plan.predicted_tbt_s == pytest.approx(0.013 * 1.5)
    # the default decode policy would pick by predicted TBT instead: d0
    c2 = Scheduler(LINEAR_COST, policy="dynamo", config=c.config, decode_policy=LeastTbtDecode())
    for name, role in roles.items():
        c2.add_instance(InstanceSpec(InstanceId(name), role))
    _decoding(c2, "d0", 40)
    _decoding(c2, "d1", 4, n=2)
    assert _plan(c2, req("r", CHAIN, 40)).decode == "d0"


def test_dynamo_decode_skips_instances_without_kv_room() -> None:
    c = _cluster("dynamo", {"p0": Role.PREFILL, "d0": Role.DECODE, "d1": Role.DECODE})
    _decoding(c, "d0", 10, output=99_990)  # 2.5 blocks but KV full (100 000 reserved)
    _decoding(c, "d1", 40)  # 10 blocks, room left
    assert _plan(c, req("r", CHAIN, 40)).decode == "d1"


def test_dynamo_ties_break_by_seeded_rng() -> None:
    # Three idle prefill instances, no cache: all cost 10 -> a uniform draw among them.
    def first_choice(seed: int) -> str:
        c = make_conductor(3, 1, policy="dynamo", seed=seed)
        return _plan(c, req("r", CHAIN, 40)).prefill

    picks = [first_choice(s) for s in range(12)]
    assert picks == [first_choice(s) for s in range(12)]  # same seed, same choice
    assert len(set(picks)) > 1  # the tie really is broken at random
    assert argmin_index([3.0, 1.0, 1.0, 2.0]) == 1  # without an rng: the first of the tied
    rng = random.Random(0)
    assert {argmin_index([1.0, 5.0, 1.0], random.Random(s)) for s in range(8)} == {0, 2}
    assert argmin_index([2.0, 1.0], rng) == 1 and rng.random() == random.Random(0).random()


def test_dynamo_softmax_weights_arithmetic() -> None:
    # costs 18, 10, 11 with T = 1: p ∝ exp(-(c - 10) / 8) = e^-1, 1, e^-0.125
    w = softmax_weights([18.0, 10.0, 11.0], 1.0)
    z = math.exp(-1) + 1 + math.exp(-0.125)
    assert w == pytest.approx([math.exp(-1) / z, 1 / z, math.exp(-0.125) / z])
    assert w == pytest.approx([0.16347, 0.44437, 0.39216], abs=1e-5)
    assert softmax_weights([5.0, 5.0], 0.3) == [0.5, 0.5]

    # inverse CDF: u = 0.5 falls in (0.1635, 0.6078] -> index 1
    class _U(random.Random):
        def random(self) -> float:
            return 0.5

    assert softmax_index([18.0, 10.0, 11.0], 1.0, _U()) == 1


def _worked_example(seed: int, temperature: float) -> Scheduler:
    c = _cluster(
        "dynamo",
        {"w1": Role.BOTH, "w2": Role.BOTH, "w3": Role.BOTH},
        seed=seed,
        policy_params={"router_temperature": temperature},
    )
    _queue(c, "w1", 16)
    _decoding(c, "w1", 24)
    _queue(c, "w2", 4)
    _decoding(c, "w2", 4)
    _store(c, "w3", CHAIN[:2], Tier.GPU)
    _decoding(c, "w3", 20)
    return c


def test_dynamo_temperature_sampling_is_seeded() -> None:
    # Costs 18, 10, 11 -> p = 0.1635, 0.4444, 0.3922; CDF 0.1635, 0.6078, 1.0.
    # The first draw of random.Random(seed): seed 0 -> 0.844 (w3), 1 -> 0.134 (w1),
    # 3 -> 0.238 (w2). The aggregated decode draws nothing, so these are the only draws.
    expected = {0: "w3", 1: "w1", 3: "w2"}
    for seed, inst in expected.items():
        assert _plan(_worked_example(seed, 1.0), req("r", CHAIN[:4], 16)).prefill == inst
        assert _plan(_worked_example(seed, 1.0), req("r", CHAIN[:4], 16)).prefill == inst
    # a vanishing temperature is the argmin whatever the seed
    for seed in range(5):
        assert _plan(_worked_example(seed, 1e-9), req("r", CHAIN[:4], 16)).prefill == "w2"
    with pytest.raises(InvalidInput, match="router_temperature"):
        _worked_example(0, -1.0).schedule(req("r", CHAIN[:4], 16), 0.0)


# -- sglang --------------------------------------------------------------------------------


def test_sglang_cache_hit_above_threshold_beats_load() -> None:
    c = make_conductor(2, 1, policy="sglang")
    _store(c, "p1", CHAIN[:4], Tier.GPU)  # 16/40 = 0.4 > 0.3
    _queue(c, "p1", 100)  # loads 0, 1: balanced (1 - 0 <= 64)
    assert _plan(c, req("r", CHAIN, 40)).prefill == "p1"


def test_sglang_match_at_threshold_goes_to_min_load() -> None:
    c = make_conductor(2, 1, policy="sglang")
    _store(c, "p1", CHAIN[:3], Tier.GPU)  # 12/40 = 0.3, not > 0.3
    _queue(c, "p1", 100)
    assert _plan(c, req("r", CHAIN, 40)).prefill == "p0"


def test_sglang_imbalance_switch_both_ways() -> None:
    # p1 holds 32/40 = 0.8 of the prompt.
    # loads 5, 70: 70 - 5 = 65 > 64 and 70 > 1.5 * 5 = 7.5 -> imbalanced -> min load p0
    c = make_conductor(2, 1, policy="sglang")
    _store(c, "p1", CHAIN[:8], Tier.GPU)
    _queue(c, "p0", 1, n=5)
    _queue(c, "p1", 1, n=70)
    assert _plan(c, req("r", CHAIN, 40)).prefill == "p0"
    # loads 130, 195: 65 > 64 but 195 > 1.5 * 130 = 195 is false -> balanced -> cache p1
    c2 = make_conductor(2, 1, policy="sglang")
    _store(c2, "p1", CHAIN[:8], Tier.GPU)
    _queue(c2, "p0", 1, n=130)
    _queue(c2, "p1", 1, n=195)
    assert _plan(c2, req("r", CHAIN, 40)).prefill == "p1"
    # loads 10, 74: 64 > 64 is false -> balanced -> cache p1
    c3 = make_conductor(2, 1, policy="sglang")
    _store(c3, "p1", CHAIN[:8], Tier.GPU)
    _queue(c3, "p0", 1, n=10)
    _queue(c3, "p1", 1, n=74)
    assert _plan(c3, req("r", CHAIN, 40)).prefill == "p1"


def test_sglang_load_counts_decode_batch_and_params() -> None:
    # Aggregated workers: load = queued prefills + decode batch. w0: 0 + 3; w1: 1 + 0.
    c = _cluster(
        "sglang",
        {"w0": Role.BOTH, "w1": Role.BOTH},
        policy_params={"balance_abs_threshold": 1.0, "balance_rel_threshold": 2.0},
    )
    _store(c, "w0", CHAIN[:8], Tier.GPU)
    _decoding(c, "w0", 4, n=3)
    _queue(c, "w1", 4)
    # 3 - 1 = 2 > 1 and 3 > 2 * 1 -> imbalanced -> w1, despite w0's 0.8 match
    assert _plan(c, req("r", CHAIN, 40)).prefill == "w1"


def test_sglang_ties_among_holders_go_to_lower_load() -> None:
    c = make_conductor(3, 1, policy="sglang")
    for p in ("p0", "p1", "p2"):
        _store(c, p, CHAIN[:8], Tier.GPU)
    _queue(c, "p0", 1, n=3)
    _queue(c, "p1", 1, n=1)
    _queue(c, "p2", 1, n=2)
    assert _plan(c, req("r", CHAIN, 40)).prefill == "p1"


# -- lmetric -------------------------------------------------------------------------------


def test_lmetric_multiplies_new_tokens_by_load_plus_one() -> None:
    # p0: no cache, idle: 40 * (0 + 1) = 40
    # p1: 32 cached -> 8 new, 3 in flight: 8 * (3 + 1) = 32            => p1
    c = make_conductor(2, 1, policy="lmetric")
    _store(c, "p1", CHAIN[:8], Tier.GPU)
    _queue(c, "p1", 1, n=3)
    assert _plan(c, req("r", CHAIN, 40)).prefill == "p1"
    # with 4 in flight: 8 * 5 = 40 ties p0's 40 -> lower load wins -> p0
    c2 = make_conductor(2, 1, policy="lmetric")
    _store(c2, "p1", CHAIN[:8], Tier.GPU)
    _queue(c2, "p1", 1, n=4)
    assert _plan(c2, req("r", CHAIN, 40)).prefill == "p0"


def test_lmetric_counts_decode_batch_and_full_hits_keep_one_token() -> None:
    # w0: full hit -> 39 cached, 1 new (last token computed), 9 decoding: 1 * 10 = 10
    # w1: no cache, idle: 40 * 1 = 40                                   => w0
    c = _cluster("lmetric", {"w0": Role.BOTH, "w1": Role.BOTH})
    _store(c, "w0", CHAIN, Tier.GPU)
    _decoding(c, "w0", 4, n=9)
    assert _plan(c, req("r", CHAIN, 40)).prefill == "w0"
    # 40 decoding: 1 * 41 = 41 > 40 -> w1
    c2 = _cluster("lmetric", {"w0": Role.BOTH, "w1": Role.BOTH})
    _store(c2, "w0", CHAIN, Tier.GPU)
    _decoding(c2, "w0", 4, n=40)
    assert _plan(c2, req("r", CHAIN, 40)).prefill == "w1"


# -- llmd ----------------------------------------------------------------------------------


def _llmd_cluster(params: dict[str, float] | None = None) -> Scheduler:
    c = make_conductor(3, 1, policy="llmd", policy_params=params or {})
    _queue(c, "p1", 10_000, n=2)  # q = 2, KV use 20 000 / 100 000 = 0.2
    _queue(c, "p2", 5_000, n=4)  # q = 4, KV use 20 000 / 100 000 = 0.2
    _store(c, "p1", CHAIN[:5], Tier.GPU)  # 5/10 blocks
    _store(c, "p2", CHAIN, Tier.DRAM)  # 10/10 blocks
    return c


def test_llmd_scorer_arithmetic() -> None:
    # queue: (4 - q) / (4 - 0) = 1, 0.5, 0;  kv: 1 - use = 1, 0.8, 0.8;  prefix: 0, 0.5, 1
    # p0 = 2*1   + 2*1   + 3*0   = 4.0
    # p1 = 2*0.5 + 2*0.8 + 3*0.5 = 4.1
    # p2 = 2*0   + 2*0.8 + 3*1   = 4.6                                   => p2
    c = _llmd_cluster()
    r = req("r", CHAIN, 40)
    assert llmd.scores(_ctx(c, r)) == pytest.approx([4.0, 4.1, 4.6])
    assert _plan(c, r).prefill == "p2"


def test_llmd_weights_are_parameters() -> None:
    # prefix weight 1: p0 = 4.0, p1 = 1 + 1.6 + 0.5 = 3.1, p2 = 0 + 1.6 + 1 = 2.6  => p0
    c = _llmd_cluster({"prefix_cache_scorer_weight": 1.0})
    r = req("r", CHAIN, 40)
    assert llmd.scores(_ctx(c, r)) == pytest.approx([4.0, 3.1, 2.6])
    assert _plan(c, r).prefill == "p0"


def test_llmd_queue_scorer_equal_queues_and_kv_proxy() -> None:
    assert llmd.queue_scores([3, 3, 3]) == [1.0, 1.0, 1.0]
    assert llmd.queue_scores([0, 2, 4]) == [1.0, 0.5, 0.0]
    # an instance that also decodes adds its decode KV reservations; usage clamps at 1
    c = _cluster("llmd", {"w0": Role.BOTH, "w1": Role.BOTH})
    _queue(c, "w0", 10_000)
    _decoding(c, "w0", 20_000, output=10_000)  # (10 000 + 30 000) / 100 000 = 0.4
    _decoding(c, "w1", 90_000, output=20_000)  # 110 000 / 100 000 -> 1.0
    ctx = _ctx(c, req("r", (), 8))
    assert [llmd.kv_usage(ctx, i) for i in ctx.prefill_pool] == pytest.approx([0.4, 1.0])
    # no block hashes: prefix score 0; queue 0 for w0 (q=1), 1 for w1 (q=0)
    # w0 = 0 + 2*0.6 = 1.2; w1 = 2*1 + 2*0 = 2.0                       => w1
    assert llmd.scores(ctx) == pytest.approx([1.2, 2.0])


def test_llmd_ties_break_by_seeded_rng() -> None:
    # idle, no cache: every score is 2 + 2 + 0 = 4 -> a uniform draw among the tied
    def first_choice(seed: int) -> str:
        return _plan(make_conductor(3, 1, policy="llmd", seed=seed), req("r", CHAIN, 40)).prefill

    picks = [first_choice(s) for s in range(12)]
    assert picks == [first_choice(s) for s in range(12)]
    assert len(set(picks)) > 1


# -- preble --------------------------------------------------------------------------------


def _preble(c: Scheduler) -> PreblePolicy:
    assert isinstance(c.policy, PreblePolicy)
    return c.policy


def _preble_warm(params: dict[str, float] | None = None) -> Scheduler:
    """Two requests without cache at t = 0: r1 (100 tokens) explores to p0 (loads 0, 0:
    first), r2 (200 tokens) explores to p1 (loads 0.1, 0). Window: p0 0.1 s, p1 0.2 s."""
    c = make_conductor(2, 1, policy="preble", policy_params=params or {})
    assert _plan(c, req("r1", (), 100)).prefill == "p0"
    assert _plan(c, req("r2", (), 200)).prefill == "p1"
    return c


def test_preble_exploit_when_cached_part_is_longer() -> None:
    c = _preble_warm()
    _store(c, "p1", CHAIN[:8], Tier.GPU)  # p1 holds 32 of 40 tokens: 32 > 8 -> exploit
    r = req("r", CHAIN, 40)
    assert _preble(c).loads(_ctx(c, r)) == pytest.approx([0.1, 0.2])
    plan = _plan(c, r)
    assert plan.prefill == "p1"  # the only holder, though it is the busier one
    assert _preble(c).loads(_ctx(c, r)) == pytest.approx([0.1, 0.2 + 0.008])  # 8 new tokens


def test_preble_exploit_picks_min_load_among_holders() -> None:
    c = _preble_warm()
    _store(c, "p0", CHAIN[:8], Tier.GPU)
    _store(c, "p1", CHAIN[:8], Tier.GPU)
    assert _plan(c, req("r", CHAIN, 40)).prefill == "p0"  # 0.1 < 0.2


def test_preble_explore_when_cached_part_is_not_longer() -> None:
    c = _preble_warm()
    _store(c, "p1", CHAIN[:5], Tier.GPU)  # 20 cached, 20 uncached: not longer -> explore
    assert _plan(c, req("r", CHAIN, 40)).prefill == "p0"  # min load 0.1 < 0.2


def test_preble_rebalances_an_overloaded_pick() -> None:
    # rebalancing on from the first request: exploit picks p1 (0.2) > 1.5 * 0.1 -> p0
    c = _preble_warm({"preble_rebalance_after_requests": 0.0})
    _store(c, "p1", CHAIN[:8], Tier.GPU)
    assert _plan(c, req("r", CHAIN, 40)).prefill == "p0"
    # ratio 2.5: 0.2 <= 2.5 * 0.1 -> the exploit pick stands
    c2 = _preble_warm({"preble_rebalance_after_requests": 0.0, "preble_high_load_ratio": 2.5})
    _store(c2, "p1", CHAIN[:8], Tier.GPU)
    assert _plan(c2, req("r", CHAIN, 40)).prefill == "p1"
    # default warm-up: 2 requests routed < 50 -> no rebalancing (see the exploit test)


def test_preble_window_expires_after_three_minutes() -> None:
    c = _preble_warm()
    # t = 100: explore, 0.1 < 0.2 -> p0 (p0 now 0.1 + 0.05)
    assert _plan(c, req("r3", (), 50), now_s=100.0).prefill == "p0"
    # t = 190: the t = 0 entries are older than 190 - 180 = 10 s -> p0 0.05, p1 0 -> p1
    # (without expiry p0 0.15 < p1 0.2 would win)
    ctx = c.context(req("r4", (), 50), 190.0)
    assert ctx is not None
    assert _preble(c).loads(ctx) == pytest.approx([0.05, 0.0])
    assert _plan(c, req("r4", (), 50), now_s=190.0).prefill == "p1"


def test_preble_decode_load_on_instances_that_decode() -> None:
    # w0 decodes 2 requests of 50 tokens: step(2) = 10 + 2 = 12 ms; mean output = this
    # request's 10 tokens (empty window): 2 * 10 * 0.012 = 0.24 s; w1 idle -> explore -> w1
    c = _cluster("preble", {"w0": Role.BOTH, "w1": Role.BOTH})
    _decoding(c, "w0", 50, n=2)
    r = req("r", (), 40)
    assert _preble(c).loads(_ctx(c, r)) == pytest.approx([0.24, 0.0])
    assert _plan(c, r).prefill == "w1"
    # r's decode went to w1 (least TBT): 1 request, step(1) = 11 ms; the window's mean
    # output is r's 10 tokens: w1 = 0.04 s prefill + 1 * 10 * 0.011 = 0.15
    r2 = req("r2", (), 40)
    assert _preble(c).loads(_ctx(c, r2)) == pytest.approx([0.24, 0.15])
