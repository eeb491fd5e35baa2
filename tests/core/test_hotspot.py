from __future__ import annotations

import pytest

from conductor.core.hotspot import HotspotConfig, HotspotTracker
from conductor.core.plan import Migration
from conductor.core.prefix_index import PrefixIndex
from conductor.core.state import InstanceSpec, InstanceState
from conductor.core.types import RequestId, Role, Tier

from .helpers import hashes, iid

CHAIN = hashes(1, 2, 3)


def _pool(queues: list[float]) -> list[InstanceState]:
    pool = []
    for i, q in enumerate(queues):
        s = InstanceState(InstanceSpec(iid(f"p{i}"), Role.PREFILL))
        if q:
            s.prefill.assign(RequestId("x"), q, 0, 0.0)
        pool.append(s)
    return pool


def test_rate_decays_with_half_life() -> None:
    t = HotspotTracker(HotspotConfig(half_life_s=10.0))
    t.record(CHAIN, 0.0)
    t.record(CHAIN, 0.0)
    assert t.rate(CHAIN[-1], 0.0) == pytest.approx(0.2)
    assert t.rate(CHAIN[-1], 10.0) == pytest.approx(0.1)


def test_hot_prefix_on_a_loaded_holder_is_copied_to_the_idlest() -> None:
    idx = PrefixIndex()
    pool = _pool([9.0, 2.0, 0.5])
    for s in pool:
        idx.add_holder(s.spec.instance_id)
    idx.store(iid("p0"), CHAIN, Tier.DRAM)
    t = HotspotTracker(HotspotConfig(half_life_s=10.0, min_rate_per_s=0.05))
    t.record(CHAIN, 0.0)
    # mean queue 3.83 s; holder p0 at 9 s > 1.5 x mean; idlest non-holder p2
    assert t.plan(0.0, pool, idx) == [Migration(iid("p0"), iid("p2"), CHAIN)]
    # not again before the next check, nor to the same target within the cooldown
    assert t.plan(1.0, pool, idx) == []
    assert t.plan(6.0, pool, idx) == []


def test_no_copy_when_cold_or_holder_not_overloaded() -> None:
    idx = PrefixIndex()
    pool = _pool([3.0, 2.0, 2.5])
    for s in pool:
        idx.add_holder(s.spec.instance_id)
    idx.store(iid("p0"), CHAIN, Tier.DRAM)
    t = HotspotTracker(HotspotConfig(half_life_s=10.0, min_rate_per_s=0.05))
    t.record(CHAIN, 0.0)
    assert t.plan(0.0, pool, idx) == []  # 3.0 <= 1.5 x mean 2.5
    cold = HotspotTracker(HotspotConfig(half_life_s=10.0, min_rate_per_s=0.5))
    cold.record(CHAIN, 0.0)
    assert cold.plan(0.0, _pool([9.0, 0.0, 0.0]), idx) == []
