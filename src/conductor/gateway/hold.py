"""Late binding in the gateway: an asyncio shell over one pool's
:class:`~conductor.core.late_binding.HoldQueue`.

:meth:`Hold.place` submits a request; one the queue releases at once is decided there and
then, any other waits on a future until a later release hands it its decision. Releases
happen on every submit, whenever something may have freed capacity (:meth:`Hold.release`:
a flight's prefill or request ended or was cancelled, an engine joined, left or changed
state) and on a timer at the queue's ``wakeup_s``, which is in the gateway's clock and is
mapped onto the event loop's (``loop.call_at``). A held request whose client goes away (its
task is cancelled) is withdrawn, and so is one still held at its request's deadline (then
rejected, ``request_timeout``: 429); a decision that reached a request whose client had just
gone is cancelled in the scheduler. The rule is the policy's without the conditions the
gateway cannot predict (:meth:`Hold._rule`). Off when the policy has no late binding or the run
switches it off (``policy_params["late_binding"] = 0``): then :meth:`Hold.place` is
``schedule()``; also while the pool has no schedulable engine (so the request gets its
``no_instance`` answer, not a wait).

With a :class:`~conductor.core.replication.ReplicaScheduler` (``--cluster``, ``--workers``)
each replica holds its own queue (a plan it commits is published by ``decide``) and claims
a freed prefill instance in its turn among the live replicas (:meth:`Hold.set_claim`, kept
up to date by the replica sync).

Everything runs on the gateway's one event loop: no lock.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from conductor.core.late_binding import HoldQueue
from conductor.core.late_binding_rule import LateBinding, late_binding_of
from conductor.core.plan import Decision, Plan, Rejection
from conductor.core.scheduler import Scheduler
from conductor.core.types import Request, RequestId
from conductor.gateway.metrics import PoolMetrics


@dataclass(frozen=True, slots=True)
class Placed:
    """A request's decision, the wall time the scheduler took to make it (``decide_s``; a
    release that decided several shares its time among them) and how long it was held
    (``held_s``, gateway clock; 0 when placed at once)."""

    decision: Decision
    decide_s: float
    held_s: float


@dataclass(slots=True)
class _Waiter:
    request: Request
    since_s: float
    future: asyncio.Future[Placed]


class Hold:
    """One pool's hold queue in the event loop; see the module docstring.

    Invariant: a request is in ``queue`` exactly while it has a waiter here.
    """

    def __init__(
        self, scheduler: Scheduler, clock: Callable[[], float], metrics: PoolMetrics
    ) -> None:
        self.scheduler = scheduler
        self.clock = clock
        self.metrics = metrics
        self.policy_rule = late_binding_of(scheduler)
        rule = self._rule()
        self.queue: HoldQueue | None = None if rule is None else HoldQueue(scheduler, rule)
        self._waiting: dict[RequestId, _Waiter] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at_s = math.inf

    @property
    def enabled(self) -> bool:
        return self.queue is not None

    def __len__(self) -> int:
        return len(self._waiting)

    def _rule(self) -> LateBinding | None:
        """The policy's rule as the gateway can run it: without the NIC condition (the
        engines hand KV off through their own connectors, which the gateway does not see
        sending; the hand-off's predicted time still counts in the decode choice)."""
        rule = self.policy_rule
        if rule is None:
            return None
        return replace(rule, nic_aware=False)

    def set_claim(self, rank: int, replicas: int, lag_s: float) -> None:
        """This replica is ``rank`` of ``replicas`` live ones whose views lag by up to
        ``lag_s``: it counts a freed prefill instance free in its turn (``HoldQueue``'s
        ``claim``), so the replicas do not all send their held heads to it."""
        if self.queue is not None:
            self.queue.claim = (rank, replicas, lag_s)
            self.release()

    def engines_changed(self) -> None:
        """An engine joined, left or changed state: capacity may have changed."""
        self.release()

    def _servable(self) -> bool:
        prefill, decode = self.scheduler.pools()
        return bool(prefill) and bool(decode)

    async def place(self, request: Request, now_s: float, deadline: float | None = None) -> Placed:
        """``request``'s decision (arrived at ``now_s``, gateway clock), once the queue
        releases it, or a ``request_timeout`` rejection if it is still held at ``deadline``
        (the event loop's time: the request's own deadline); raises ``InvalidInput`` for a
        request the scheduler refuses to look at, and ``CancelledError`` (after withdrawing
        it) when its task is cancelled."""
        queue = self.queue
        if queue is None or not self._servable():
            t0 = time.perf_counter()
            decision = self.scheduler.schedule(request, now_s)
            return Placed(decision, time.perf_counter() - t0, 0.0)
        t0 = time.perf_counter()
        decisions = queue.submit(request, now_s)
        decide_s = time.perf_counter() - t0
        rid = request.request_id
        mine = self._hand_out(decisions, decide_s, now_s, request)
        if mine is not None:
            self._arm(now_s)
            return mine
        loop = asyncio.get_running_loop()
        waiter = _Waiter(request, now_s, loop.create_future())
        self._waiting[rid] = waiter
        self._arm(now_s)
        expiry = None if deadline is None else loop.call_at(deadline, self._expire, waiter)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._abandon(waiter)
            raise
        finally:
            if expiry is not None:
                expiry.cancel()

    def release(self) -> None:
        """Place what the queue can place now (something may have freed capacity)."""
        queue = self.queue
        if queue is None or not self._waiting:
            return
        now_s = self.clock()
        if not self._servable():
            self._flush(now_s)
            return
        t0 = time.perf_counter()
        decisions = queue.release(now_s)
        self._hand_out(decisions, time.perf_counter() - t0, now_s, None)
        self._arm(now_s)

    def _hand_out(
        self, decisions: list[Decision], decide_s: float, now_s: float, own: Request | None
    ) -> Placed | None:
        """Give each decision to its request: ``own``'s is returned, the others resolve
        their waiters' futures (a waiter whose client is gone has its plan cancelled)."""
        mine: Placed | None = None
        share_s = decide_s / len(decisions) if decisions else 0.0
        for d in decisions:
            rid = d.request_id
            if own is not None and rid == own.request_id:
                self._observe(d, 0.0)
                mine = Placed(d, share_s, 0.0)
                continue
            waiter = self._waiting.pop(rid)
            held_s = now_s - waiter.since_s
            if waiter.future.done():  # cancelled: its task has not run its handler yet
                self._observe(None, held_s)
                if isinstance(d, Plan):
                    self.scheduler.cancel(rid)
                continue
            self._observe(d, held_s)
            waiter.future.set_result(Placed(d, share_s, held_s))
        return mine

    def _abandon(self, waiter: _Waiter) -> None:
        """The request's task was cancelled (client gone) while it waited."""
        rid = waiter.request.request_id
        if self._waiting.pop(rid, None) is not None:
            assert self.queue is not None
            self.queue.withdraw(rid)
            self._observe(None, self.clock() - waiter.since_s)
            self.release()  # it may have been the head that held the others back
            return
        future = waiter.future
        if future.done() and not future.cancelled():  # decided, then cancelled at once
            placed = future.result()
            if isinstance(placed.decision, Plan):
                self.scheduler.cancel(rid)
                self.release()

    def _expire(self, waiter: _Waiter) -> None:
        """The request's deadline came while it was held: it leaves with a rejection."""
        rid = waiter.request.request_id
        if self._waiting.pop(rid, None) is None or waiter.future.done():
            return
        assert self.queue is not None
        self.queue.withdraw(rid)
        held_s = self.clock() - waiter.since_s
        why = f"waited {held_s:.3f}s in the queue, past the request's deadline"
        decision = Rejection(rid, "request_timeout", why)
        self._observe(decision, held_s)
        waiter.future.set_result(Placed(decision, 0.0, held_s))
        self.release()  # it may have been the head that held the others back

    def _flush(self, now_s: float) -> None:
        """No engine can serve: every held request gets its answer now (``no_instance``)."""
        assert self.queue is not None
        for rid, waiter in list(self._waiting.items()):
            self.queue.withdraw(rid)
            del self._waiting[rid]
            decision = self.scheduler.schedule(waiter.request, now_s)
            held_s = now_s - waiter.since_s
            if waiter.future.done():
                if isinstance(decision, Plan):  # cannot happen without engines; be safe
                    self.scheduler.cancel(rid)
                continue
            self._observe(decision, held_s)
            waiter.future.set_result(Placed(decision, 0.0, held_s))
        self._disarm()

    def _observe(self, decision: Decision | None, held_s: float) -> None:
        """The hold time of a request leaving the queue (``decision`` None: withdrawn)."""
        if decision is None:
            outcome = "withdrawn"
        else:
            outcome = "rejected" if isinstance(decision, Rejection) else "placed"
        self.metrics.child(self.metrics.hold_time, outcome).observe(held_s)

    # -- the wakeup timer ----------------------------------------------------------------
    def _arm(self, now_s: float) -> None:
        """A timer at the queue's wakeup (gateway clock, mapped onto the loop's), unless an
        earlier one is set; none when nothing is held or only an event can release."""
        assert self.queue is not None
        wake = self.queue.wakeup_s(now_s) if self._waiting else None
        if wake is None:
            self._disarm()
            return
        if self._timer is not None and self._timer_at_s <= wake:
            return
        self._disarm()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_at(loop.time() + (wake - self.clock()), self._wake)
        self._timer_at_s = wake

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at_s = math.inf

    def _wake(self) -> None:
        self._timer = None
        self._timer_at_s = math.inf
        self.release()  # re-arms

    def describe(self) -> dict[str, object]:
        """The queue as the admin API shows it."""
        rule = self.queue.rule if self.queue is not None else None
        return {
            "late_binding": None
            if rule is None
            else {
                "horizon_s": rule.horizon_s,
                "decode_aware": rule.decode_aware,
                "tbt_margin": rule.tbt_margin,
                "headroom_margin": rule.headroom_margin,
                "nic_aware": rule.nic_aware,
            },
            "held_requests": len(self._waiting),
        }
