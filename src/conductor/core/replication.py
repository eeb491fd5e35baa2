"""Several scheduler replicas, one view of the in-flight load (the distributed conductor).

Every replica ingests the engines' KV events itself, so the prefix index is the same
everywhere; what differs is the *reservations* each replica commits: the prefill work it queued
on an instance, the decode KV and batch slot it reserved. :class:`ReplicaScheduler` is a
:class:`~conductor.core.scheduler.Scheduler` that records its own reservations as
:data:`ReservationEvent` values in ``outbox`` (for a transport to publish), and
:class:`RemoteReservations` applies the other replicas' to the local bookkeeping, so no replica
herds onto an engine that the others just filled (Dynamo syncs its routers' "active blocks"
the same way: add request, prefill completed, free).

Remote reservations are applied at the local time they are *received* (``now_s`` of this
replica's clock: replicas' clocks are not comparable), under the key ``"<replica>/<id>"`` so
they never collide with local request ids. A replica that vanishes has its reservations
expired (:meth:`RemoteReservations.expire`); a snapshot replaces a replica's reservations
wholesale (:meth:`RemoteReservations.replace`), which is how a replica resynchronises after a
gap. Pure: no clock, socket or randomness.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import CostModel
from conductor.core.events import Event, PrefillFinished, RequestFinished
from conductor.core.nic import Transfers
from conductor.core.output_length import OutputEstimate, OutputLengthModel
from conductor.core.plan import Decision, Plan, Prepared, Rejection
from conductor.core.policies import DecodePolicy
from conductor.core.policies.registry import DEFAULT_POLICY
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceState
from conductor.core.types import InstanceId, Request, RequestId


@dataclass(frozen=True, slots=True)
class Reserved:
    """A plan committed: ``prefill_s`` of work (``new_tokens``) queued on each of ``prefill``
    (one node, or a pipelined group); a decode reservation on ``decode`` (None: chosen only at
    the end of prefill, ``baseline`` admission) starting ``ttft_s`` from now, for an output
    predicted as ``output_*`` (an :class:`~conductor.core.output_length.OutputEstimate`)."""

    request_id: RequestId
    prefill: tuple[InstanceId, ...]
    prefill_s: float
    new_tokens: int
    decode: InstanceId | None
    prompt_tokens: int
    output_mean: float
    output_high: float
    output_cap: int
    ttft_s: float
    prefill_done: bool = False
    transfers: Transfers | None = None
    """Its KV transfers (NIC time the other replicas book too); None in a resync."""

    @property
    def output(self) -> OutputEstimate:
        return OutputEstimate(self.output_mean, self.output_high, self.output_cap)


@dataclass(frozen=True, slots=True)
class DecodeReserved:
    """The decode instance of a ``baseline``-admitted request was chosen at its prefill end."""

    request_id: RequestId
    decode: InstanceId


@dataclass(frozen=True, slots=True)
class PrefillDone:
    """The prefill of ``request_id`` ended (its decode starts now)."""

    request_id: RequestId


@dataclass(frozen=True, slots=True)
class Released:
    """``request_id`` left the cluster: ``completed`` (after ``output_tokens``, when known),
    or cancelled / failed / lost."""

    request_id: RequestId
    completed: bool = True
    output_tokens: int | None = None


ReservationEvent = Reserved | DecodeReserved | PrefillDone | Released


class ReplicaScheduler(Scheduler):
    """A :class:`Scheduler` whose own reservations are appended to ``outbox`` (the caller
    drains it) and which holds the other replicas' in ``remote``."""

    def __init__(
        self,
        cost: CostModel,
        *,
        policy: str = DEFAULT_POLICY,
        config: SchedulerConfig | None = None,
        decode_policy: DecodePolicy | None = None,
        output_lengths: OutputLengthModel | None = None,
        stagger: tuple[int, int] = (0, 1),
    ) -> None:
        super().__init__(
            cost,
            policy=policy,
            config=config,
            decode_policy=decode_policy,
            output_lengths=output_lengths,
        )
        self._stagger = stagger
        self._rotated: tuple[object, tuple[list[InstanceState], list[InstanceState]]] | None = None
        self.outbox: list[ReservationEvent] = []
        self.notify: Callable[[], None] | None = None
        self.remote = RemoteReservations(self)

    def _emit(self, event: ReservationEvent) -> None:
        """Queue one of our reservation events; ``notify`` is called when the outbox stops
        being empty (the transport's cue to publish)."""
        if not self.outbox and self.notify is not None:
            self.notify()
        self.outbox.append(event)

    @property
    def stagger(self) -> tuple[int, int]:
        """``(k, n)``: this is replica ``k`` of ``n`` in tie-breaking (see :meth:`pools`);
        the replica sync sets it to the replica's rank among the live ones."""
        return self._stagger

    @stagger.setter
    def stagger(self, value: tuple[int, int]) -> None:
        if value != self._stagger:
            self._stagger = value
            self._rotated = None

    def pools(self) -> tuple[list[InstanceState], list[InstanceState]]:
        """The pools in an order of this replica's own: ``stagger = (k, n)`` (replica ``k``
        of ``n``) starts them ``k/n`` of the way round, so replicas that see the same load
        break its exact ties on different instances instead of herding onto the first."""
        base = super().pools()
        k, n = self._stagger
        if k == 0:
            return base
        if self._rotated is None or self._rotated[0] is not base:
            pre, dec = base
            i, j = k * len(pre) // n, k * len(dec) // n
            self._rotated = (base, (pre[i:] + pre[:i], dec[j:] + dec[:j]))
        return self._rotated[1]

    def decide(self, prepared: Prepared) -> Decision:
        """Admission and commit (``schedule`` and late binding both end here); a plan is
        published as a reservation."""
        decision = super().decide(prepared)
        if isinstance(decision, Plan):
            self._emit(self._reserved(prepared.ctx.request, decision))
        return decision

    def _reserved(self, request: Request, plan: Plan) -> Reserved:
        deferred = self.config.admission == "baseline"
        f = self._inflight[request.request_id]
        out = f.output
        return Reserved(
            request.request_id,
            plan.cpp.nodes if plan.cpp is not None else (plan.prefill,),
            plan.prefill_s + plan.transfer_s,
            request.prompt_tokens - plan.cached_tokens,
            None if deferred else plan.decode,
            request.prompt_tokens,
            out.mean,
            out.high,
            out.cap,
            plan.predicted_ttft_s,
            transfers=f.transfers,
        )

    def on_event(self, event: Event) -> None:
        if not isinstance(event, PrefillFinished | RequestFinished):
            super().on_event(event)
            return
        local = event.request_id in self._inflight
        super().on_event(event)
        if local and isinstance(event, PrefillFinished):
            self._emit(PrefillDone(event.request_id))
        elif local:
            assert isinstance(event, RequestFinished)
            self._emit(Released(event.request_id, True, event.output_tokens))

    def cancel(self, rid: RequestId) -> None:
        if rid in self._inflight:
            self._emit(Released(rid, completed=False))
        super().cancel(rid)

    def remove_instance(self, instance: InstanceId) -> list[RequestId]:
        lost = super().remove_instance(instance)
        for rid in lost:
            self._emit(Released(rid, completed=False))
        return lost

    def confirm_decode(self, rid: RequestId, now_s: float) -> InstanceId | Rejection:
        f = self._inflight.get(rid)
        deferred = f is not None and f.decode is None
        choice = super().confirm_decode(rid, now_s)
        if deferred and f is not None:
            if isinstance(choice, Rejection):
                self._emit(Released(rid, completed=False))
            else:
                self._emit(DecodeReserved(rid, choice))
        return choice

    def snapshot(self) -> list[Reserved]:
        """This replica's own reservations now (what a peer that lost track needs)."""
        out: list[Reserved] = []
        for rid, f in self._inflight.items():
            req = f.request
            state = self.instances.get(f.prefill)
            pred = state.prefill._pred_s.get(rid, 0.0) if state is not None else 0.0
            toks = state.prefill._tokens.get(rid, 0) if state is not None else 0
            o = f.output
            out.append(
                Reserved(
                    rid,
                    f.cpp_nodes or (f.prefill,),
                    pred,
                    toks,
                    f.decode,
                    req.prompt_tokens,
                    o.mean,
                    o.high,
                    o.cap,
                    0.0,
                    prefill_done=f.prefill_done,
                )
            )
        return out


@dataclass(slots=True)
class _Remote:
    event: Reserved
    decode: InstanceId | None
    prefill_done: bool


@dataclass(slots=True)
class RemoteReservations:
    """The other replicas' reservations, applied to ``scheduler``'s bookkeeping.

    Invariant: every entry of ``by_replica`` is reflected in the scheduler's prefill queue
    (until its prefill is done), its decode state and its forecast (until released); removing
    the entry removes all three. Instances unknown here (not registered yet, or removed) are
    skipped: their bookkeeping does not exist.
    """

    scheduler: Scheduler
    by_replica: dict[str, dict[RequestId, _Remote]] = field(default_factory=dict)

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_replica.values())

    def count(self, replica: str) -> int:
        return len(self.by_replica.get(replica, {}))

    @staticmethod
    def key(replica: str, rid: RequestId) -> RequestId:
        return RequestId(f"{replica}/{rid}")

    def apply(self, replica: str, event: ReservationEvent, now_s: float) -> None:
        """Apply one of ``replica``'s events, received at local time ``now_s``."""
        entries = self.by_replica.setdefault(replica, {})
        key = self.key(replica, event.request_id)
        s = self.scheduler
        match event:
            case Reserved():
                if event.request_id in entries:
                    self._release(
                        key, entries.pop(event.request_id), output_tokens=None, now_s=now_s
                    )
                if not event.prefill_done:
                    for node in event.prefill:
                        st = s.instances.get(node)
                        if st is not None:
                            st.prefill.assign(key, event.prefill_s, event.new_tokens, now_s)
                    if event.transfers is not None:
                        s.nic.book_transfers(event.transfers, now_s)
                entries[event.request_id] = _Remote(event, None, event.prefill_done)
                if event.decode is not None:
                    start = now_s if event.prefill_done else now_s + event.ttft_s
                    self._admit(key, entries[event.request_id], event.decode, start)
            case DecodeReserved(rid, decode):
                e = entries.get(rid)
                if e is not None and e.decode is None:
                    self._admit(key, e, decode, now_s)
            case PrefillDone(rid):
                e = entries.get(rid)
                if e is not None and not e.prefill_done:
                    e.prefill_done = True
                    for node in e.event.prefill:
                        st = s.instances.get(node)
                        if st is not None:
                            st.prefill.finish(key, now_s)
                    s.forecast.started(key, now_s)
                    d = s.instances.get(e.decode) if e.decode is not None else None
                    if d is not None:
                        d.decode.start(key)
            case Released(rid, completed, output_tokens):
                e = entries.pop(rid, None)
                if e is not None:
                    out = output_tokens if completed else None
                    self._release(key, e, output_tokens=out, now_s=now_s)

    def _admit(self, key: RequestId, e: _Remote, decode: InstanceId, start_s: float) -> None:
        st = self.scheduler.instances.get(decode)
        if st is None:
            return
        e.decode = decode
        r = e.event
        started = e.prefill_done
        st.decode.admit(key, r.prompt_tokens, int(r.output_mean), started=started)
        self.scheduler.forecast.add(
            key, decode, start_s, r.prompt_tokens, r.output, started=started
        )

    def _release(
        self, key: RequestId, e: _Remote, *, output_tokens: int | None, now_s: float
    ) -> None:
        s = self.scheduler
        if not e.prefill_done:
            for node in e.event.prefill:
                st = s.instances.get(node)
                if st is not None:
                    st.prefill.drop(key)
        if e.decode is not None:
            st = s.instances.get(e.decode)
            if st is not None:
                st.decode.release(key)
        if output_tokens is not None:
            s.forecast.finished(key, now_s, output_tokens)
        else:
            s.forecast.remove(key)

    def expire(self, replica: str, now_s: float) -> int:
        """``replica`` vanished: drop all its reservations; returns how many."""
        entries = self.by_replica.pop(replica, {})
        for rid, e in entries.items():
            self._release(self.key(replica, rid), e, output_tokens=None, now_s=now_s)
        return len(entries)

    def replace(self, replica: str, snapshot: list[Reserved], now_s: float) -> None:
        """``replica``'s reservations are exactly ``snapshot`` now (a resync)."""
        self.expire(replica, now_s)
        self.by_replica[replica] = {}
        for r in snapshot:
            self.apply(replica, r, now_s)

    def replicas(self) -> list[str]:
        return sorted(self.by_replica)
