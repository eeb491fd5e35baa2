"""How often an evicted block is asked for again (``conductor.core.eviction_regret``), and
``conductor`` pricing what a placement would evict by it."""

from __future__ import annotations

import pytest

from conductor.core.config import SchedulerConfig
from conductor.core.errors import InvalidInput
from conductor.core.events import BlocksRemoved, BlocksStored
from conductor.core.eviction_regret import EvictionRegret
from conductor.core.plan import Plan
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceSpec
from conductor.core.types import BlockHash, RequestId, Role, Tier

from .helpers import LINEAR_COST, hashes, iid, req


def test_the_rate_is_laplaces_rule_over_removed_blocks_asked_for_again() -> None:
    r = EvictionRegret()
    assert r.rate == 0.5  # no evidence yet
    r.on_removed(hashes(1, 2, 3))
    r.on_request(hashes(1, 2, 9))  # 1 and 2 asked for again (9: never removed)
    assert (r.regretted, r.removed) == (2, 3)
    assert r.rate == pytest.approx(3 / 5)
    r.on_request(hashes(1, 2))  # each block counts once
    assert r.regretted == 2


def test_only_the_most_recent_removals_are_remembered() -> None:
    r = EvictionRegret(limit=2)
    r.on_removed(hashes(1, 2, 3))
    r.on_removed(hashes(3))  # already remembered: not counted again
    assert r.removed == 3
    r.on_request(hashes(1))
    r.on_request(hashes(2, 3))
    assert r.regretted == 2
    with pytest.raises(InvalidInput, match="limit"):
        EvictionRegret(limit=0)


def test_the_scheduler_measures_the_prefill_instances_evictions() -> None:
    """A prefill instance's removals count; a decode-only instance's (its own finished
    prompts, kept apart from the index) do not."""
    c = Scheduler(LINEAR_COST, policy="conductor")
    c.add_instance(InstanceSpec(iid("p"), Role.PREFILL))
    c.add_instance(InstanceSpec(iid("d"), Role.DECODE))
    c.on_event(BlocksRemoved(iid("p"), hashes(1, 2), Tier.GPU))
    c.on_event(BlocksRemoved(iid("d"), hashes(3, 4), Tier.GPU))
    assert (c.regret.removed, c.regret.regretted) == (2, 0)


def _cluster(capacity_tokens: int | None, **params: float) -> Scheduler:
    """Prefill a and b (caches of ``capacity_tokens``; no KV pulls), decode d; block 4
    tokens, prefill 1 ms per new token. The recompute price is off (``work_price`` 0): these
    tests isolate the eviction price (the recompute price has its own in
    tests/core/test_conductor_policy.py)."""
    config = SchedulerConfig(block_size_tokens=4, policy_params={"work_price": 0.0, **params})
    c = Scheduler(LINEAR_COST, policy="conductor", config=config)
    for name in ("a", "b"):
        spec = InstanceSpec(
            iid(name), Role.PREFILL, pulls_kv=False, cache_capacity_tokens=capacity_tokens
        )
        c.add_instance(spec)
    c.add_instance(InstanceSpec(iid("d"), Role.DECODE))
    return c


@pytest.mark.parametrize(
    ("capacity", "params", "where"),
    [(40, {}, "a"), (None, {}, "b"), (40, {"eviction_weight": 0.0}, "b")],
)
def test_conductor_prices_what_a_placement_would_evict(
    capacity: int | None, params: dict[str, float], where: str
) -> None:
    """a holds DOC (8 blocks) and has 45 ms of work queued; b is idle and its cache of 10
    blocks is full. A prompt of DOC + 1 block: on a 45 + 4 ms (1 new block, room for 2);
    on b 36 ms, but its 9 blocks would evict 9 others, priced at the chance an evicted block
    is needed again (1/2 before any evidence) x their 36 ms of recompute: 54 ms, so a. With
    no cache size known, or the weight set to 0, b."""
    c = _cluster(capacity, **params)
    doc = hashes(*range(1, 9))
    c.on_event(BlocksStored(iid("a"), doc, Tier.GPU))
    c.on_event(BlocksStored(iid("b"), hashes(*range(100, 110)), Tier.GPU))
    c.instances[iid("a")].prefill.assign(RequestId("x"), 0.045, 0, 1.0)
    plan = c.schedule(req("r", (*doc, BlockHash(9)), 36), 1.0)
    assert isinstance(plan, Plan), plan
    assert plan.prefill == iid(where)
    # the prediction is the TTFT alone (what an eviction costs later is not in it)
    assert plan.predicted_ttft_s == pytest.approx(0.049 if where == "a" else 0.036)


def test_the_queued_prefills_stores_take_room_first() -> None:
    """b's cache holds 2 blocks of 10, but 28 new tokens (7 blocks) are queued there: a
    9-block prompt would evict 8 of what it holds."""
    c = _cluster(40)
    c.on_event(BlocksStored(iid("b"), hashes(100, 101), Tier.GPU))
    b = c.instances[iid("b")]
    b.prefill.assign(RequestId("x"), 0.028, 28, 1.0)
    ctx = c.context(req("r", hashes(*range(1, 10)), 36), 1.0)
    assert ctx is not None
    assert ctx.evicted_blocks(b, 9) == 8
    assert ctx.evicted_blocks(b, 1) == 0
    assert ctx.evicted_blocks(c.instances[iid("a")], 9) == 0
