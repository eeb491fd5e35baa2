"""Replicas' reservations: recorded by ReplicaScheduler, applied and expired by
RemoteReservations, exactly as the local bookkeeping would hold them."""

from __future__ import annotations

from conductor.core.config import SchedulerConfig
from conductor.core.events import PrefillFinished, RequestFinished
from conductor.core.plan import Plan
from conductor.core.replication import (
    PrefillDone,
    Released,
    ReplicaScheduler,
    Reserved,
)
from conductor.core.state import InstanceSpec
from conductor.core.types import InstanceId, Request, RequestId, Role
from tests.core.helpers import LINEAR_COST, hashes

P0, P1, D0, D1 = (InstanceId(x) for x in ("p0", "p1", "d0", "d1"))


def replica(**cfg: object) -> ReplicaScheduler:
    config = SchedulerConfig(block_size_tokens=4, **cfg)  # type: ignore[arg-type]
    r = ReplicaScheduler(LINEAR_COST, policy="mooncake", config=config)
    for iid, role in ((P0, Role.PREFILL), (P1, Role.PREFILL), (D0, Role.DECODE), (D1, Role.DECODE)):
        r.add_instance(InstanceSpec(iid, role))
    return r


def req(rid: str, n: int = 400) -> Request:
    return Request(RequestId(rid), n, hashes(*range(n // 4)), max_tokens=10)


def test_schedule_records_the_reservation_and_the_lifecycle() -> None:
    a = replica()
    plan = a.schedule(req("r1"), 0.0)
    assert isinstance(plan, Plan)
    [ev] = a.outbox
    assert isinstance(ev, Reserved)
    assert ev.request_id == "r1" and ev.prefill == (plan.prefill,) and ev.decode == plan.decode
    assert ev.new_tokens == 400 and ev.prompt_tokens == 400 and ev.output_cap == 10
    assert ev.output == a._inflight[RequestId("r1")].output
    assert ev.prefill_s == plan.prefill_s + plan.transfer_s
    a.outbox.clear()
    a.on_event(PrefillFinished(RequestId("r1"), plan.prefill, 0.5))
    a.on_event(RequestFinished(RequestId("r1"), plan.decode, 1.0, 7))
    assert a.outbox == [PrefillDone(RequestId("r1")), Released(RequestId("r1"), True, 7)]
    a.outbox.clear()
    a.on_event(RequestFinished(RequestId("unknown"), plan.decode, 1.0))
    assert a.outbox == []


def test_cancel_and_notify() -> None:
    a = replica()
    calls: list[int] = []
    a.notify = lambda: calls.append(1)
    a.schedule(req("r1"), 0.0)
    a.schedule(req("r2", 200), 0.0)
    assert len(calls) == 1  # once, when the outbox stopped being empty
    a.cancel(RequestId("r1"))
    assert a.outbox[-1] == Released(RequestId("r1"), completed=False)


def test_remote_reservation_moves_the_next_decision() -> None:
    """Without sync both replicas put their first request on the same idle prefill node;
    with B's reservation applied, A's goes to the other node."""
    a, b = replica(), replica()
    pb = b.schedule(req("b1"), 0.0)
    assert isinstance(pb, Plan)
    alone = replica().schedule(req("a1"), 0.0)
    assert isinstance(alone, Plan) and alone.prefill == pb.prefill  # the herd
    for ev in b.outbox:
        a.remote.apply("B", ev, 0.0)
    pa = a.schedule(req("a1"), 0.0)
    assert isinstance(pa, Plan)
    assert pa.prefill != pb.prefill
    assert a.instances[pb.prefill].prefill.queued_requests == 1
    assert a.instances[pb.decode].decode.batch_size == 1
    assert a.remote.count("B") == 1


def test_a_remote_plan_books_its_kv_hand_off_on_the_nics() -> None:
    """A replica publishes its plan's KV transfers; the other books the same NIC time (the
    hand-off from the prefill node to the decode node, requested at the prefill's predicted
    end), so that its own plans wait for those NICs as the origin's would."""
    a, b = replica(), replica()
    plan = a.schedule(req("r1"), 0.0)
    assert isinstance(plan, Plan) and plan.decode != plan.prefill
    [ev] = a.outbox
    assert isinstance(ev, Reserved) and ev.transfers is not None
    t = ev.transfers
    assert (t.prefill, t.decode, t.fetch_source, t.fetch_s) == (
        plan.prefill,
        plan.decode,
        None,
        0.0,
    )
    assert t.handoff_request_s == plan.predicted_ttft_s and t.handoff_s > 0.0
    b.remote.apply("A", ev, 0.0)
    assert (
        b.nic.planned_in_s == a.nic.planned_in_s == {plan.decode: t.handoff_start_s + t.handoff_s}
    )
    assert b.nic.planned_out_s == a.nic.planned_out_s
    assert b.nic.pending == a.nic.pending


def test_remote_lifecycle_and_expiry_leave_no_trace() -> None:
    a, b = replica(), replica()
    pb = b.schedule(req("b1"), 0.0)
    assert isinstance(pb, Plan)
    b.schedule(req("b2", 200), 0.0)
    for ev in b.outbox:
        a.remote.apply("B", ev, 0.0)
    b.outbox.clear()
    b.on_event(PrefillFinished(RequestId("b1"), pb.prefill, 0.4))
    b.on_event(RequestFinished(RequestId("b1"), pb.decode, 0.9))
    for ev in b.outbox:
        a.remote.apply("B", ev, 1.0)
    assert a.remote.count("B") == 1
    own = sum(b.instances[i].decode.kv_reserved_tokens for i in (D0, D1))  # b2's, as B holds it
    assert own > 200
    assert sum(a.instances[i].decode.kv_reserved_tokens for i in (D0, D1)) == own
    assert a.remote.expire("B", 2.0) == 1
    for iid in (P0, P1):
        st = a.instances[iid].prefill
        assert st.queued_requests == 0 and st.queued_tokens == 0
        assert st.queue_s(2.0) == 0.0
    for iid in (D0, D1):
        assert a.instances[iid].decode.batch_size == 0
        assert a.instances[iid].decode.kv_reserved_tokens == 0
    assert len(a.forecast) == 0 and len(a.remote) == 0


def test_snapshot_replaces_a_replicas_view() -> None:
    a, b = replica(), replica()
    b.schedule(req("b1"), 0.0)
    b.schedule(req("b2", 200), 0.0)
    b.cancel(RequestId("b1"))
    a.remote.apply("B", b.outbox[0], 0.0)  # only b1 heard of: then a snapshot
    a.remote.replace("B", b.snapshot(), 1.0)
    assert sorted(a.remote.by_replica["B"]) == ["b2"]
    assert sum(a.instances[i].decode.batch_size for i in (D0, D1)) == 1
    assert sum(a.instances[i].prefill.queued_tokens for i in (P0, P1)) == 200


def test_a_new_stagger_reorders_the_pools() -> None:
    """The stagger (replica k of n starts the pools k/n of the way round) changes when the
    replicas re-rank; the order follows at once, not the one computed for the old rank."""
    a = replica()
    names = lambda: [[i.spec.instance_id for i in pool] for pool in a.pools()]  # noqa: E731
    assert names() == [[P0, P1], [D0, D1]]
    a.stagger = (1, 2)
    assert names() == [[P1, P0], [D1, D0]]
    a.stagger = (1, 3)
    assert names() == [[P0, P1], [D0, D1]]
    a.stagger = (2, 3)
    assert names() == [[P1, P0], [D1, D0]]
