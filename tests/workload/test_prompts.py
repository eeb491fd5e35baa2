"""Block prompts: equal block ids are equal tokens, fresh ids share nothing."""

from __future__ import annotations

import pytest

from conductor.core.errors import InvalidInput
from conductor.workload.prompts import DEFAULT_POOL, BlockPrompts, FreshBlocks, word_pool


def test_equal_ids_are_equal_blocks_across_instances() -> None:
    a, b = BlockPrompts(4, seed=7), BlockPrompts(4, seed=7)
    p = a.prompt([1, 2, 3], 12)
    q = b.prompt([1, 2, 9], 10)
    assert len(p) == 12 and len(q) == 10
    assert p[:8] == q[:8]
    assert p[8:10] != q[8:10]
    assert set(p) <= set(DEFAULT_POOL)
    assert BlockPrompts(4, seed=8).block(1) != a.block(1)
    a.forget()
    assert a.block(1) == b.block(1)


def test_prompt_checks_its_lengths() -> None:
    bp = BlockPrompts(4)
    assert bp.prompt([5, 6], 5) == bp.block(5) + bp.block(6)[:1]
    with pytest.raises(InvalidInput, match="2 blocks of 4 cannot make 9 tokens"):
        bp.prompt([5, 6], 9)
    with pytest.raises(InvalidInput, match="invalid length=0"):
        bp.prompt([5], 0)
    with pytest.raises(InvalidInput, match="invalid block_size_tokens=0"):
        BlockPrompts(0)
    with pytest.raises(InvalidInput, match="invalid pool=\\[3\\]"):
        BlockPrompts(4, pool=[3])


def test_fresh_blocks_and_word_pool() -> None:
    fresh = FreshBlocks(start=10)
    assert fresh.take(2) == [10, 11]
    assert fresh.take(1) == [12]
    assert word_pool(lambda t: [len(t), 1], ["ab", "abc"]) == (1, 3, 4)
    with pytest.raises(InvalidInput, match="fewer than 2 distinct ids"):
        word_pool(lambda t: [1], ["a", "b"])
