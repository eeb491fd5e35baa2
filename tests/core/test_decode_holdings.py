"""The decode-only instances' own prefix caches as the scheduler sees them
(:mod:`conductor.core.decode_holdings`): per instance, the leading blocks of a prompt it
holds, fed by its KV events."""

from __future__ import annotations

from conductor.core.decode_holdings import DecodeHoldings
from conductor.core.events import AllBlocksCleared, BlocksRemoved, BlocksStored
from conductor.core.state import InstanceSpec
from conductor.core.types import Role, Tier

from .helpers import hashes, iid, make_conductor


def test_leading_blocks_per_holder_with_stores_removals_and_clears() -> None:
    d = DecodeHoldings()
    d0, d1 = iid("d0"), iid("d1")
    d.add_holder(d0)
    d.add_holder(d1)
    d.store(d0, hashes(1, 2, 3, 4), Tier.GPU)
    d.store(d1, hashes(2, 3), Tier.GPU)
    assert d.held_blocks(hashes(1, 2, 3, 4, 5)) == {d0: 4}  # d1 lacks the first block
    d.remove(d0, hashes(3, 9), Tier.GPU)  # an unknown hash is ignored
    assert d.held_blocks(hashes(1, 2, 3, 4)) == {d0: 2}
    assert d.held_blocks(hashes(2, 3)) == {d0: 1, d1: 2}
    assert d.held_blocks(()) == {}
    d.clear(d0)
    assert d.count(d0) == 0 and d.count(d1) == 2
    assert d.held_blocks(hashes(1, 2)) == {}
    d.remove(d1, hashes(2, 3), Tier.GPU)  # emptied, then filled again: matched again
    assert d.held_blocks(hashes(2, 3)) == {}
    d.store(d1, hashes(2), Tier.GPU)
    d.store(d0, hashes(2), Tier.GPU)
    assert d.held_blocks(hashes(2, 3)) == {d0: 1, d1: 1}
    d.store(d1, hashes(3), Tier.GPU)
    d.remove_holder(d1)
    assert d1 not in d and d.held_blocks(hashes(2, 3)) == {d0: 1}


def test_the_scheduler_routes_decode_only_instances_events_to_it() -> None:
    """A decode-only instance's events go to ``decode_index``; a prefill's and a both-role
    instance's (it prefills: prefill placement reads its cache) to the prefix index."""
    c = make_conductor(1, 1, policy="conductor")
    c.add_instance(InstanceSpec(iid("b0"), Role.BOTH))
    for holder in ("p0", "d0", "b0"):
        c.on_event(BlocksStored(iid(holder), hashes(1, 2), Tier.GPU))
    assert c.decode_index.held_blocks(hashes(1, 2)) == {iid("d0"): 2}
    assert c.index.match(hashes(1, 2)).local_blocks == {iid("p0"): 2, iid("b0"): 2}
    c.on_event(BlocksRemoved(iid("d0"), hashes(2), Tier.GPU))
    assert c.decode_index.held_blocks(hashes(1, 2)) == {iid("d0"): 1}
    c.on_event(AllBlocksCleared(iid("d0"), None))
    assert c.decode_index.held_blocks(hashes(1, 2)) == {}
    c.remove_instance(iid("d0"))
    assert iid("d0") not in c.decode_index
