"""The hold queue's rejection at arrival: the shared-prefix lookup it prices prefills with."""

from __future__ import annotations

import random

from conductor.core.hashing import hash_blocks
from conductor.core.hold_reject import Prefixes
from conductor.core.types import BlockHash

BS = 4


def chain(tokens: list[int]) -> list[BlockHash]:
    return hash_blocks(tokens, BS)


def longest_common(a: list[BlockHash], b: list[BlockHash]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_shared_is_the_longest_prefix_any_added_prompt_has() -> None:
    system = list(range(40))  # 10 blocks every prompt starts with
    a = chain(system + [100 + i for i in range(20)])
    b = chain(system + [100 + i for i in range(8)] + [7] * 12)  # shares 12 blocks with a
    known = Prefixes([a])
    assert known.shared(b) == 12
    assert known.shared(a) == len(a)  # all of it
    assert known.shared(a[:3]) == 3
    assert known.shared(chain([999] * 8)) == 0  # not even the first block
    assert known.shared([]) == 0
    known.add(b)
    assert known.shared(b) == len(b)
    assert Prefixes([]).shared(a) == 0


def test_shared_matches_a_direct_comparison_on_random_chained_prompts() -> None:
    rng = random.Random(7)
    stems = [[rng.randrange(50) for _ in range(rng.randrange(0, 60))] for _ in range(6)]

    def prompt() -> list[BlockHash]:
        stem = rng.choice(stems)
        return chain(stem[: rng.randrange(len(stem) + 1)] + [rng.randrange(50) for _ in range(9)])

    added = [prompt() for _ in range(40)]
    known = Prefixes(added[:20])
    for c in added[20:]:
        known.add(c)
    for _ in range(200):
        q = prompt()
        assert known.shared(q) == max(longest_common(q, c) for c in added)


def test_position_free_hashes_can_only_make_it_longer() -> None:
    # ids that are not chained: the lookup may find more than is truly shared, never less
    # (the rejection errs towards keeping a request)
    added = [BlockHash(1), BlockHash(5), BlockHash(3)]
    query = [BlockHash(1), BlockHash(2), BlockHash(3)]
    assert longest_common(query, added) == 1
    assert Prefixes([added]).shared(query) == 3  # its last block is held: taken as all shared
    assert Prefixes([added]).shared([BlockHash(1), BlockHash(2), BlockHash(4)]) == 1
