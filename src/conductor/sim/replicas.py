"""Several scheduler replicas in one simulation, with lagging views of each other (herding).

``conductor simulate --replicas N --sync-delay-ms D``: arrivals are spread round-robin over N
:class:`~conductor.core.replication.ReplicaScheduler` replicas (an L4 load balancer in front
of N gateways). Every replica sees every KV event (each gateway subscribes to every engine);
a replica's reservations (plan committed, prefill done, request released) reach the others
``D`` later, as they would over NATS. A replica deciding at ``t`` has applied exactly the
other replicas' events produced up to ``t - D`` (pending ones are applied lazily, at their
delivery time, before the replica's next decision), so two replicas deciding within ``D`` of
each other do not see each other's choice: the herding the issue asks to measure.

:class:`ReplicaSet` is itself replica 0 (so the simulator keeps one ``Scheduler``-typed
handle, and load samples read replica 0's view) and owns replicas 1..N-1.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import replace

from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import CostModel
from conductor.core.events import (
    DecodeProgress,
    Event,
    PrefillFinished,
    RequestFinished,
)
from conductor.core.output_length import OutputLengthModel
from conductor.core.plan import Decision, Rejection
from conductor.core.policies.colocated import ColocatedDecode
from conductor.core.replication import ReplicaScheduler, ReservationEvent
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceSpec
from conductor.core.types import InstanceId, Request, RequestId
from conductor.sim.config import SimConfig

_Pending = deque[tuple[float, str, ReservationEvent]]


def make_scheduler(cfg: SimConfig, lengths: OutputLengthModel | None = None) -> Scheduler:
    """One scheduler, or a :class:`ReplicaSet` when ``cfg.replicas > 1`` (``lengths``: the
    output-length model, shared by the replicas when given — the oracle is static). A
    request prefilled on a ``both`` engine decodes there (:class:`ColocatedDecode`), as
    ``conductor serve`` places it: such an engine runs the whole request, no KV hand-off."""
    if cfg.replicas == 1:
        one = Scheduler(cfg.cost, policy=cfg.policy, config=cfg.scheduler, output_lengths=lengths)
        one.decode_policy = ColocatedDecode(one.decode_policy)
        return one
    many = ReplicaSet(
        cfg.cost,
        cfg.policy,
        cfg.scheduler,
        cfg.replicas,
        cfg.sync_delay_s,
        stagger=cfg.replica_stagger,
        output_lengths=lengths,
    )
    for peer in many.peers:
        peer.decode_policy = ColocatedDecode(peer.decode_policy)
    return many


class ReplicaSet(ReplicaScheduler):
    """Replica 0 plus ``replicas - 1`` peers; see the module docstring.

    Invariants: ``_pending[k]`` is in delivery-time order (events are produced in time order
    and every delivery is ``delay_s`` later); a request's lifecycle events go to the replica
    that scheduled it (``_owner``), KV events and membership to all.
    """

    def __init__(
        self,
        cost: CostModel,
        policy: str,
        config: SchedulerConfig,
        replicas: int,
        delay_s: float,
        stagger: bool = True,
        output_lengths: OutputLengthModel | None = None,
    ) -> None:
        super().__init__(cost, policy=policy, config=config, output_lengths=output_lengths)
        self.peers: list[ReplicaScheduler] = [self] + [
            ReplicaScheduler(
                cost,
                policy=policy,
                config=replace(config, seed=config.seed + k),
                stagger=(k, replicas) if stagger else (0, 1),
                output_lengths=output_lengths,
            )
            for k in range(1, replicas)
        ]
        self.names = [f"r{k}" for k in range(replicas)]
        self.delay_s = delay_s
        self._pending: list[_Pending] = [deque() for _ in range(replicas)]
        self._owner: dict[RequestId, int] = {}
        self._next = 0

    # -- membership and KV events: every replica ---------------------------------------
    def add_instance(self, spec: InstanceSpec) -> None:
        super().add_instance(spec)
        for peer in self.peers[1:]:
            peer.add_instance(spec)

    def on_event(self, event: Event) -> None:
        if not isinstance(event, PrefillFinished | RequestFinished | DecodeProgress):
            super().on_event(event)
            for peer in self.peers[1:]:
                peer.on_event(event)
            return
        k = self._owner.get(event.request_id, 0)
        if isinstance(event, RequestFinished):
            self._owner.pop(event.request_id, None)
        self._flush(k, event.now_s)
        if k == 0:
            super().on_event(event)
        else:
            self.peers[k].on_event(event)
        self._send(k, event.now_s)

    # -- decisions: the owning replica ---------------------------------------------------
    def next_replica(self) -> int:
        """The replica the next arrival goes to (round-robin, as an L4 balancer spreads)."""
        k = self._next
        self._next = (k + 1) % len(self.peers)
        return k

    def on_replica(self, k: int, now_s: float, act: Callable[[], list[Decision]]) -> list[Decision]:
        """Run ``act`` (decisions of replica ``k``: a schedule, or its hold queue's release)
        on replica ``k``'s view at ``now_s``: what reached it first, its reservations out
        after; the requests it placed are its own."""
        self._flush(k, now_s)
        decisions = act()
        for d in decisions:
            if not isinstance(d, Rejection):
                self._owner[d.request_id] = k
        self._send(k, now_s)
        return decisions

    def schedule(self, request: Request, now_s: float) -> Decision:
        k = self.next_replica()
        peer: Scheduler = self.peers[k]
        do = super().schedule if k == 0 else peer.schedule
        return self.on_replica(k, now_s, lambda: [do(request, now_s)])[0]

    def confirm_decode(self, rid: RequestId, now_s: float) -> InstanceId | Rejection:
        k = self._owner.get(rid, 0)
        self._flush(k, now_s)
        out = (
            super().confirm_decode(rid, now_s)
            if k == 0
            else self.peers[k].confirm_decode(rid, now_s)
        )
        if isinstance(out, Rejection):
            self._owner.pop(rid, None)
        self._send(k, now_s)
        return out

    def cancel(self, rid: RequestId) -> None:
        k = self._owner.pop(rid, 0)
        if k == 0:
            super().cancel(rid)
        else:
            self.peers[k].cancel(rid)

    # -- delivery ------------------------------------------------------------------------
    def _send(self, k: int, now_s: float) -> None:
        """Queue replica ``k``'s new reservations for every other replica."""
        src = self.peers[k]
        if not src.outbox:
            return
        due = now_s + self.delay_s
        name = self.names[k]
        for j, pending in enumerate(self._pending):
            if j != k:
                pending.extend((due, name, ev) for ev in src.outbox)
        src.outbox.clear()
        if self.delay_s == 0.0:
            for j in range(len(self.peers)):
                if j != k:
                    self._flush(j, now_s)

    def _flush(self, k: int, now_s: float) -> None:
        """Apply to replica ``k`` what has reached it by ``now_s``, at its delivery time."""
        pending = self._pending[k]
        remote = self.peers[k].remote
        while pending and pending[0][0] <= now_s:
            due, name, ev = pending.popleft()
            remote.apply(name, ev, due)
