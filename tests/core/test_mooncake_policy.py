"""Each branch of Algorithm 1 (FAST version) on hand-built clusters, exact outcomes.

Cost model in helpers: prefill = 1 ms per new token, transfer = 10 us per token, block = 4.
"""

from __future__ import annotations

import pytest

from conductor.core.events import BlocksStored, PrefillFinished
from conductor.core.plan import Plan
from conductor.core.policies.mooncake import wants_fetch
from conductor.core.types import RequestId, Tier

from .helpers import hashes, iid, make_conductor, req

CHAIN = hashes(*range(1, 11))  # 10 blocks = 40 tokens


def _busy(c, inst: str, seconds: float) -> None:  # type: ignore[no-untyped-def]
    c.instances[iid(inst)].prefill.assign(RequestId(f"busy-{inst}"), seconds, 0, 0.0)


def test_local_branch_when_ratio_is_one() -> None:
    c = make_conductor(2, 1)
    c.on_event(BlocksStored(iid("p0"), CHAIN[:8], Tier.DRAM))
    plan = c.schedule(req("r", CHAIN, 40), now_s=0.0)
    assert isinstance(plan, Plan)
    # p0: local 32 tokens -> 8 ms; p1: fetch 32 tokens (0.32 ms) + 8 ms.
    assert plan.prefill == "p0"
    assert plan.local_tokens == 32 and plan.fetch is None and plan.migrations == ()
    assert plan.predicted_ttft_s == pytest.approx(0.008)


def test_remote_fetch_branch_when_holder_is_busy() -> None:
    c = make_conductor(2, 1)
    c.on_event(BlocksStored(iid("p0"), CHAIN[:8], Tier.DRAM))
    _busy(c, "p0", 1.0)
    plan = c.schedule(req("r", CHAIN, 40), now_s=0.0)
    assert isinstance(plan, Plan)
    assert plan.prefill == "p1"
    assert plan.local_tokens == 0
    assert plan.fetch is not None and plan.fetch.source == "p0" and plan.fetch.tokens == 32
    assert plan.fetch.block_hashes == CHAIN[:8]
    assert plan.transfer_s == pytest.approx(32 * 10e-6)
    assert plan.predicted_ttft_s == pytest.approx(32 * 10e-6 + 0.008)
    # the hot-spot migration of lines 20-21: the fetched blocks become a replica on p1
    assert len(plan.migrations) == 1
    mig = plan.migrations[0]
    assert (mig.source, mig.target, mig.block_hashes) == ("p0", "p1", CHAIN[:8])


@pytest.mark.parametrize(
    ("threshold", "expected_fetch"),
    [(2.0, False), (1.5, True)],
)
def test_threshold_boundary(threshold: float, expected_fetch: bool) -> None:
    """p0 holds 4 blocks (16 tokens), p1 holds 8 (32 tokens, busy). ratio = 2."""
    c = make_conductor(2, 1, kvcache_balancing_threshold=threshold)
    c.on_event(BlocksStored(iid("p0"), CHAIN[:4], Tier.DRAM))
    c.on_event(BlocksStored(iid("p1"), CHAIN[:8], Tier.DRAM))
    _busy(c, "p1", 1.0)
    plan = c.schedule(req("r", CHAIN, 40), now_s=0.0)
    assert isinstance(plan, Plan)
    assert plan.prefill == "p0"
    if expected_fetch:
        assert plan.fetch is not None and plan.fetch.tokens == 16 and plan.fetch.source == "p1"
        assert plan.fetch.block_hashes == CHAIN[4:8]
        assert plan.predicted_ttft_s == pytest.approx(16 * 10e-6 + 0.008)
    else:
        assert plan.fetch is None
        assert plan.predicted_ttft_s == pytest.approx(0.024)


def test_wants_fetch_rule() -> None:
    assert wants_fetch(32, 16, 2.0) is False  # ratio == threshold -> local (FAST: strict >)
    assert wants_fetch(33, 16, 2.0) is True
    assert wants_fetch(32, 0, 100.0) is True  # zero local prefix counts as infinite ratio
    assert wants_fetch(0, 0, 1.0) is False  # nothing cached anywhere
    assert wants_fetch(16, 16, 1.0) is False


def test_zero_local_prefix_fetches() -> None:
    c = make_conductor(2, 1, kvcache_balancing_threshold=50.0)
    c.on_event(BlocksStored(iid("p0"), CHAIN[:2], Tier.DRAM))
    _busy(c, "p0", 1.0)
    plan = c.schedule(req("r", CHAIN, 40), now_s=0.0)
    assert isinstance(plan, Plan)
    assert plan.prefill == "p1" and plan.fetch is not None and plan.fetch.tokens == 8


def test_queue_accumulates_and_drains() -> None:
    c = make_conductor(1, 1)
    p1 = c.schedule(req("a", (), 100), now_s=0.0)
    p2 = c.schedule(req("b", (), 100), now_s=0.0)
    assert isinstance(p1, Plan) and isinstance(p2, Plan)
    assert p1.queue_s == 0.0
    assert p2.queue_s == pytest.approx(0.1)
    # prefill of a ended late (0.15 instead of 0.1): b's predicted end moves with it
    c.on_event(PrefillFinished(RequestId("a"), iid("p0"), 0.15))
    assert c.instances[iid("p0")].prefill.queue_s(0.15) == pytest.approx(0.1)
    c.on_event(PrefillFinished(RequestId("b"), iid("p0"), 0.2))
    assert c.instances[iid("p0")].prefill.queue_s(0.2) == 0.0
