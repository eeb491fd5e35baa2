"""NIC contention in the scheduler's predictions (``conductor.core.nic``): a fetch waits for
the transfers already booked on its source's egress and its target's ingress.

Cost model (helpers): prefill 1 ms per new token, transfer 10 us per token, block 4 tokens.
"""

from __future__ import annotations

import pytest

from conductor.core.events import BlocksStored, PrefillFinished
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
    # and the bookings: p0's egress until the second fetch ends; each prompt's KV goes to
    # its decode instance when its prefill ends (r1's at wire + 8 ms), streamed from the
    # prefill's start (wire), so it holds p1's egress until wire + 0.4 ms only from then on
    assert c.nic.out_free_s[iid("p0")] == pytest.approx(2 * wire)
    assert iid("p1") not in c.nic.out_free_s
    assert c.nic.wait_s(iid("p1"), iid("p0"), wire + 0.008) == 0.0
    assert c.nic.out_free_s[iid("p1")] == pytest.approx(wire + 40 * 10e-6)


def test_a_hand_off_is_requested_when_its_prefill_ends() -> None:
    """The prompt's KV leaves for decode when the prefill ends (as in the simulator), so it
    holds the egress only for transfers requested after that, from the prefill's start."""
    book = NicBook()
    a, b, c = iid("a"), iid("b"), iid("c")
    book.later(5.0, a, b, 4.0, 2.0)  # requested at 5, may stream from 4, 2 s on the wire
    assert book.wait_s(a, c, 1.0) == 0.0  # a fetch requested before goes first
    assert book.book(a, c, 1.0, 0.5) == 1.5
    assert book.wait_s(a, c, 5.0) == 1.0  # from 5 on it holds a's egress 4 -> 6
    assert book.out_free_s[a] == 6.0 and book.in_free_s[b] == 6.0
    book.later(7.0, a, b, 6.5, 1.0)
    book.later(7.0, c, b, 6.0, 1.0)  # same request time: booked in the order made
    book.release(7.0)
    assert (book.out_free_s[a], book.out_free_s[c], book.in_free_s[b]) == (7.5, 8.5, 8.5)
    assert book.pending == []


@pytest.mark.parametrize("policy", ["conductor", "mooncake"])
def test_a_queued_prefill_does_not_block_fetches_from_its_instance(policy: str) -> None:
    """p0 holds the 32-token prefix and has 1 s queued; r0 reuses it there (its KV goes to
    d0 at about 1.008 s). p1 is idle: r1 fetches the prefix from p0 at once (p0's egress is
    free until r0's prefill ends), 0.32 ms + 8 ms, instead of waiting ~1 s for r0's
    hand-off (conductor used to compute all 40 tokens on p1 then, mooncake predicted 1 s)."""
    c = make_conductor(3, 1, policy=policy)
    c.on_event(BlocksStored(iid("p0"), CHAIN[:8], Tier.DRAM))
    for i in range(3):
        c.instances[iid(f"p{i}")].prefill.assign(RequestId(f"x{i}"), 1.0, 0, 0.0)
    r0 = c.schedule(req("r0", CHAIN, 40), now_s=0.0)
    assert isinstance(r0, Plan) and r0.prefill == "p0" and r0.fetch is None
    for i in (1, 2):
        c.on_event(PrefillFinished(RequestId(f"x{i}"), iid(f"p{i}"), 0.0))
    r1 = c.schedule(req("r1", CHAIN, 40), now_s=0.0)
    assert isinstance(r1, Plan) and r1.prefill == "p1"
    assert r1.fetch is not None and r1.fetch.source == "p0" and r1.fetch.tokens == 32
    assert r1.predicted_ttft_s == pytest.approx(32 * 10e-6 + 0.008)
