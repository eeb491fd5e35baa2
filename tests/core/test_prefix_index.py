from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conductor.core.errors import UnknownInstance
from conductor.core.prefix_index import PrefixIndex
from conductor.core.types import BlockHash, InstanceId, Tier

from .helpers import hashes, iid


def test_seed_example_exact_token_lengths() -> None:
    """The seed numbers at a block size that divides them all: 2048/4096/5000/6000 -> gcd
    is 8 tokens; 8000 tokens = 1000 blocks."""
    bs = 8
    chain = hashes(*range(1000))
    idx = PrefixIndex()
    for n in range(1, 6):
        idx.add_holder(iid(f"node{n}"))
    idx.store(iid("node1"), chain[: 6000 // bs], Tier.DRAM)
    idx.store(iid("node3"), chain[: 4096 // bs], Tier.DRAM)
    idx.store(iid("node2"), chain[: 5000 // bs], Tier.DRAM)
    idx.store(iid("node4"), chain[: 2048 // bs], Tier.DRAM)
    idx.store(iid("node5"), chain[: 2048 // bs], Tier.DRAM)
    m = idx.match(chain)
    assert {h: d * bs for h, d in m.local_blocks.items()} == {
        "node1": 6000,
        "node2": 5000,
        "node3": 4096,
        "node4": 2048,
        "node5": 2048,
    }
    assert m.best_blocks * bs == 6000 and m.best_holders == (iid("node1"),)


def test_store_remove_clear_and_instance_loss() -> None:
    idx = PrefixIndex()
    a, b = iid("a"), iid("b")
    idx.add_holder(a)
    idx.add_holder(b)
    idx.store(a, hashes(1, 2, 3), Tier.GPU)
    idx.store(a, hashes(1, 2, 3, 4), Tier.DRAM)
    idx.store(b, hashes(1, 2), Tier.GPU)
    m = idx.match(hashes(1, 2, 3, 4, 5))
    assert m.local_blocks == {a: 4, b: 2}
    assert m.gpu_blocks == {a: 3, b: 2}
    # removing from GPU keeps the DRAM copy local
    idx.remove(a, hashes(2), Tier.GPU)
    m = idx.match(hashes(1, 2, 3, 4))
    assert m.local_blocks == {a: 4, b: 2} and m.gpu_blocks == {a: 1, b: 2}
    # removing the DRAM copy too breaks a's chain at block 2
    idx.remove(a, hashes(2), Tier.DRAM)
    assert idx.match(hashes(1, 2, 3, 4)).local_blocks == {a: 1, b: 2}
    # unknown hashes are ignored
    idx.remove(a, hashes(99), Tier.GPU)
    idx.clear(a, Tier.GPU)
    assert idx.count(a, Tier.GPU) == 0 and idx.count(a, Tier.DRAM) == 3
    idx.clear(a)
    assert idx.match(hashes(1, 2)).local_blocks == {b: 2}
    idx.remove_holder(b)
    assert idx.match(hashes(1, 2)).best_blocks == 0
    with pytest.raises(UnknownInstance):
        idx.store(b, hashes(1), Tier.GPU)
    # the freed slot is reused by a new holder without stale bits
    c = iid("c")
    idx.add_holder(c)
    assert idx.match(hashes(1, 2)).local_blocks == {}
    assert idx.holders() == [a, c]


def test_store_tier_is_remote_only() -> None:
    idx = PrefixIndex()
    p, s = iid("p"), iid("store0")
    idx.add_holder(p)
    idx.add_holder(s)
    idx.store(s, hashes(1, 2, 3), Tier.STORE)
    idx.store(p, hashes(1), Tier.DRAM)
    m = idx.match(hashes(1, 2, 3))
    assert m.local_blocks == {p: 1}
    assert m.best_blocks == 3 and m.best_holders == (s,)
    assert idx.holders_of(BlockHash(1)) == {p: (Tier.DRAM,), s: (Tier.STORE,)}


def test_union_spans_holders() -> None:
    idx = PrefixIndex()
    a, b = iid("a"), iid("b")
    idx.add_holder(a)
    idx.add_holder(b)
    idx.store(a, hashes(1, 2), Tier.GPU)
    idx.store(b, hashes(1, 5, 3), Tier.GPU)  # holds block 3 but not block 2
    m = idx.match(hashes(1, 2, 3, 4))
    assert m.union_blocks == 3 and m.best_blocks == 2 and m.best_holders == (a,)
    assert m.local_blocks == {a: 2, b: 1}


def test_empty_request_and_empty_index() -> None:
    idx = PrefixIndex()
    idx.add_holder(iid("a"))
    assert idx.match(()).best_blocks == 0
    assert idx.match(hashes(1, 2)).union_blocks == 0


# -- property test against a brute-force reference ---------------------------------------

HOLDERS = [InstanceId(f"h{i}") for i in range(5)]
op = st.tuples(
    st.sampled_from(["store", "remove", "clear", "gone"]),
    st.integers(0, 4),
    st.sampled_from([Tier.GPU, Tier.DRAM, Tier.STORE]),
    st.lists(st.integers(0, 7), min_size=0, max_size=6),
)


def _ref_depth(
    held: dict[tuple[InstanceId, Tier], set[int]],
    h: InstanceId,
    q: list[int],
    tiers: tuple[Tier, ...],
) -> int:
    d = 0
    for b in q:
        if any(b in held.get((h, t), set()) for t in tiers):
            d += 1
        else:
            break
    return d


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=40), st.lists(st.integers(0, 7), max_size=8))
def test_index_matches_brute_force(
    ops: list[tuple[str, int, Tier, list[int]]], query: list[int]
) -> None:
    idx = PrefixIndex()
    alive: set[InstanceId] = set()
    held: dict[tuple[InstanceId, Tier], set[int]] = {}
    for kind, hi, tier, blocks in ops:
        h = HOLDERS[hi]
        if h not in alive:
            idx.add_holder(h)
            alive.add(h)
        bh = [BlockHash(b) for b in blocks]
        if kind == "store":
            idx.store(h, bh, tier)
            held.setdefault((h, tier), set()).update(blocks)
        elif kind == "remove":
            idx.remove(h, bh, tier)
            held.setdefault((h, tier), set()).difference_update(blocks)
        elif kind == "clear":
            idx.clear(h, tier)
            held[(h, tier)] = set()
        else:
            idx.remove_holder(h)
            alive.discard(h)
            for t in Tier:
                held[(h, t)] = set()
    m = idx.match([BlockHash(b) for b in query])
    local = {h: _ref_depth(held, h, query, (Tier.GPU, Tier.DRAM)) for h in alive}
    assert m.local_blocks == {h: d for h, d in local.items() if d}
    gpu = {h: _ref_depth(held, h, query, (Tier.GPU,)) for h in alive}
    assert m.gpu_blocks == {h: d for h, d in gpu.items() if d}
    anyd = {h: _ref_depth(held, h, query, tuple(Tier)) for h in alive}
    best = max(anyd.values(), default=0)
    assert m.best_blocks == best
    if best:
        assert set(m.best_holders) == {h for h, d in anyd.items() if d == best}
    union = 0
    for b in query:
        if any(b in s for (hh, _), s in held.items() if hh in alive):
            union += 1
        else:
            break
    assert m.union_blocks == union
    for h in alive:
        for t in Tier:
            assert idx.count(h, t) == len(held.get((h, t), set()))
