"""FAST's TBT, defined once (conductor.core.tbt), and its numpy twin in the simulator."""

from __future__ import annotations

import numpy as np
import pytest

from conductor.core.policies.decode import tbt_intervals
from conductor.core.tbt import tail_count, tail_mean
from conductor.sim.records import tail_mean_tbt


@pytest.mark.parametrize("n", [1, 2, 9, 10, 11, 25, 100, 257])
def test_tail_mean_is_the_simulators(n: int) -> None:
    values = [float(x) for x in np.random.default_rng(n).exponential(0.05, n)]
    assert tail_mean(values) == pytest.approx(tail_mean_tbt(np.asarray(values)), rel=1e-12)


def test_tail_mean_exact() -> None:
    assert tail_mean([]) is None
    assert tail_mean([0.5]) == 0.5
    assert tail_mean([0.1, 0.3]) == 0.3
    assert tail_mean([0.01 * k for k in range(1, 21)]) == pytest.approx((0.2 + 0.19) / 2)


def test_tail_count_is_the_decode_choices_k() -> None:
    assert [tail_count(n) for n in (0, 1, 10, 11, 20, 21, 345)] == [1, 1, 1, 2, 2, 3, 35]
    assert [tbt_intervals(out) for out in (1, 11, 12, 346.0)] == [1, 1, 2, 35]
