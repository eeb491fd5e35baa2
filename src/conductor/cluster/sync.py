"""One replica of the distributed conductor: publish our reservations, apply the others'.

:class:`ReplicaSync` owns a :class:`~conductor.cluster.protocol.Transport` and the local
:class:`~conductor.core.replication.ReplicaScheduler`. While :meth:`ReplicaSync.running`:

- **publish**: ``flush_s`` after the scheduler's outbox stops being empty, what it holds goes
  out as one :class:`~conductor.cluster.protocol.Batch` (a burst of decisions, and at high
  rates many requests' events, share one message); batches are numbered, and a batch that
  cannot be sent (NATS unreachable) still takes its number, so the peers see the gap and
  resynchronise.
- **apply**: the peers' batches go into the scheduler's ``remote`` reservations at local
  time; a peer first heard of, or whose numbers jump, is asked for a snapshot, which then
  replaces what we hold of it.
- **membership**: a heartbeat every ``heartbeat_s``; a peer silent for ``expiry_s`` (or
  saying :class:`~conductor.cluster.protocol.Bye`) has its reservations dropped.
- **degraded mode**: NATS unreachable — logged once per change, ``conductor_cluster_connected
  0`` on ``/metrics``; the peers expire, this replica serves on its local state, and when
  NATS returns the heartbeats and snapshots bring every replica back in step.

Everything runs on the gateway's event loop, so the scheduler needs no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass

import msgspec
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from conductor.cluster.config import ClusterConfig
from conductor.cluster.protocol import (
    Batch,
    Bye,
    Heartbeat,
    Message,
    Snapshot,
    SnapshotRequest,
    Transport,
    decode,
    encode,
    from_wire,
    reserved_from_wire,
    reserved_to_wire,
    to_wire,
)
from conductor.core.replication import ReplicaScheduler

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Peer:
    """What we know of another replica."""

    last_seq: int
    last_seen_s: float
    synced: bool = False
    asked_at_s: float | None = None


class ReplicaSync:
    """See the module docstring. Invariant: ``peers`` holds exactly the replicas whose
    reservations are applied to the scheduler (``scheduler.remote``), plus those first heard
    of and awaiting a snapshot."""

    def __init__(
        self,
        config: ClusterConfig,
        scheduler: ReplicaScheduler,
        transport: Transport,
        clock: Callable[[], float],
    ) -> None:
        if not config.replica_id:
            raise ValueError("ClusterConfig.replica_id must be set (the CLI derives one)")
        self.config = config
        self.replica_id = config.replica_id
        self.scheduler = scheduler
        self.transport = transport
        self.clock = clock
        self.peers: dict[str, Peer] = {}
        self.seq = 0
        self.connected = False
        self._announced: bool | None = None
        self.counters: dict[str, int] = dict.fromkeys(
            ("batches_sent", "batches_dropped", "batches_received", "snapshots_applied",
             "snapshots_sent", "peers_expired", "gaps", "bad_messages"),
            0,
        )  # fmt: skip
        self._wake = asyncio.Event()
        self._sends: set[asyncio.Task[object]] = set()
        self.on_members: Callable[[], None] | None = None
        """Called when a peer joins or leaves (the gateway's hold queue re-ranks its claim)."""
        scheduler.stagger = self.claim_slot()

    def claim_slot(self) -> tuple[int, int]:
        """This replica's rank among the live ones (itself and its peers, by id) and their
        number: the turn in which it claims a freed prefill instance
        (:class:`~conductor.core.late_binding.HoldQueue`'s ``claim``) and where in the
        instance order it starts breaking exact ties (the scheduler's ``stagger``)."""
        ids = sorted({self.replica_id, *self.peers})
        return ids.index(self.replica_id), len(ids)

    def _members_changed(self) -> None:
        """Re-rank: the scheduler's tie-break stagger here, the hold queue's claim through
        ``on_members``."""
        self.scheduler.stagger = self.claim_slot()
        if self.on_members is not None:
            self.on_members()

    def _spawn(self, coro: Coroutine[object, object, object]) -> None:
        """Run ``coro`` in the background, holding a reference until it is done."""
        task = asyncio.get_running_loop().create_task(coro)
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    # -- lifecycle -----------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ReplicaSync]:
        self.scheduler.notify = self._wake.set
        tasks = [
            asyncio.create_task(self.transport.start(self._on_message, self._on_state)),
            asyncio.create_task(self._publisher(), name="cluster-publish"),
            asyncio.create_task(self._heartbeats(), name="cluster-heartbeat"),
        ]
        try:
            yield self
        finally:
            self.scheduler.notify = None
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            await self._flush()
            await self.transport.publish(encode(Bye(self.replica_id)))
            await self.transport.close()

    def _on_state(self, connected: bool, why: str) -> None:
        self.connected = connected
        if connected == self._announced:
            return
        self._announced = connected
        if connected:
            log.info("cluster: %s; replica %s is syncing", why, self.replica_id)
            self._wake.set()
        else:
            log.warning("cluster: %s: degraded mode, serving on local state", why)

    # -- publishing ----------------------------------------------------------------------
    async def _publisher(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(self.config.flush_s)  # let a batch gather
            self._wake.clear()
            await self._flush()

    async def _flush(self) -> None:
        outbox = self.scheduler.outbox
        if not outbox:
            return
        events = [to_wire(e) for e in outbox]
        outbox.clear()
        self.seq += 1
        if await self.transport.publish(encode(Batch(self.replica_id, self.seq, events))):
            self.counters["batches_sent"] += 1
        else:
            self.counters["batches_dropped"] += 1

    async def _heartbeats(self) -> None:
        while True:
            await self._flush()
            reservations = self.scheduler.inflight()
            await self.transport.publish(encode(Heartbeat(self.replica_id, self.seq, reservations)))
            self.expire_silent()
            await asyncio.sleep(self.config.heartbeat_s)

    def expire_silent(self) -> list[str]:
        """Drop the reservations of every peer silent for ``expiry_s``; returns them."""
        now = self.clock()
        gone = [r for r, p in self.peers.items() if now - p.last_seen_s > self.config.expiry_s]
        for replica in gone:
            self._expire(replica, "silent")
        return gone

    def _expire(self, replica: str, why: str) -> None:
        if self.peers.pop(replica, None) is not None:
            self._members_changed()
        n = self.scheduler.remote.expire(replica, self.clock())
        self.counters["peers_expired"] += 1
        log.warning("cluster: replica %s %s; %d reservation(s) expired", replica, why, n)

    # -- receiving -----------------------------------------------------------------------
    def _on_message(self, data: bytes) -> None:
        try:
            msg = decode(data)
        except (msgspec.DecodeError, ValueError):
            self.counters["bad_messages"] += 1
            return
        if msg.replica == self.replica_id:
            return
        self.handle(msg)

    def handle(self, msg: Message) -> None:
        """Apply one peer's message (the transport calls this for every message heard)."""
        now = self.clock()
        match msg:
            case Bye(replica):
                if replica in self.peers:
                    self._expire(replica, "left")
                return
            case SnapshotRequest(_, target):
                if target == self.replica_id:
                    self._send_snapshot()
                self._seen(msg.replica, None, now)
                return
            case Snapshot(replica, seq, reservations):
                peer = self.peers.get(replica)
                if peer is None or not peer.synced:
                    self.scheduler.remote.replace(
                        replica, [reserved_from_wire(w) for w in reservations], now
                    )
                    self.peers[replica] = Peer(seq, now, synced=True)
                    self.counters["snapshots_applied"] += 1
                    if peer is None:
                        self._members_changed()
                return
            case Heartbeat(replica, seq, _):
                peer = self._seen(replica, None, now)
                if peer.synced and seq > peer.last_seq:
                    self._gap(replica, peer, now)
                return
            case Batch(replica, seq, events):
                self.counters["batches_received"] += 1
                self._seen(replica, seq, now)
                remote = self.scheduler.remote
                for w in events:
                    remote.apply(replica, from_wire(w), now)

    def _seen(self, replica: str, seq: int | None, now: float) -> Peer:
        """Note a message from ``replica`` (a batch numbered ``seq``): a peer first heard of
        or whose numbers jumped is asked for a snapshot."""
        peer = self.peers.get(replica)
        if peer is None:
            peer = self.peers[replica] = Peer(0 if seq is None else seq, now)
            log.info("cluster: replica %s joined", replica)
            self._ask(replica, peer, now)
            self._members_changed()
            return peer
        peer.last_seen_s = now
        if seq is not None:
            if peer.synced and seq != peer.last_seq + 1:
                peer.last_seq = seq
                self._gap(replica, peer, now)
            else:
                peer.last_seq = max(peer.last_seq, seq)
        elif not peer.synced:
            self._ask(replica, peer, now)
        return peer

    def _gap(self, replica: str, peer: Peer, now: float) -> None:
        self.counters["gaps"] += 1
        peer.synced = False
        log.warning("cluster: lost messages from replica %s; resynchronising", replica)
        self._ask(replica, peer, now)

    def _ask(self, replica: str, peer: Peer, now: float) -> None:
        if peer.asked_at_s is not None and now - peer.asked_at_s < self.config.heartbeat_s:
            return
        peer.asked_at_s = now
        self._spawn(self.transport.publish(encode(SnapshotRequest(self.replica_id, replica))))

    def _send_snapshot(self) -> None:
        self._spawn(self._snapshot())

    async def _snapshot(self) -> None:
        await self._flush()  # what is queued goes out as a batch first, numbered before it
        snap = [reserved_to_wire(r) for r in self.scheduler.snapshot()]
        self.counters["snapshots_sent"] += 1
        await self.transport.publish(encode(Snapshot(self.replica_id, self.seq, snap)))

    # -- metrics ---------------------------------------------------------------------------
    def collector(self) -> Collector:
        return _SyncCollector(self)


class _SyncCollector(Collector):
    def __init__(self, sync: ReplicaSync) -> None:
        self.sync = sync

    def collect(self) -> Iterator[Metric]:
        s = self.sync
        labels = ["replica"]
        me = [s.replica_id]
        g = GaugeMetricFamily(
            "conductor_cluster_connected",
            "1 while the replica-sync transport (NATS) is connected; 0: degraded mode",
            labels=labels,
        )
        g.add_metric(me, 1.0 if s.connected else 0.0)
        yield g
        g = GaugeMetricFamily(
            "conductor_cluster_peers", "Other replicas currently heard of", labels=labels
        )
        g.add_metric(me, float(len(s.peers)))
        yield g
        g = GaugeMetricFamily(
            "conductor_cluster_remote_reservations",
            "Other replicas' reservations applied to the local view",
            labels=labels,
        )
        g.add_metric(me, float(len(s.scheduler.remote)))
        yield g
        c = CounterMetricFamily(
            "conductor_cluster_events",
            "Replica-sync events by kind (batches sent/dropped/received, snapshots, gaps, "
            "expired peers, undecodable messages)",
            labels=["replica", "kind"],
        )
        for kind, n in s.counters.items():
            c.add_metric([s.replica_id, kind], float(n))
        yield c
