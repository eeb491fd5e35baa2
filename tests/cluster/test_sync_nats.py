"""ReplicaSync over a real nats-server (started by the test): reservations reach the other
replica, a replica that leaves or goes silent is expired, and when nats-server dies the
replicas go degraded and resynchronise after it is back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest

from conductor.cluster.config import ClusterConfig
from conductor.cluster.embedded import NatsServer
from conductor.cluster.nats_backend import NatsTransport
from conductor.cluster.protocol import Batch, decode, encode
from conductor.cluster.sync import ReplicaSync
from conductor.core.events import PrefillFinished, RequestFinished
from conductor.core.plan import Plan
from conductor.core.types import RequestId
from tests.core.test_replication import replica, req

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    with NatsServer() as ns:
        yield ns


def make(url: str, rid: str) -> ReplicaSync:
    cfg = ClusterConfig(url=url, replica_id=rid, heartbeat_s=0.1, expiry_s=0.5, reconnect_s=0.1)
    transport = NatsTransport(url, cfg.subject, rid, cfg.reconnect_s)
    return ReplicaSync(cfg, replica(), transport, time.monotonic)


async def until(cond: object, timeout_s: float = 10.0) -> None:
    assert callable(cond)
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


@asynccontextmanager
async def replicas(url: str, *names: str) -> AsyncIterator[list[ReplicaSync]]:
    syncs = [make(url, n) for n in names]
    async with AsyncExitStack() as stack:
        for s in syncs:
            await stack.enter_async_context(s.running())
        await until(lambda: all(s.connected and len(s.peers) == len(names) - 1 for s in syncs))
        yield syncs


def test_messages_round_trip() -> None:
    from conductor.cluster.protocol import to_wire

    a = replica()
    a.schedule(req("r1"), 0.0)
    msg = Batch("A", 1, [to_wire(e) for e in a.outbox])
    assert decode(encode(msg)) == msg
    from conductor.cluster.protocol import WReserved, from_wire

    [w] = msg.events
    assert isinstance(w, WReserved) and w.transfers is not None
    assert [from_wire(x) for x in msg.events] == a.outbox  # the NIC transfers included
    from dataclasses import replace

    from conductor.core.nic import Transfers
    from conductor.core.replication import Reserved
    from conductor.core.types import InstanceId

    [ev] = a.outbox
    assert isinstance(ev, Reserved)
    fetch = Transfers(InstanceId("p0"), InstanceId("p1"), 0.2, None, 0.0, 0.0, 0.0)
    for r in (replace(ev, transfers=fetch), replace(ev, transfers=None)):
        assert from_wire(decode(encode(Batch("A", 2, [to_wire(r)]))).events[0]) == r  # type: ignore[attr-defined]


async def test_reservations_reach_the_other_replica(nats_server: NatsServer) -> None:
    async with replicas(nats_server.url, "A", "B") as (a, b):
        plan = a.scheduler.schedule(req("r1"), time.monotonic())
        assert isinstance(plan, Plan)
        await until(lambda: b.scheduler.remote.count("A") == 1)
        st = b.scheduler.instances[plan.prefill].prefill
        assert st.queued_requests == 1 and st.queued_tokens == 400
        a.scheduler.on_event(PrefillFinished(RequestId("r1"), plan.prefill, time.monotonic()))
        await until(lambda: st.queued_requests == 0)
        a.scheduler.on_event(RequestFinished(RequestId("r1"), plan.decode, time.monotonic()))
        await until(lambda: b.scheduler.remote.count("A") == 0)
        assert b.scheduler.instances[plan.decode].decode.batch_size == 0
        assert b.counters["gaps"] == 0 and b.counters["batches_received"] == 3


async def test_a_replica_that_leaves_or_vanishes_is_expired(nats_server: NatsServer) -> None:
    async with replicas(nats_server.url, "A", "B", "C") as (a, b, c):
        a.scheduler.schedule(req("r1"), time.monotonic())
        b.scheduler.schedule(req("r2"), time.monotonic())
        await until(lambda: c.scheduler.remote.count("A") == 1 == c.scheduler.remote.count("B"))
        # B vanishes without a word (its tasks stop; no Bye): expired after expiry_s
        b.transport.publish = _silent  # type: ignore[method-assign]
        await until(lambda: "B" not in c.peers and "B" not in a.peers, timeout_s=5)
        assert c.scheduler.remote.count("B") == 0
        assert c.scheduler.remote.count("A") == 1
    # leaving the block: each says Bye


async def test_each_replica_knows_its_claim_turn_among_the_live_ones(
    nats_server: NatsServer,
) -> None:
    """Ranks by replica id among the live replicas (the turn in which a replica's hold
    queue claims a freed prefill instance); a replica that goes silent leaves the ranking
    and the others hear of it through ``on_members``."""
    async with replicas(nats_server.url, "A", "B", "C") as (a, b, c):
        assert [s.claim_slot() for s in (a, b, c)] == [(0, 3), (1, 3), (2, 3)]
        calls: list[tuple[int, int]] = []
        c.on_members = lambda: calls.append(c.claim_slot())
        b.transport.publish = _silent  # type: ignore[method-assign]
        await until(lambda: "B" not in c.peers and "B" not in a.peers, timeout_s=5)
        assert (a.claim_slot(), c.claim_slot()) == ((0, 2), (1, 2))
        assert calls == [(1, 2)]
        assert (a.scheduler.stagger, c.scheduler.stagger) == ((0, 2), (1, 2))


async def test_replicas_break_exact_ties_from_their_rank(nats_server: NatsServer) -> None:
    """Each replica's tie-break stagger is its rank among the live ones: three replicas
    placing at the same instant on an idle cluster (none sees the others' choice yet) split
    over the two prefill instances 2:1. Stagger by a hash of the id, as before, sent all
    three of g0, g1, g2 to the same instance first (crc32 put them in one half)."""
    async with replicas(nats_server.url, "g0", "g1", "g2") as syncs:
        assert [s.scheduler.stagger for s in syncs] == [(0, 3), (1, 3), (2, 3)]
        now = time.monotonic()
        plans = [s.scheduler.schedule(req(f"r{i}"), now) for i, s in enumerate(syncs)]
        assert all(isinstance(p, Plan) for p in plans)
        assert [p.prefill for p in plans if isinstance(p, Plan)] == ["p0", "p0", "p1"]


async def _silent(data: bytes) -> bool:
    return False


async def test_nats_outage_degrades_and_resyncs(nats_server: NatsServer) -> None:
    async with replicas(nats_server.url, "A", "B") as (a, b):
        a.scheduler.schedule(req("r1"), time.monotonic())
        await until(lambda: b.scheduler.remote.count("A") == 1)
        nats_server.stop()
        await until(lambda: not a.connected and not b.connected)
        # degraded: both keep scheduling on local state; the peers expire
        plan2 = a.scheduler.schedule(req("r2", 200), time.monotonic())
        assert isinstance(plan2, Plan)
        await until(lambda: not a.peers and not b.peers, timeout_s=5)
        assert b.scheduler.remote.count("A") == 0
        nats_server.start()
        await until(lambda: a.connected and b.connected, timeout_s=15)
        # back: B learns both of A's reservations (r2 was decided while NATS was down)
        await until(lambda: b.scheduler.remote.count("A") == 2, timeout_s=10)
        assert b.counters["snapshots_applied"] >= 1


async def test_a_gap_is_resynchronised_from_a_snapshot(nats_server: NatsServer) -> None:
    """A raw NATS client plays replica X: batch 1, then batch 3 (2 lost); A asks X for a
    snapshot, and X's snapshot replaces what A held of it."""
    import nats

    from conductor.cluster.protocol import Snapshot, SnapshotRequest, WReleased, WReserved

    def reserved(rid: str) -> WReserved:
        return WReserved(rid, ["p0"], 0.5, 400, "d0", 400, 10.0, 10.0, 10, 0.5)

    x = await nats.connect(nats_server.url)
    heard: list[object] = []

    async def on(msg: object) -> None:
        heard.append(decode(msg.data))  # type: ignore[attr-defined]

    async with replicas(nats_server.url, "A") as (a,):
        subject = a.config.subject
        await x.subscribe(subject, cb=on)
        await x.publish(subject, encode(Batch("X", 1, [reserved("r1"), reserved("r2")])))
        await until(lambda: a.scheduler.remote.count("X") == 2)
        await x.publish(subject, encode(Snapshot("X", 1, [reserved("r1"), reserved("r2")])))
        await until(lambda: a.counters["snapshots_applied"] == 1)
        await x.publish(subject, encode(Batch("X", 3, [WReleased("r1", True)])))
        await until(lambda: a.counters["gaps"] == 1)
        await until(lambda: any(isinstance(m, SnapshotRequest) and m.target == "X" for m in heard))
        assert a.scheduler.remote.count("X") == 1
        await x.publish(subject, encode(Snapshot("X", 3, [reserved("r3")])))
        await until(lambda: a.counters["snapshots_applied"] == 2)
        assert sorted(a.scheduler.remote.by_replica["X"]) == ["r3"]
        assert a.scheduler.instances["p0"].prefill.queued_requests == 1  # type: ignore[index]
    await x.close()


async def test_a_replica_started_without_nats_serves_and_joins_later() -> None:
    from conductor.cluster.embedded import free_port

    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    a = make(url, "A")
    async with a.running():
        await asyncio.sleep(0.3)
        assert not a.connected
        plan = a.scheduler.schedule(req("r1"), time.monotonic())
        assert isinstance(plan, Plan)  # degraded: local state only
        await until(lambda: a.counters["batches_dropped"] == 1)
        with NatsServer(port=port):
            await until(lambda: a.connected, timeout_s=10)
            async with make(url, "B").running() as b:
                await until(lambda: b.scheduler.remote.count("A") == 1)
