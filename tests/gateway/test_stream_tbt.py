"""The TBT the gateway observes per relayed stream (conductor.gateway.stream_tbt)."""

from __future__ import annotations

import numpy as np
import pytest

from conductor.gateway.stream_tbt import TokenGaps, tail_mean
from conductor.sim.records import tail_mean_tbt


def test_gaps_start_at_the_first_token_and_merged_tokens_add_zero_gaps() -> None:
    gaps = TokenGaps()
    assert gaps.tbt_s() is None
    gaps.mark(1.0, 1)  # the first token: TTFT, no interval
    assert gaps.tbt_s() is None
    gaps.mark(1.5, 0)  # the rest of a split event: nothing
    gaps.mark(1.25, 1)
    gaps.mark(2.0, 3)  # three tokens in one chunk: 0.75, then 0, 0
    assert gaps.gaps == [0.25, 0.75, 0.0, 0.0]
    assert gaps.tbt_s() == 0.75  # ceil(0.1 x 4) = 1 longest interval


def test_first_chunk_with_several_tokens() -> None:
    gaps = TokenGaps()
    gaps.mark(3.0, 2)
    assert gaps.gaps == [0.0]
    assert gaps.tbt_s() == 0.0


@pytest.mark.parametrize("n", [1, 2, 9, 10, 11, 25, 100, 257])
def test_tail_mean_is_the_simulators(n: int) -> None:
    values = [float(x) for x in np.random.default_rng(n).exponential(0.05, n)]
    assert tail_mean(values) == pytest.approx(tail_mean_tbt(np.asarray(values)), rel=1e-12)


def test_tail_mean_exact() -> None:
    assert tail_mean([]) is None
    assert tail_mean([0.5]) == 0.5
    assert tail_mean([0.1, 0.3]) == 0.3
    assert tail_mean([0.01 * k for k in range(1, 21)]) == pytest.approx((0.2 + 0.19) / 2)
