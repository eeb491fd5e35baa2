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


def test_a_hand_off_whose_prefill_ends_early_is_booked_then_and_the_plans_rechained() -> None:
    """A prefill predicted to end at 20 (behind a queue the engine did not keep) ends at 3:
    its hand-off is booked from 3, and the egress and ingress it had planned are free
    again by 3 + its seconds, not 22; the transfer still pending behind it is chained anew."""
    book = NicBook()
    a, b, c = iid("a"), iid("b"), iid("c")
    book.later(20.0, a, b, 18.0, 2.0, key="r1")  # predicted: streams 18 -> 20, on the wire to 22
    book.later(25.0, a, c, 23.0, 1.0, key="r2")
    assert (book.planned_out_s[a], book.planned_in_s[b], book.planned_in_s[c]) == (24.0, 20.0, 24.0)
    book.handoff_now("r1", 3.0)  # its prefill ended at 3
    assert (book.out_free_s[a], book.in_free_s[b]) == (5.0, 5.0)
    assert (book.planned_out_s[a], book.planned_in_s[b], book.planned_in_s[c]) == (24.0, 5.0, 24.0)
    book.handoff_now("r1", 4.0)  # once only
    assert book.out_free_s[a] == 5.0
    book.release(30.0)  # the heap skips r1's entry and books r2's at its request time
    assert (book.out_free_s[a], book.in_free_s[c], book.in_free_s[b]) == (24.0, 24.0, 5.0)
    assert book.pending == [] and book.dropped == set() and book.keyed == book.key_of == {}


def test_a_hand_off_due_already_is_not_booked_twice_and_a_cancel_frees_its_plan() -> None:
    book = NicBook()
    a, b = iid("a"), iid("b")
    book.later(2.0, a, b, 1.0, 1.0, key="r1")
    book.handoff_now("r1", 2.5)  # released at 2 by its request time: booked once, 1 -> 2
    assert (book.out_free_s[a], book.in_free_s[b]) == (2.0, 2.0)
    book.later(9.0, a, b, 8.0, 1.0, key="r2")
    assert book.planned_in_s[b] == 9.0
    book.cancel("r2", 3.0)  # its request ended before its prefill did
    assert (book.planned_out_s[a], book.planned_in_s[b]) == (2.0, 2.0)
    book.release(10.0)
    assert book.out_free_s[a] == 2.0 and book.pending == [] and book.dropped == set()


def test_the_scheduler_books_a_hand_off_when_its_prefill_finishes() -> None:
    """p0 has 10 s queued: r0's plan has its hand-off stream from 10 s; when r0's prefill
    really finishes at 0.5 s, the scheduler books it then, so the next plan's hand-off tail
    no longer waits for p0's egress until 10 s."""
    c = make_conductor(1, 1)
    c.instances[iid("p0")].prefill.assign(RequestId("x"), 10.0, 0, 0.0)
    r0 = c.schedule(req("r0", CHAIN, 40), now_s=0.0)
    assert isinstance(r0, Plan) and r0.prefill == "p0"
    assert c.nic.planned_out_s[iid("p0")] == pytest.approx(10.0 + 40 * 10e-6)
    c.on_event(PrefillFinished(RequestId("x"), iid("p0"), 0.4))
    c.on_event(PrefillFinished(RequestId("r0"), iid("p0"), 0.5))
    assert c.nic.planned_out_s[iid("p0")] == pytest.approx(0.5 + 40 * 10e-6)
    assert c.nic.out_free_s[iid("p0")] == pytest.approx(0.5 + 40 * 10e-6)
    assert c.nic.keyed == {}


def test_a_hand_off_waits_only_for_the_transfers_requested_before_it() -> None:
    """FIFO per NIC direction in request order: b's ingress has a hand-off planned to be
    requested at 20 (streaming from 18); one requested at 5 goes before it, one requested
    at 25 (or at 20, made later) after it."""
    book = NicBook()
    a, b, c = iid("a"), iid("b"), iid("c")
    book.book(c, b, 0.0, 1.0)  # booked: b's ingress busy until 1
    book.later(20.0, a, b, 18.0, 2.0, key="r1")
    assert book.planned_before(25.0) == ({b: 20.0}, {c: 1.0, a: 20.0})
    assert book.planned_before(5.0) == ({b: 1.0}, {c: 1.0})
    assert book.planned_before(19.0) == ({b: 1.0}, {c: 1.0})
    assert book.planned_before(20.0) == ({b: 20.0}, {c: 1.0, a: 20.0})  # together: in order
    book.handoff_now("r1", 3.0)  # dropped from the chains, booked from 3 (b free at 1)
    assert book.planned_before(5.0) == ({b: 5.0}, {c: 1.0, a: 5.0})
