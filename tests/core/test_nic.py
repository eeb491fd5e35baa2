"""NIC contention in the scheduler's predictions (``conductor.core.nic``): a fetch waits for
the transfers already booked on its source's egress and its target's ingress.

Cost model (helpers): prefill 1 ms per new token, transfer 10 us per token, block 4 tokens.
"""

from __future__ import annotations

import pytest

from conductor.core.events import BlocksStored
from conductor.core.nic import NicBook
from conductor.core.plan import Plan
from conductor.core.types import RequestId, Tier

from .helpers import hashes, iid, make_conductor, req

CHAIN = hashes(*range(1, 11))  # 40 tokens


def test_a_transfer_holds_both_ends_fifo() -> None:
    book = NicBook()
    a, b, c = iid("a"), iid("b"), iid("c")
    assert book.book(a, b, 1.0, 2.0) == 3.0
    assert book.wait_s(a, c, 0.5) == 2.5  # a's egress is busy until 3
    assert book.wait_s(c, b, 2.0) == 1.0  # b's ingress too
    assert book.wait_s(b, a, 0.0) == 0.0  # the other directions are free
    assert book.book(c, b, 0.0, 1.0) == 4.0  # queued behind the first on b's ingress
    assert book.wait_s(None, b, 0.0) == 0.0


@pytest.mark.parametrize("policy", ["conductor", "mooncake"])
def test_the_second_fetch_from_one_holder_waits_for_the_first(policy: str) -> None:
    """p0 holds 32 tokens of the prefix and is busy; r1 fetches them to p1 (0.32 ms on the
    wire); r2, at the same moment, fetches them to p2 and waits 0.32 ms for p0's egress."""
    c = make_conductor(3, 2, policy=policy)
    c.on_event(BlocksStored(iid("p0"), CHAIN[:8], Tier.DRAM))
    c.instances[iid("p0")].prefill.assign(RequestId("x"), 1.0, 0, 0.0)
    wire = 32 * 10e-6
    plans = [c.schedule(req(f"r{i}", CHAIN, 40), now_s=0.0) for i in (1, 2)]
    assert all(isinstance(p, Plan) for p in plans)
    p1, p2 = plans
    assert isinstance(p1, Plan) and isinstance(p2, Plan)
    assert (p1.prefill, p2.prefill) == ("p1", "p2")
    assert p1.fetch is not None and p2.fetch is not None and p2.fetch.source == "p0"
    assert p1.transfer_s == pytest.approx(wire)
    assert p2.transfer_s == pytest.approx(2 * wire)
    assert p2.predicted_ttft_s == pytest.approx(2 * wire + 0.008)
    # and the bookings: p0's egress until the second fetch ends, then each prompt's KV
    # streamed from its prefill's start to its decode instance
    assert c.nic.out_free_s[iid("p0")] == pytest.approx(2 * wire)
    assert c.nic.out_free_s[iid("p1")] == pytest.approx(wire + 40 * 10e-6)
