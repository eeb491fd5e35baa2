"""The packed index past its first field width (more than 64 holders, repacked as holders
join) and with slots reused, against a brute-force reference."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from conductor.core.prefix_index import PrefixIndex
from conductor.core.types import BlockHash, InstanceId, Tier

Held = dict[tuple[InstanceId, Tier], set[int]]


def _depth(held: Held, h: InstanceId, query: list[int], tiers: tuple[Tier, ...]) -> int:
    d = 0
    for b in query:
        if not any(b in held.get((h, t), set()) for t in tiers):
            break
        d += 1
    return d


def _check(
    idx: PrefixIndex, held: Held, alive: list[InstanceId], query: list[int], *, tiers: bool
) -> None:
    m = idx.match([BlockHash(b) for b in query])
    local = {h: _depth(held, h, query, (Tier.GPU, Tier.DRAM)) for h in alive}
    gpu = {h: _depth(held, h, query, (Tier.GPU,)) for h in alive}
    anyd = {h: _depth(held, h, query, tuple(Tier)) for h in alive}
    assert m.local_blocks == {h: d for h, d in local.items() if d}
    assert m.gpu_blocks == {h: d for h, d in gpu.items() if d}
    best = max(anyd.values(), default=0)
    assert m.best_blocks == best
    assert set(m.best_holders) == ({h for h, d in anyd.items() if d == best} if best else set())
    union = 0
    for b in query:
        if not any(b in s for (h, _), s in held.items() if h in alive):
            break
        union += 1
    assert m.union_blocks == union
    if not tiers:
        return
    for b in set(query):
        expect = {
            h: tuple(t for t in Tier if b in held.get((h, t), set()))
            for h in alive
            if any(b in held.get((h, t), set()) for t in Tier)
        }
        assert idx.holders_of(BlockHash(b)) == expect


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(60, 140))
def test_many_holders_match_brute_force(seed: int, n_holders: int) -> None:
    rng = random.Random(seed)
    idx = PrefixIndex()
    held: Held = {}
    alive: list[InstanceId] = []
    chain = list(range(12))
    for i in range(n_holders):
        h = InstanceId(f"h{i}")
        idx.add_holder(h)
        alive.append(h)
        if rng.random() < 0.5:  # stored before the index widens, read after
            tier = rng.choice(list(Tier))
            blocks = chain[: rng.randint(1, len(chain))]
            idx.store(h, [BlockHash(b) for b in blocks], tier)
            held.setdefault((h, tier), set()).update(blocks)
    for _ in range(40):
        h = rng.choice(alive)
        tier = rng.choice(list(Tier))
        kind = rng.random()
        if kind < 0.6:
            start = rng.randint(0, 3)
            blocks = chain[start : rng.randint(start, len(chain))]
            idx.store(h, [BlockHash(b) for b in blocks], tier)
            held.setdefault((h, tier), set()).update(blocks)
        elif kind < 0.85:
            blocks = rng.sample(chain, rng.randint(0, 4))
            idx.remove(h, [BlockHash(b) for b in blocks], tier)
            held.setdefault((h, tier), set()).difference_update(blocks)
        elif kind < 0.95:
            idx.clear(h, tier)
            held[(h, tier)] = set()
        else:  # the holder leaves; a new one may take its slot
            idx.remove_holder(h)
            alive.remove(h)
            for t in Tier:
                held.pop((h, t), None)
            new = InstanceId(f"n{rng.randrange(10**9)}")
            idx.add_holder(new)
            alive.append(new)
        _check(idx, held, alive, chain[: rng.randint(0, len(chain))], tiers=False)
    _check(idx, held, alive, chain, tiers=True)
