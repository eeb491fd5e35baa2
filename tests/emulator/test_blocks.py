"""The emulator's block pool: reservations, LRU eviction tail first, dedupe, invariants."""

from __future__ import annotations

import pytest

from conductor.emulator.blocks import BlockPool, Cleared, Removed


def _cache(pool: BlockPool, hashes: list[int]) -> None:
    """One request computes ``hashes`` (a chain) and frees them."""
    pool.reserve(len(hashes))
    for h in hashes:
        pool.take()
        assert pool.promote(h)
    pool.release(reversed(hashes))
    pool.check()


def test_match_counts_the_cached_prefix_only() -> None:
    pool = BlockPool(8)
    _cache(pool, [1, 2, 3])
    assert pool.match([1, 2, 3, 4]) == 3
    assert pool.match([1, 9, 3]) == 1
    assert pool.match([9, 1]) == 0
    assert (pool.cached, pool.pinned, pool.used) == (3, 0, 0)


def test_eviction_takes_least_recently_freed_and_chain_tails_first() -> None:
    pool = BlockPool(4)
    _cache(pool, [1, 2])  # freed tail first: 2 then 1
    _cache(pool, [3, 4])  # pool full of evictable blocks: 2, 1, 4, 3
    pool.reserve(3)
    for _ in range(3):
        pool.take()
    assert pool.take_events() == [Removed((2,)), Removed((1,)), Removed((4,))]
    assert pool.match([3]) == 1 and pool.match([1]) == 0
    pool.check()


def test_pinning_a_hit_protects_it_and_refreshes_its_recency() -> None:
    pool = BlockPool(3)
    _cache(pool, [1])
    _cache(pool, [2])
    pool.pin(1)  # a request reuses block 1
    pool.reserve(2)
    pool.take()  # free uncached block
    pool.take()  # evicts 2, the only evictable one
    assert pool.take_events() == [Removed((2,))]
    pool.free_private(2)
    pool.release([1])
    pool.check()
    assert pool.match([1]) == 1


def test_admission_counts_revived_hits_and_reservations() -> None:
    pool = BlockPool(4)
    _cache(pool, [1, 2])
    assert pool.can_admit([1, 2], 2)  # 2 revived + 2 new = 4
    assert not pool.can_admit([1, 2], 3)
    assert pool.can_admit([], 4)  # evicting both cached blocks
    pool.reserve(3)
    assert not pool.can_admit([], 2)
    assert pool.can_admit([], 1)


def test_promote_dedupes_blocks_computed_twice() -> None:
    pool = BlockPool(4)
    pool.reserve(2)
    pool.take()
    pool.take()
    assert pool.promote(7)
    assert not pool.promote(7)  # same tokens computed by a second request: share the block
    assert (pool.private, pool.cached, pool.refs(7)) == (0, 1, 2)
    pool.release([7])
    pool.release([7])
    pool.check()
    assert pool.used == 0


def test_clear_refuses_while_blocks_are_used() -> None:
    pool = BlockPool(4)
    _cache(pool, [1])
    pool.pin(1)
    assert not pool.clear()
    pool.unpin(1)
    assert pool.clear()
    assert pool.take_events() == [Cleared()]
    assert pool.cached == 0


def test_misuse_raises() -> None:
    pool = BlockPool(2)
    with pytest.raises(ValueError):
        pool.take()
    with pytest.raises(ValueError):
        pool.unreserve(1)
    with pytest.raises(ValueError):
        pool.free_private(1)
    with pytest.raises(ValueError):
        BlockPool(0)
