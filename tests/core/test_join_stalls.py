"""With ``handoff="load"`` a decode engine reads each joining request's KV inside its step,
stalling every request decoding there; ``conductor``'s decode choice prices the stalls of
the joins a request will sit through (``conductor.core.policies.join_stalls``), from the
joins of the last ``E[out] x step`` seconds.

Cost model (helpers): decode step 10 ms + 1 ms per request, transfer 10 us per token;
requests are predicted to generate 10 tokens (k = 1).
"""

from __future__ import annotations

import random

import pytest

from conductor.core.config import SchedulerConfig
from conductor.core.errors import InvalidInput
from conductor.core.events import PrefillFinished
from conductor.core.plan import Plan
from conductor.core.policies.join_stalls import join_stall_s
from conductor.core.scheduler import Scheduler
from conductor.core.state import JOIN_LOG, DecodeState
from conductor.core.types import RequestId

from .helpers import hashes, iid, make_conductor, req


def test_the_stall_share_is_the_top_k_of_the_window_over_k() -> None:
    d = DecodeState()
    assert join_stall_s(d, 10.0, 2.0, 2) == 0.0  # nobody joined
    for t, stall in ((0.0, 0.5), (9.0, 0.2), (9.5, 0.3), (9.8, 0.1)):
        d.record_join(t, stall)
    # the window [8, 10] holds 0.2, 0.3, 0.1: the two longest over k = 2
    assert join_stall_s(d, 10.0, 2.0, 2) == pytest.approx((0.3 + 0.2) / 2)
    # fewer joins than k: all of them, over k
    assert join_stall_s(d, 10.0, 2.0, 5) == pytest.approx((0.2 + 0.3 + 0.1) / 5)
    assert join_stall_s(d, 10.0, 20.0, 1) == pytest.approx(0.5)
    assert join_stall_s(d, 10.0, 0.1, 1) == 0.0  # none in the last 0.1 s


def _reference(log: list[tuple[float, float]], now_s: float, life_s: float, k: int) -> float:
    """The share by its definition: the last JOIN_LOG joins, those of the window, the k
    longest (newest first when fewer), summed, over k."""
    recent = [s for t, s in reversed(log[-JOIN_LOG:]) if t >= now_s - life_s]
    if not recent:
        return 0.0
    top = recent if len(recent) <= k else sorted(recent, reverse=True)[:k]
    return sum(top) / k


def test_the_share_equals_its_definition_over_a_long_log_and_repeated_questions() -> None:
    """3,000 joins (the log forgets its oldest half twice over), each followed by questions
    over windows and k's that repeat (the remembered share) and change; every answer equal,
    to the bit, to the definition's; the log keeps the last JOIN_LOG joins."""
    rng = random.Random(7)
    d = DecodeState()
    log: list[tuple[float, float]] = []
    t = 0.0
    for _ in range(3000):
        t += rng.expovariate(50.0)
        stall = rng.choice((0.0, rng.random() * 0.05))
        d.record_join(t, stall)
        if stall > 0.0:
            log.append((t, stall))
        for life, k in ((2.0, 3), (2.0, 3), (rng.random() * 20.0, rng.randint(1, 40)), (0.0, 1)):
            assert join_stall_s(d, t, life, k) == _reference(log, t, life, k)
    assert d.joins == log[-JOIN_LOG:]
    assert JOIN_LOG <= len(d.join_times) <= 2 * JOIN_LOG


def test_a_join_reported_out_of_order_keeps_the_log_sorted() -> None:
    d = DecodeState()
    d.record_join(5.0, 0.1)
    d.record_join(4.0, 0.2)  # late: counted at the newest time
    assert d.joins == [(5.0, 0.1), (5.0, 0.2)]
    assert join_stall_s(d, 5.5, 1.0, 1) == 0.2


def _started(c: Scheduler, rid: str, prompt: int, now: float) -> Plan:
    """Place ``rid`` and end its prefill at ``now``."""
    plan = c.schedule(req(rid, hashes(), prompt), now)
    assert isinstance(plan, Plan)
    c.on_event(PrefillFinished(RequestId(rid), plan.prefill, now))
    return plan


def test_a_load_hand_off_is_recorded_as_a_join_when_the_decode_starts() -> None:
    load = make_conductor(1, 1, policy="conductor", handoff="load", first_token="decode")
    plan = _started(load, "r1", 400, 0.5)
    assert list(load.instances[plan.decode].decode.joins) == [
        (0.5, pytest.approx(load.cost.transfer_s(400)))
    ]
    stream = make_conductor(1, 1, policy="conductor", first_token="decode")
    plan = _started(stream, "r1", 400, 0.5)
    assert list(stream.instances[plan.decode].decode.joins) == []


def test_the_decode_choice_avoids_the_instance_whose_joins_stall_it() -> None:
    """d1 runs one request more than d0 (1 ms a step); a 4000-token request (40 ms of load)
    joined d0 0.05 s ago, within the 10 x 11 ms the new request will decode: its TBT on d0
    would be 11 + 40 ms, on d1 12 ms: d1. Had it joined 0.2 s ago, outside that window: d0.
    Without ``handoff="load"`` the stall is not priced: d0."""
    for ago, handoff, want, tbt in (
        (0.05, "load", "d1", 0.012),
        (0.2, "load", "d0", 0.011),
        (0.05, "stream", "d0", 0.011),
    ):
        c = make_conductor(1, 2, policy="conductor", handoff=handoff, first_token="decode")
        c.instances[iid("d1")].decode.admit(RequestId("x"), 1, 0, started=True)
        c.instances[iid("d0")].decode.record_join(1.0 - ago, c.cost.transfer_s(4000))
        plan = c.schedule(req("r1", hashes(), 40), 1.0)
        assert isinstance(plan, Plan)
        assert (plan.decode, plan.predicted_tbt_s) == (want, pytest.approx(tbt)), ago


def test_the_hand_off_mode_is_checked() -> None:
    with pytest.raises(InvalidInput, match="handoff"):
        SchedulerConfig(handoff="pigeon")


def test_the_requests_still_in_prefill_count_as_joins_to_come() -> None:
    """A request assigned to the instance whose prefill has not ended will stall its step when
    it joins: its stall counts beside the window's (top k, over k) until its decode starts
    or it is released."""
    d = DecodeState()
    d.record_join(9.5, 0.1)
    d.admit(RequestId("a"), 100, 10, stall_s=0.3)
    d.admit(RequestId("b"), 100, 10, stall_s=0.2)
    d.admit(RequestId("c"), 100, 10, started=True, stall_s=0.9)  # already decoding: none
    assert d.pending_stalls == {RequestId("a"): 0.3, RequestId("b"): 0.2}
    assert join_stall_s(d, 10.0, 1.0, 2) == pytest.approx((0.3 + 0.2) / 2)
    assert join_stall_s(d, 10.0, 1.0, 4) == pytest.approx((0.1 + 0.3 + 0.2) / 4)
    assert join_stall_s(d, 10.0, 0.1, 4) == pytest.approx((0.3 + 0.2) / 4)  # window empty
    d.start(RequestId("a"))
    d.release(RequestId("b"))
    assert d.pending_stalls == {}
    assert join_stall_s(d, 10.0, 1.0, 2) == pytest.approx(0.1 / 2)


def test_a_placed_load_hand_off_is_pending_on_its_decode_until_the_prefill_ends() -> None:
    c = make_conductor(1, 1, policy="conductor", handoff="load", first_token="decode")
    plan = c.schedule(req("r1", hashes(), 400), 0.0)
    assert isinstance(plan, Plan)
    d = c.instances[plan.decode].decode
    assert d.pending_stalls == {RequestId("r1"): pytest.approx(c.cost.transfer_s(400))}
    c.on_event(PrefillFinished(RequestId("r1"), plan.prefill, 0.5))
    assert d.pending_stalls == {}
    assert d.joins == [(0.5, pytest.approx(c.cost.transfer_s(400)))]


def test_the_decode_choice_spreads_joins_that_are_still_in_prefill() -> None:
    """A 4000-token request placed on d0 a moment ago (40 ms of load, its prefill still
    running) will stall the next one's decode there: the next goes to d1 although d1 runs one
    request more."""
    c = make_conductor(1, 2, policy="conductor", handoff="load", first_token="decode")
    c.instances[iid("d1")].decode.admit(RequestId("x"), 1, 0, started=True)
    c.instances[iid("d0")].decode.admit(RequestId("y"), 4000, 10, stall_s=c.cost.transfer_s(4000))
    plan = c.schedule(req("r1", hashes(), 40), 1.0)
    assert isinstance(plan, Plan)
    assert plan.decode == "d1"


def _reference_with_pending(
    log: list[tuple[float, float]], pending: list[float], now_s: float, life_s: float, k: int
) -> float:
    """The share by its definition: the window's stalls (oldest first) and the pending ones,
    the k longest when more than k, summed, over k."""
    stalls = [s for t, s in log[-JOIN_LOG:] if t >= now_s - life_s] + pending
    if len(stalls) > k:
        stalls = sorted(stalls, reverse=True)[:k]
    return sum(stalls) / k if stalls else 0.0


def test_the_share_with_pending_joins_equals_its_definition() -> None:
    """Joins, placements and starts interleaved at random over a long log; every answer
    (the window's remembered part and the pending ones) equal to the definition's."""
    rng = random.Random(11)
    d = DecodeState()
    log: list[tuple[float, float]] = []
    pending: dict[RequestId, float] = {}
    t = 0.0
    for i in range(2000):
        t += rng.expovariate(50.0)
        rid = RequestId(f"r{i}")
        stall = rng.random() * 0.05
        d.admit(rid, 10, 1, stall_s=stall)
        pending[rid] = stall
        if pending and rng.random() < 0.9:
            done = rng.choice(list(pending))
            if rng.random() < 0.8:
                d.start(done)
                d.record_join(t, pending[done])
                log.append((t, pending[done]))
            else:
                d.release(done)
            del pending[done]
        assert d.pending_stalls == pending
        assert set(pending) <= set(d.requests())
        for life, k in ((2.0, 3), (2.0, 3), (rng.random() * 20.0, rng.randint(1, 40)), (0.0, 1)):
            want = _reference_with_pending(log, list(pending.values()), t, life, k)
            assert join_stall_s(d, t, life, k) == pytest.approx(want, rel=1e-12, abs=0.0)
