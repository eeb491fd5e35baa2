"""``conductor``'s decode choice prices the KV hand-off's tail in the first interval
(``conductor.core.policies.first_interval``), from the NIC book's planned transfers.

Cost model (helpers): prefill 1 ms per new token, decode step 10 ms + 1 ms per request,
transfer 10 us per token; requests are predicted to generate 10 tokens (k = 1, factor 1.5).
"""

from __future__ import annotations

import pytest

from conductor.core.config import SchedulerConfig
from conductor.core.errors import InvalidInput
from conductor.core.events import BlocksStored
from conductor.core.nic import NicBook
from conductor.core.plan import Plan
from conductor.core.policies.decode import tbt_factor
from conductor.core.types import Tier

from .helpers import hashes, iid, make_conductor, req


def test_planned_transfers_chain_on_each_ingress_and_egress() -> None:
    book = NicBook()
    p0, p1, d0 = iid("p0"), iid("p1"), iid("d0")
    book.later(1.0, p0, d0, 0.5, 0.25)  # requested at 1.0, may stream from 0.5
    book.later(2.0, p1, d0, 0.6, 0.5)  # chained behind it on d0's ingress
    assert book.planned_in_s[d0] == pytest.approx(1.25)
    assert book.egress_free_s(p0) == pytest.approx(0.75)
    assert book.egress_free_s(p1) == pytest.approx(1.1)
    # a hand-off p0 -> d0 streaming from 0.9, its prefill ending at 1.0, 0.25 s long: it is
    # requested with the first planned one (after it: d0 busy until 0.75) and before the
    # second, so it ends at 1.15: 0.15 s after the prefill
    assert book.handoff_tail_s(p0, d0, 0.9, 1.0, 0.25) == pytest.approx(0.15)
    assert book.handoff_tail_s(p0, iid("d1"), 0.9, 1.0, 0.25) == pytest.approx(0.15)
    assert book.handoff_tail_s(p0, iid("d1"), 0.9, 2.0, 0.25) == 0.0
    # p1 -> d0 for 1 s from 0.3: requested at 1.9 it goes before the second planned one
    # (d0 free at 0.75: no tail); at 2.0, after it (d0 busy until 1.25: 0.25 s)
    assert book.handoff_tail_s(p1, d0, 0.3, 1.9, 1.0) == 0.0
    assert book.handoff_tail_s(p1, d0, 0.3, 2.0, 1.0) == pytest.approx(0.25)
    book.book(p0, d0, 3.0, 1.0)  # a booked transfer moves both plans on
    assert book.planned_in_s[d0] == 4.0 and book.egress_free_s(p0) == 4.0


def test_the_decode_choice_avoids_an_ingress_with_a_hand_off_planned() -> None:
    """Two idle decode instances; a 1 s hand-off is planned into d0. r1 (40 tokens, prefill
    40 ms from 0, its KV 0.4 ms on the wire) would wait for it there: tail 1.0004 - 0.04."""
    c = make_conductor(1, 2, policy="conductor")
    c.nic.later(0.01, iid("p9"), iid("d0"), 0.0, 1.0)
    plan = c.schedule(req("r1", hashes(), 40), 0.0)
    assert isinstance(plan, Plan) and plan.decode == "d1"
    assert tbt_factor(10) == 1.5
    assert plan.predicted_tbt_s == pytest.approx(0.011 * 1.5)
    # the same state without the tail term: load-balancing decoding takes the first, d0
    c2 = make_conductor(1, 2, policy="conductor", policy_params={"first_interval": 0.0})
    c2.nic.later(0.01, iid("p9"), iid("d0"), 0.0, 1.0)
    plan2 = c2.schedule(req("r1", hashes(), 40), 0.0)
    assert isinstance(plan2, Plan) and plan2.decode == "d0"


def _busy_d1_plan(tail_s: float, first_token: str) -> Plan:
    """r1's plan with d1 running 5 more requests than d0 and a hand-off of ``tail_s``
    planned into d0."""
    c = make_conductor(1, 2, policy="conductor", first_token=first_token)
    d1 = c.instances[iid("d1")].decode
    for i in range(5):
        d1.admit(f"x{i}", 1, 0, started=True)  # type: ignore[arg-type]
    c.nic.later(0.01, iid("p9"), iid("d0"), 0.0, tail_s)
    plan = c.schedule(req("r1", hashes(), 40), 0.0)
    assert isinstance(plan, Plan)
    return plan


def test_a_busier_instance_wins_when_the_other_s_tail_costs_more() -> None:
    """d1 runs 5 more requests (5 ms more per step: 7.5 ms of TBT); d0's planned hand-off
    leaves r1's KV 10 ms late (TBT + 10 ms with k = 1): d1. With a 5 ms tail: d0."""
    for tail_s, want in ((0.0496, "d1"), (0.0446, "d0")):
        plan = _busy_d1_plan(tail_s, "prefill")
        assert plan.decode == want, tail_s
        busy = 0.016 * 1.5
        idle = 0.011 * 1.5 + (tail_s + 0.0004 - 0.04)
        assert plan.predicted_tbt_s == pytest.approx(min(busy, idle))


def test_with_the_decode_engine_s_first_token_the_tail_goes_to_ttft() -> None:
    """``first_token="decode"``: TBT is the plain step (no first-interval factor, no tail)
    and the choice takes the least step + tail. d1's 5 more requests cost 5 ms a step; d0's
    tail is 10 ms (d1 wins) or 4 ms (d0 wins). With the prefill's first token (the test
    above) the step difference is 7.5 ms and a 5 ms tail still goes to d0."""
    for tail_s, want, tbt in ((0.0496, "d1", 0.016), (0.0436, "d0", 0.011)):
        plan = _busy_d1_plan(tail_s, "decode")
        assert plan.decode == want, tail_s
        assert plan.predicted_tbt_s == pytest.approx(tbt)


def test_the_first_token_source_is_checked() -> None:
    with pytest.raises(InvalidInput, match="first_token"):
        SchedulerConfig(first_token="client")


def test_the_decode_choice_takes_the_instance_that_holds_the_prompt() -> None:
    """r1 (4000 tokens, 1000 blocks): p0 holds all but the last block, so its prefill is 4
    ms while the whole KV is 40 ms on the wire, a 36 ms tail on any decode instance, but
    not on d1 once its KV events say it holds the prompt (an earlier turn it decoded): the
    hand-off then carries one token. The events go to the decode index, never to the one
    prefill placement reads (no fetch from a decode engine)."""
    blocks = hashes(*range(1000))
    for told, want, tbt in ((False, "d0", 0.0165 + 0.036), (True, "d1", 0.0165)):
        c = make_conductor(1, 2, policy="conductor")
        c.on_event(BlocksStored(iid("p0"), blocks[:999], Tier.DRAM))
        if told:
            c.on_event(BlocksStored(iid("d1"), blocks, Tier.GPU))
        plan = c.schedule(req("r1", blocks, 4000), 0.0)
        assert isinstance(plan, Plan) and plan.decode == want, told
        assert plan.predicted_tbt_s == pytest.approx(tbt)
        assert c.index.match(blocks).local_blocks == {iid("p0"): 999}
    assert c.decode_index.held_blocks(blocks) == {iid("d1"): 1000}
    # the booked hand-off carries the one token d1 lacks: 10 us on its ingress, streamed
    # from the prefill's start (0: no queue)
    assert c.nic.planned_in_s[iid("d1")] == pytest.approx(1e-5)
