"""Late binding (``conductor.core.late_binding``): requests held until the cluster can start
them, released in deadline order (``PLAIN``) or shortest prefill first with aging and a
deadline guard (``age_weight``), with their TTFT budget reduced by the wait.

Cost model (helpers): prefill 1 ms per new token, decode step 10 ms + 1 ms per request,
transfer 10 us per token, KV capacity 100,000 tokens.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from conductor.core.events import BlocksStored
from conductor.core.late_binding import HoldQueue
from conductor.core.late_binding_rule import (
    CLAIM_LAG_FLOOR_S,
    HOLD_AGE_WEIGHT,
    HOLD_HEADROOM_MARGIN,
    LateBinding,
    claim_lag_s,
    late_binding_of,
)
from conductor.core.plan import Plan, Rejection
from conductor.core.types import RequestId, Tier

from .helpers import hashes, iid, make_conductor, req

PLAIN = LateBinding(horizon_s=0.0, decode_aware=False, nic_aware=False)


def test_conductor_brings_late_binding_and_a_run_can_switch_it_off() -> None:
    h = HOLD_HEADROOM_MARGIN
    on = make_conductor(1, 1, policy="conductor")
    assert late_binding_of(on) == LateBinding(0.0, True, 0.1, True, HOLD_AGE_WEIGHT, True, h)
    fifo = {"late_binding_age_weight": math.inf}
    by_deadline = make_conductor(1, 1, policy="conductor", policy_params=fifo)
    assert late_binding_of(by_deadline) == LateBinding(0.0, True, 0.1, True, math.inf, True, h)
    off = make_conductor(1, 1, policy="conductor", policy_params={"late_binding": 0.0})
    assert late_binding_of(off) is None
    wide = make_conductor(1, 1, policy="conductor", policy_params={"late_binding_horizon_s": 2.0})
    assert late_binding_of(wide) == LateBinding(2.0, True, 0.1, True, HOLD_AGE_WEIGHT, True, h)
    keep = {"late_binding_reject_ahead": 0.0, "late_binding_headroom_margin": 1.0}
    lenient = make_conductor(1, 1, policy="conductor", policy_params=keep)
    assert late_binding_of(lenient) == LateBinding(0.0, True, 0.1, True, HOLD_AGE_WEIGHT, False)
    assert late_binding_of(make_conductor(1, 1, policy="mooncake")) is None
    with pytest.raises(ValueError, match="horizon_s"):
        LateBinding(-1.0)
    with pytest.raises(ValueError, match=r"age_weight must be >= 0, got -0\.1"):
        LateBinding(0.0, age_weight=-0.1)
    with pytest.raises(ValueError, match=r"headroom_margin must be in \[0, 1\], got 1\.5"):
        LateBinding(0.0, headroom_margin=1.5)


def test_a_request_waits_until_the_instance_is_predicted_free() -> None:
    c = make_conductor(1, 1, policy="conductor")
    q = HoldQueue(c, PLAIN)
    first = q.submit(req("r1", hashes(), 40), 0.0)
    assert [type(d) for d in first] == [Plan] and first[0].predicted_ttft_s == pytest.approx(0.04)
    assert q.submit(req("r2", hashes(), 40), 0.01) == [] and len(q) == 1
    assert q.wakeup_s(0.01) == pytest.approx(0.04)  # p0's predicted end, horizon 0
    assert q.release(0.03) == []
    (second,) = q.release(0.04)
    assert isinstance(second, Plan) and second.request_id == "r2"
    assert second.queue_s == 0.0 and second.predicted_ttft_s == pytest.approx(0.04)
    assert len(q) == 0 and q.wakeup_s(0.04) is None


def test_earliest_deadline_goes_first_and_the_wait_counts_against_the_ttft_slo() -> None:
    """TTFT SLO 100 ms. r2 (deadline 0.10) and r3 (own SLO 90 ms from 0.005: deadline
    0.095) wait behind r1 (p0 busy until 0.04); r4's SLO (25 ms) is shorter than p0's
    backlog at its arrival: released at once, and the scheduler rejects it. At 0.04 r3 goes
    first; r2 waits behind it (until 0.08) and then has 20 ms left for a 40 ms prefill."""
    c = make_conductor(1, 1, policy="conductor", admission="early", ttft_slo_s=0.1)
    q = HoldQueue(c, PLAIN)
    q.submit(req("r1", hashes(), 40), 0.0)
    assert q.submit(req("r2", hashes(), 40), 0.0) == []
    assert q.submit(replace(req("r3", hashes(), 40), ttft_slo_s=0.09), 0.005) == []
    (r4,) = q.submit(replace(req("r4", hashes(), 40), ttft_slo_s=0.025), 0.01)
    assert isinstance(r4, Rejection) and r4.code == "ttft_slo"
    (r3,) = q.release(0.04)
    assert isinstance(r3, Plan) and r3.request_id == "r3"
    (r2,) = q.release(0.08)
    assert isinstance(r2, Rejection) and r2.code == "ttft_slo"
    assert "SLO 0.020s" in r2.reason


def test_a_request_past_its_deadline_is_rejected_without_a_decision() -> None:
    c = make_conductor(1, 1, policy="conductor", admission="early", ttft_slo_s=1.0)
    q = HoldQueue(c, LateBinding(0.0, decode_aware=True, nic_aware=False))
    c.instances[iid("d0")].decode.admit(RequestId("x"), 99_995, 0, started=True)  # no room
    assert q.submit(req("r1", hashes(), 40), 0.0) == []
    (late,) = q.release(1.5)  # the shell woke it late
    assert isinstance(late, Rejection) and late.code == "ttft_slo"
    assert late.reason == "waited 1.500s, past its TTFT SLO"
    assert c.inflight() == 0


def test_a_request_is_held_while_no_decode_instance_has_room_until_its_budget_runs_out() -> None:
    c = make_conductor(1, 1, policy="conductor", admission="early")
    q = HoldQueue(c, LateBinding(0.0, decode_aware=True, nic_aware=False))
    d0 = c.instances[iid("d0")].decode
    d0.admit(RequestId("x"), 99_995, 0, started=True)  # 5 tokens of KV left
    assert q.submit(req("r1", hashes(), 40), 0.0) == []
    # TTFT SLO 30 s; it must go when 30 - 0.04 (its TTFT) is used up, decode or not
    assert q.wakeup_s(0.0) == pytest.approx(29.96)
    d0.release(RequestId("x"))
    (plan,) = q.release(1.0)
    assert isinstance(plan, Plan) and plan.decode == "d0"


def test_the_margin_holds_a_request_whose_predicted_tbt_is_near_the_slo() -> None:
    """Requests are predicted to generate 200 tokens: TBT = step x 1.025 (k = 20 longest
    intervals). d0 runs 86 requests; with r1 the step is 10 + 87 ms."""
    c = make_conductor(1, 1, policy="conductor", admission="off", output_prior_tokens=200)
    d0 = c.instances[iid("d0")].decode
    for i in range(86):
        d0.admit(RequestId(f"x{i}"), 1, 0, started=True)
    # step(87) = 97 ms, x 1.025 = 99.4 ms: fits the 100 ms SLO, not 90% of it
    strict = HoldQueue(c, LateBinding(0.0, decode_aware=True, tbt_margin=0.1, nic_aware=False))
    assert strict.submit(req("r1", hashes(), 40), 0.0) == []
    loose = HoldQueue(c, LateBinding(0.0, decode_aware=True, tbt_margin=0.0, nic_aware=False))
    (plan,) = loose.submit(req("r2", hashes(), 40), 0.0)
    assert isinstance(plan, Plan)
    assert plan.predicted_tbt_s == pytest.approx(0.097 * 1.025)


def test_near_the_smallest_step_the_margin_is_taken_of_the_headroom() -> None:
    """Requests are predicted to generate 10 tokens: TBT = step x 1.5. Alone on an idle
    instance r1's TBT would be 11 ms x 1.5 = 16.5 ms. TBT SLO 21 ms: 90% of it (18.9 ms)
    leaves 2.4 ms for load; the headroom limit is 16.5 + 0.7 x (21 - 16.5) = 19.65 ms.
    With 2 requests running on d0 r1's TBT is 13 ms x 1.5 = 19.5 ms: held by the margin
    of the SLO, placed with the headroom margin. With a 15 ms SLO no load could bring it
    under either limit (16.5 ms alone): it is not held at all."""
    for slo, rule, placed in (
        (0.021, LateBinding(0.0, tbt_margin=0.1, nic_aware=False), False),
        (0.021, LateBinding(0.0, tbt_margin=0.1, nic_aware=False, headroom_margin=0.3), True),
        (0.015, LateBinding(0.0, tbt_margin=0.1, nic_aware=False, headroom_margin=0.3), True),
        (0.015, LateBinding(0.0, tbt_margin=0.1, nic_aware=False), True),
    ):
        c = make_conductor(1, 1, policy="conductor", admission="off", tbt_slo_s=slo)
        d0 = c.instances[iid("d0")].decode
        for i in range(2):
            d0.admit(RequestId(f"x{i}"), 1, 0, started=True)
        got = HoldQueue(c, rule).submit(req("r1", hashes(), 40), 0.0)
        if not placed:
            assert got == [], (slo, rule)
            continue
        (plan,) = got
        assert isinstance(plan, Plan) and plan.predicted_tbt_s == pytest.approx(0.0195)


def test_a_short_output_is_not_held_for_its_own_first_interval() -> None:
    """r1 may generate 2 tokens (max_tokens): its one interval is the first, TBT = step x 1.5
    (81 ms x 1.5 = 121.5 ms with d0's 70 running requests) however long it waits. The decode
    condition reads it with the factor of the same request without max_tokens (200 tokens
    predicted: 81 ms x 1.025 = 83 ms, within 90% of the SLO): r1 goes, admission decides
    it, and r2 behind it is not blocked (held for its own factor, r1 blocked r2 too)."""
    c = make_conductor(2, 1, policy="conductor", admission="off", output_prior_tokens=200)
    d0 = c.instances[iid("d0")].decode
    for i in range(70):
        d0.admit(RequestId(f"x{i}"), 1, 0, started=True)
    q = HoldQueue(c, LateBinding(0.0, decode_aware=True, tbt_margin=0.1, nic_aware=False))
    (p1,) = q.submit(req("r1", hashes(), 40, max_tokens=2), 0.0)
    assert isinstance(p1, Plan) and p1.predicted_tbt_s == pytest.approx(0.081 * 1.5)
    (p2,) = q.submit(req("r2", hashes(), 40), 0.0)  # on p1; step(72) = 82 ms x 1.025
    assert isinstance(p2, Plan) and p2.prefill == iid("p1")
    assert p2.predicted_tbt_s == pytest.approx(0.082 * 1.025)


def test_an_instance_whose_egress_is_still_sending_is_not_free() -> None:
    c = make_conductor(1, 1, policy="conductor")
    c.nic.book(iid("p0"), iid("d0"), 0.0, 0.5)  # a hand-off holds p0's NIC until 0.5
    q = HoldQueue(c, LateBinding(0.0, decode_aware=False, nic_aware=True))
    assert q.submit(req("r1", hashes(), 40), 0.0) == []
    assert q.wakeup_s(0.0) == pytest.approx(0.5)
    (plan,) = q.release(0.5)
    assert isinstance(plan, Plan)
    blind = HoldQueue(make_conductor(1, 1, policy="conductor"), PLAIN)
    assert len(blind.submit(req("r1", hashes(), 40), 0.0)) == 1


def test_cpp_is_considered_only_when_nobody_else_is_held() -> None:
    """A 20,000-token prompt takes 20 s on one node, over half the 30 s TTFT SLO: with CPP
    enabled and four idle nodes it is pipelined. Held behind busy nodes with a second such
    request waiting, it is placed on one node when they free up (the cluster is busy); the
    second, with nobody behind it, is pipelined over the three nodes left idle."""
    big = 20_000
    alone = make_conductor(4, 1, policy="conductor", cpp_enabled=True)
    (plan,) = HoldQueue(alone, PLAIN).submit(req("r1", hashes(), big), 0.0)
    assert isinstance(plan, Plan) and plan.cpp is not None and len(plan.cpp.nodes) >= 2
    busy = make_conductor(4, 1, policy="conductor", cpp_enabled=True)
    for i in range(4):
        busy.instances[iid(f"p{i}")].prefill.assign(RequestId(f"x{i}"), 1.0, 0, 0.0)
    q = HoldQueue(busy, PLAIN)
    assert q.submit(req("r1", hashes(), big), 0.0) == []
    assert q.submit(req("r2", hashes(), big), 0.0) == []
    first, second = q.release(1.0)
    assert isinstance(first, Plan) and first.cpp is None and first.prefill == "p0"
    assert isinstance(second, Plan) and second.cpp is not None
    assert second.cpp.nodes == ("p1", "p2", "p3")


def test_a_replica_counts_a_freed_instance_free_only_after_the_replicas_before_it() -> None:
    """Two replicas: p0 is replica 0's to claim at once and replica 1's 0.01 s later, p1 the
    other way round, so the two do not send their held heads to the instance that just
    freed (each deciding before it sees the other's choice)."""
    lag = claim_lag_s(0.002)
    assert lag == CLAIM_LAG_FLOOR_S == 0.01 and claim_lag_s(0.02) == 0.04
    queues = []
    for k in (0, 1):
        c = make_conductor(2, 1, policy="conductor")
        c.schedule(req("a", hashes(), 1000), 0.0)  # p0 busy until 1.0
        c.schedule(req("b", hashes(), 2000), 0.0)  # p1 busy until 2.0
        queues.append(HoldQueue(c, PLAIN, (k, 2, lag)))
    busy = {i.spec.instance_id: i.prefill.busy_until_s for i in queues[0].scheduler.pools()[0]}
    assert busy == {iid("p0"): pytest.approx(1.0), iid("p1"): pytest.approx(2.0)}
    assert queues[0].free_at_s() == pytest.approx(1.0)
    assert queues[1].free_at_s() == pytest.approx(1.01)
    for q in queues:
        assert q.submit(req("r", hashes(), 40), 0.5) == []
    assert len(queues[0].release(1.0)) == 1 and queues[1].release(1.0) == []
    assert queues[1].wakeup_s(1.0) == pytest.approx(1.01)
    assert len(queues[1].release(1.01)) == 1
    alone = HoldQueue(queues[0].scheduler, PLAIN, (0, 1, lag))  # one replica: no stagger
    assert alone.free_at_s() == queues[0].free_at_s()
    late = HoldQueue(queues[0].scheduler, PLAIN, (1, 2, lag))  # p0 busy until 1.04 now
    assert late.free_at_s() == pytest.approx(1.04 + lag)
    late.claim = (0, 2, lag)  # the membership changed: now replica 0 of 2
    assert late.free_at_s() == pytest.approx(1.04)


def test_a_withdrawn_request_leaves_the_queue_and_the_rest_keep_their_order() -> None:
    """r1 occupies p0 until 0.04; r2, r3 and r4 wait (deadlines 30, 30.001, 30.002). r3's
    client goes away: it leaves without a decision, nothing of it is in the scheduler, and
    at 0.04 r2 goes; r4 follows when r2's prefill ends."""
    c = make_conductor(1, 1, policy="conductor")
    q = HoldQueue(c, PLAIN)
    q.submit(req("r1", hashes(), 40), 0.0)
    for i, rid in enumerate(("r2", "r3", "r4")):
        assert q.submit(req(rid, hashes(), 40), 0.001 * i) == []
    assert q.withdraw(RequestId("r3")) is True
    assert len(q) == 2 and c.inflight() == 1
    assert q.withdraw(RequestId("r3")) is False  # gone already
    assert q.withdraw(RequestId("r1")) is False  # placed, not held
    (r2,) = q.release(0.04)
    assert isinstance(r2, Plan) and r2.request_id == "r2"
    (r4,) = q.release(0.08)
    assert isinstance(r4, Plan) and r4.request_id == "r4"
    assert len(q) == 0 and c.inflight() == 3


def test_withdrawing_the_head_clears_its_give_up_time() -> None:
    """r1 waits for decode room: its give-up time (29.96) is the wakeup. Withdrawn, the
    queue is empty and asks for no wakeup; a withdrawal from the middle keeps the heap
    ordered (earliest deadline first, the withdrawn one never placed)."""
    c = make_conductor(1, 1, policy="conductor", admission="early")
    q = HoldQueue(c, LateBinding(0.0, decode_aware=True, nic_aware=False))
    c.instances[iid("d0")].decode.admit(RequestId("x"), 99_995, 0, started=True)
    assert q.submit(req("r1", hashes(), 40), 0.0) == []
    assert q.wakeup_s(0.0) == pytest.approx(29.96)
    assert q.withdraw(RequestId("r1")) is True
    assert len(q) == 0 and q.wakeup_s(0.0) is None
    for i in range(6):
        assert q.submit(replace(req(f"s{i}", hashes(), 40), ttft_slo_s=10.0 - i), 0.0) == []
    assert q.withdraw(RequestId("s3")) is True  # deadlines 10, 9, 8, 6, 5 are left
    c.instances[iid("d0")].decode.release(RequestId("x"))
    order = [d.request_id for t in (0.0, 0.04, 0.08, 0.12, 0.16) for d in q.release(t)]
    assert order == ["s5", "s4", "s2", "s1", "s0"]  # one per 40 ms prefill of p0
    assert len(q) == 0


AGED = LateBinding(horizon_s=0.0, decode_aware=False, nic_aware=False, age_weight=0.2)


def test_with_an_age_weight_the_shortest_prefill_goes_first() -> None:
    """r1 occupies p0 until 0.04. Held behind it: r2 (400 tokens: 0.4 s, key 0.4 + 0.2 *
    30 = 6.4), then r3 (40 tokens: key 0.04 + 0.2 * 30.001 = 6.0402) and r4 (100 tokens,
    key 6.1004). At 0.04 r3 goes, at 0.08 r4, at 0.18 r2: shortest first. In deadline order
    (``PLAIN``) the same queue releases r2 first."""
    for rule, expected in ((AGED, ["r3", "r4", "r2"]), (PLAIN, ["r2", "r3", "r4"])):
        c = make_conductor(1, 1, policy="conductor")
        q = HoldQueue(c, rule)
        q.submit(req("r1", hashes(), 40), 0.0)
        for rid, n, t in (("r2", 400, 0.0), ("r3", 40, 0.001), ("r4", 100, 0.002)):
            assert q.submit(req(rid, hashes(), n), t) == []
        order: list[str] = []
        while len(q):
            (d,) = q.release(c.instances[iid("p0")].prefill.busy_until_s)
            assert isinstance(d, Plan)
            order.append(d.request_id)
        assert order == expected


def test_waiting_earns_priority_at_the_age_weight() -> None:
    """r2 (400 tokens, key 0.4 + 0.2 * 30) waited 2 s when r3 arrives (40 tokens, key 0.04
    + 0.2 * 32 = 6.44 > 6.4): r2 has earned its 0.36 s of extra prefill and goes first."""
    c = make_conductor(1, 1, policy="conductor")
    q = HoldQueue(c, AGED)
    q.submit(req("r1", hashes(), 3000), 0.0)  # p0 busy until 3.0
    assert q.submit(req("r2", hashes(), 400), 0.0) == []
    assert q.submit(req("r3", hashes(), 40), 2.0) == []
    (first,) = q.release(3.0)
    assert isinstance(first, Plan) and first.request_id == "r2"


def test_the_earliest_deadline_goes_first_when_it_would_miss_waiting_behind_a_shorter_one() -> None:
    """TTFT SLO 1 s. r1 occupies p0 until 0.5; r2 (400 tokens, deadline 1.0) and r3 (40
    tokens, deadline 1.1, the smaller key) wait. At 0.5 r3 first would start r2 at 0.54:
    0.54 + 0.4 s of prefill <= 1.0, so r3 goes. With r2's deadline at 0.9 (own SLO) it
    would miss (0.94 > 0.9): r2 goes first."""
    for slo, expected in ((1.0, "r3"), (0.9, "r2")):
        c = make_conductor(1, 1, policy="conductor", admission="early", ttft_slo_s=1.0)
        q = HoldQueue(c, AGED)
        q.submit(req("r1", hashes(), 500), 0.0)
        assert q.submit(replace(req("r2", hashes(), 400), ttft_slo_s=slo), 0.0) == []
        assert q.submit(req("r3", hashes(), 40), 0.1) == []
        (first,) = q.release(0.5)
        assert isinstance(first, Plan) and first.request_id == expected


def test_a_withdrawn_request_leaves_both_orders() -> None:
    """Ordered by key, the queue keeps a second, deadline order for its guard: a withdrawn
    request (here the earliest deadline, r2) leaves both, and the rest go shortest first."""
    c = make_conductor(1, 1, policy="conductor")
    q = HoldQueue(c, AGED)
    q.submit(req("r1", hashes(), 40), 0.0)
    for rid, n, t in (("r2", 400, 0.0), ("r3", 100, 0.001), ("r4", 40, 0.002)):
        assert q.submit(req(rid, hashes(), n), t) == []
    assert q.withdraw(RequestId("r2")) is True and len(q) == 2
    assert q.withdraw(RequestId("r2")) is False
    order = [d.request_id for t in (0.04, 0.08) for d in q.release(t)]
    assert order == ["r4", "r3"] and len(q) == 0 and q.wakeup_s(0.08) is None


def test_a_cached_prefix_counts_in_the_queue_order() -> None:
    """Block size 4. r3 (40 uncached tokens, key 0.04 + 0.2 * 30 = 6.04) arrives first;
    r2 (400 tokens, all 100 blocks cached on p0: only the last token is computed, 1 ms,
    key 0.001 + 0.2 * 30.001 = 6.0012) overtakes it. Counted uncached (0.4 s) r2 would
    wait, and so it would in deadline order."""
    c = make_conductor(1, 1, policy="conductor")
    chain = hashes(*range(100))
    c.on_event(BlocksStored(iid("p0"), chain, Tier.DRAM))
    q = HoldQueue(c, AGED)
    q.submit(req("r1", hashes(), 40), 0.0)
    assert q.submit(req("r3", hashes(), 40), 0.0) == []
    assert q.submit(req("r2", chain, 400), 0.001) == []
    (first,) = q.release(0.04)
    assert isinstance(first, Plan) and first.request_id == "r2"
    assert first.local_tokens == 399


def test_a_request_held_for_decode_room_does_not_hold_up_the_earliest_deadline() -> None:
    """d0 has 60,000 of its 100,000 KV tokens reserved. r1 occupies p0 until 0.04; r2 (40
    tokens) and r3 (50,000 tokens, all cached: key 0.001 + 0.2 * 30.001, below r2's 0.04 +
    0.2 * 30) wait. At 0.04 r3 comes first by key but its KV does not fit on d0; r2, the
    earliest deadline, goes instead, and r3 stays held until its budget runs out."""
    c = make_conductor(1, 1, policy="conductor", admission="early")
    chain = hashes(*range(12_500))
    c.on_event(BlocksStored(iid("p0"), chain, Tier.DRAM))
    c.instances[iid("d0")].decode.admit(RequestId("x"), 60_000, 0, started=True)
    rule = LateBinding(0.0, decode_aware=True, nic_aware=False, age_weight=0.2)
    q = HoldQueue(c, rule)
    (r1,) = q.submit(req("r1", hashes(), 40), 0.0)
    assert isinstance(r1, Plan)
    assert q.submit(req("r2", hashes(), 40), 0.0) == []
    assert q.submit(req("r3", chain, 50_000), 0.001) == []
    (r2,) = q.release(0.04)
    assert isinstance(r2, Plan) and r2.request_id == "r2"
    assert len(q) == 1
    assert q.wakeup_s(0.04) == pytest.approx(0.08)  # p0 free again after r2's 40 ms


def test_when_the_first_by_key_and_the_most_urgent_have_no_decode_room_the_next_by_key_goes() -> (
    None
):
    """d0 has 40,000 KV tokens left. r1 occupies p0 until 0.04. Held: ru (45,000 tokens,
    44,960 cached: 0.04 s, the earliest deadline, key 0.04 + 0.2 * 30 = 6.04), r4 (40
    tokens, key 0.04 + 0.2 * 30.001 = 6.0402) and rh (50,000 tokens, all cached: key 0.001 +
    0.2 * 30.002 = 6.0014, the first by key). At 0.04 neither rh nor ru fits on d0; r4, the
    next by key, goes. Before that rule the release placed nothing."""
    c = make_conductor(1, 1, policy="conductor", admission="early")
    chain_h = hashes(*range(12_500))
    chain_u = hashes(*range(100_000, 111_250))
    c.on_event(BlocksStored(iid("p0"), chain_h, Tier.DRAM))
    c.on_event(BlocksStored(iid("p0"), chain_u[:11_240], Tier.DRAM))
    c.instances[iid("d0")].decode.admit(RequestId("x"), 60_000, 0, started=True)
    rule = LateBinding(0.0, decode_aware=True, nic_aware=False, age_weight=0.2)
    q = HoldQueue(c, rule)
    (r1,) = q.submit(req("r1", hashes(), 40), 0.0)
    assert isinstance(r1, Plan)
    assert q.submit(req("ru", chain_u, 45_000), 0.0) == []
    assert q.submit(req("r4", hashes(), 40), 0.001) == []
    assert q.submit(req("rh", chain_h, 50_000), 0.002) == []
    (r4,) = q.release(0.04)
    assert isinstance(r4, Plan) and r4.request_id == "r4"
    assert len(q) == 2


EARLY = replace(AGED, reject_ahead=True)


def test_a_request_that_misses_its_slo_behind_the_held_ones_is_rejected_at_arrival() -> None:
    """TTFT SLO 100 ms, 40-token prompts (40 ms each). r1 occupies p0 until 0.04; r2 is
    held (it starts at 0.04: TTFT 80 ms). r3, behind r2 by key, would start at 0.08: TTFT
    120 ms > 100 ms, so it is rejected now instead of when its budget runs out, and nothing
    accepted is lost: r2 still goes at 0.04. Behind r2 as well, r4 shares r2's whole
    prompt (cached once r2 is done: 1 ms of prefill) and is kept. Without the rule r3 is
    held and rejected at 0.08, with 20 ms of budget left for 40 ms of prefill."""
    c = make_conductor(1, 1, policy="conductor", admission="early", ttft_slo_s=0.1)
    q = HoldQueue(c, EARLY)
    (r1,) = q.submit(req("r1", hashes(1), 40), 0.0)
    assert isinstance(r1, Plan)
    assert q.submit(req("r2", hashes(*range(10, 20)), 40), 0.0) == []
    (r3,) = q.submit(req("r3", hashes(*range(20, 30)), 40), 0.0)
    assert isinstance(r3, Rejection) and r3.request_id == "r3" and r3.code == "ttft_slo"
    assert r3.reason == "predicted TTFT 0.120s > SLO 0.100s waiting behind 1 held request"
    assert r3.predicted_ttft_s == pytest.approx(0.12)
    assert q.submit(req("r4", hashes(*range(10, 20)), 40), 0.0) == [] and len(q) == 2
    (r2,) = q.release(0.04)
    assert isinstance(r2, Plan) and r2.request_id == "r2"

    c = make_conductor(1, 1, policy="conductor", admission="early", ttft_slo_s=0.1)
    lenient = HoldQueue(c, AGED)
    lenient.submit(req("r1", hashes(1), 40), 0.0)
    for rid in ("r2", "r3"):
        assert lenient.submit(req(rid, hashes(), 40), 0.0) == []
    assert [d.request_id for d in lenient.release(0.04)] == ["r2"]
    (late,) = lenient.release(0.08)
    assert isinstance(late, Rejection) and late.request_id == "r3"


def test_a_prompt_shared_with_one_still_in_prefill_counts_as_cached() -> None:
    """r1 (400 tokens) is placed and in prefill on p0 until 0.4; r2, held until then,
    shares r1's whole prompt: its best case is 1 ms of prefill once r1's blocks are stored,
    not 400 ms, so with a 500 ms SLO it is kept (TTFT 0.401 s). r3, a 400-token prompt of
    its own behind r2, would start at 0.401 and take 0.4 s: rejected."""
    c = make_conductor(1, 1, policy="conductor", admission="early", ttft_slo_s=0.5)
    q = HoldQueue(c, EARLY)
    chain = hashes(*range(100))
    (r1,) = q.submit(req("r1", chain, 400), 0.0)
    assert isinstance(r1, Plan)
    assert q.submit(req("r2", chain, 400), 0.0) == []
    (other,) = q.submit(req("r3", hashes(*range(200, 300)), 400), 0.0)
    assert isinstance(other, Rejection) and other.predicted_ttft_s == pytest.approx(0.801)


def test_with_admission_off_nothing_is_rejected_at_arrival() -> None:
    c = make_conductor(1, 1, policy="conductor", admission="off", ttft_slo_s=0.1)
    q = HoldQueue(c, EARLY)
    q.submit(req("r1", hashes(1), 40), 0.0)
    for rid in ("r2", "r3", "r4"):
        assert q.submit(req(rid, hashes(), 40), 0.0) == []
    assert len(q) == 3
