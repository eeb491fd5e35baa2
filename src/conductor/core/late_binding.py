"""Late binding: hold requests at the scheduler and place each one only when the cluster
can start it soon, so that every decision sees fresh load and cache state.

A policy opts in with a ``late_binding`` attribute (:class:`LateBinding`; ``conductor``
does); ``SchedulerConfig.policy_params["late_binding"] = 0`` switches it off for a run.
:class:`HoldQueue` is pure bookkeeping over a :class:`~conductor.core.scheduler.Scheduler`:
the shell calls :meth:`HoldQueue.submit` at arrival, :meth:`HoldQueue.release` whenever
the cluster's state may have changed (a prefill or a request ended) or the time
:meth:`HoldQueue.wakeup_s` named has come, and carries out the decisions they return;
:meth:`HoldQueue.withdraw` drops a held request whose client went away.

The queue's order (``age_weight``, ``a``): by ``prefill_s + a * deadline_s`` — shortest
prefill first (predicted at arrival, reusing the longest prefix any instance holds then),
each second waited worth ``a`` seconds of prefill, so a long prefill is overtaken by shorter
ones for at most ``prefill_s / a`` — except that the request with the earliest deadline
(arrival + its TTFT SLO) goes first whenever it would miss that deadline waiting behind the
first by key (with the same predicted prefill times). ``a = inf``: deadline order (with one
SLO for all, arrival order). The request the order names next is released once the two
conditions below hold; while the decode pool has no room for it, the request with the
earliest deadline is tried in its place (a short prompt waiting for decode room must not
hold up the most urgent request), then, with no room for that one either, the next
:data:`BLOCKED_TRY_BY_KEY` by key (a request whose prompt needs less room may fit);
otherwise nothing overtakes it. It goes once

* some prefill instance's predicted backlog is below ``horizon_s`` (the instance will be
  idle within the horizon: the request would not start earlier if it were queued there
  now), and
* with ``decode_aware``, the decode pool has an instance whose predicted TBT with every
  request already assigned to it (also those still in prefill) plus this one is within
  ``1 - tbt_margin`` of the TBT SLO with KV room, or the request's TTFT budget is about to
  run out (waited + its best prefill time + ``horizon_s`` >= its TTFT SLO): then it is
  released anyway and admission decides, so holding never turns into a rejection by
  itself. A request with ``max_tokens`` is read with the first-interval factor
  (:func:`~conductor.core.policies.decode.tbt_factor`) of the same request without it: a
  short ``max_tokens`` makes its own TBT mostly its first interval (factor up to 1.5),
  which waiting does not shorten, and held for it the request would block every request
  behind it.

On release the request is scheduled with its TTFT SLO reduced by the time it waited (so
admission's TTFT check counts the wait); one whose budget is gone is rejected
(``ttft_slo``) without a decision; with ``reject_ahead`` one that would miss its SLO even
in its best case behind the requests held ahead of it is rejected at arrival
(:mod:`conductor.core.hold_reject`). Chunked pipeline parallelism (when the run enables it)
is considered only for a request with nobody held behind it: CPP's helpers must be idle,
and with a queue here instances look idle only because their work waits in it. The queue
only decides *when* the scheduler is asked; admission is the scheduler's, the same for every
policy.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from conductor.core.hold_decode import give_up_s
from conductor.core.hold_reject import doomed
from conductor.core.late_binding_rule import LateBinding
from conductor.core.plan import Decision, Rejection
from conductor.core.types import InstanceId, Request, RequestId

if TYPE_CHECKING:  # the scheduler's policies import this module
    from conductor.core.plan import Prepared
    from conductor.core.scheduler import Scheduler
    from conductor.core.state import InstanceState


_EPS_S = 1e-9
"""Float slack when a wakeup at ``busy_until - horizon`` compares the backlog again."""

BLOCKED_TRY_BY_KEY = 2
"""How many requests after the first by key a release tries, in key order, once both the
first and the most urgent one are held for decode room (their prompts may need less room).
Chosen on generated workloads (``conductor trace synth``, seed 7; docs/policies.md): 0 is
the rule before, 1 changed little, 2 to 8 the same."""

_GONE, _WAIT, _BLOCKED = 0, 1, 2
"""What :meth:`HoldQueue._attempt` did with a held request: placed or rejected it, or left
it held because no prefill instance is free yet, or because the decode pool has no room."""


@dataclass(slots=True, init=False)
class _Held:
    key: float
    """The queue's order: ``prefill_s + age_weight * deadline_s`` (or the deadline)."""
    seq: int
    deadline_s: float = field(compare=False)
    arrival_s: float = field(compare=False)
    prefill_s: float = field(compare=False)
    request: Request = field(compare=False)
    live: bool = field(compare=False)

    def __init__(
        self,
        key: float,
        seq: int,
        deadline_s: float,
        arrival_s: float,
        prefill_s: float,
        request: Request,
        live: bool = True,
    ) -> None:
        self.key = key
        self.seq = seq
        self.deadline_s = deadline_s
        self.arrival_s = arrival_s
        self.prefill_s = prefill_s
        self.request = request
        self.live = live

    def __lt__(self, other: _Held) -> bool:  # the heap's order: key, then arrival (seq)
        return self.key < other.key or (self.key == other.key and self.seq < other.seq)


class HoldQueue:
    """Requests waiting to be placed, in the rule's order (see the module docstring)."""

    def __init__(
        self, scheduler: Scheduler, rule: LateBinding, claim: tuple[int, int, float] = (0, 1, 0.0)
    ) -> None:
        self.scheduler = scheduler
        self.rule = rule
        self.claim = claim
        """``(k, n, lag_s)``: this is replica ``k`` of ``n`` (see :meth:`_claim_offsets`); a
        shell whose membership changes sets it anew."""
        self._offsets: tuple[object, tuple[int, int, float], dict[InstanceId, float]] | None = None
        self._heap: list[_Held] = []  # by key; withdrawn and released entries linger dead
        self._by_deadline: list[tuple[float, int, _Held]] = []  # only when ordered by key
        self._live = 0
        self._seq = 0
        self._give_up_s: float | None = None  # when the held head must go, decode or not

    def __len__(self) -> int:
        return self._live

    @property
    def _by_age(self) -> bool:
        return not math.isinf(self.rule.age_weight)

    def _slo(self, request: Request) -> float:
        return request.ttft_slo_s or self.scheduler.config.ttft_slo_s

    def submit(self, request: Request, now_s: float) -> list[Decision]:
        """Hold ``request`` (arrived at ``now_s``); returns what can be released now."""
        self.scheduler.validate(request)
        self._seq += 1
        deadline = now_s + self._slo(request)
        if self._by_age:
            prefill = self._prefill_s(request)
            held = _Held(
                prefill + self.rule.age_weight * deadline,
                self._seq,
                deadline,
                now_s,
                prefill,
                request,
            )
            if self.rule.reject_ahead and self.scheduler.config.admission != "off":
                doomed = self._doomed(held, now_s)
                if doomed is not None:
                    return [doomed, *self.release(now_s)]
            heapq.heappush(self._by_deadline, (deadline, self._seq, held))
        else:
            held = _Held(deadline, self._seq, deadline, now_s, 0.0, request)
        heapq.heappush(self._heap, held)
        self._live += 1
        return self.release(now_s)

    def _prefill_s(self, request: Request) -> float:
        """The request's prefill time reusing the longest prefix any instance holds now
        (the best it could get, locally or by a fetch), for its place in the queue."""
        sched = self.scheduler
        blocks = sched.index.match(request.block_hashes).best_blocks
        cached = min(blocks * sched.config.block_size_tokens, request.prompt_tokens - 1)
        return sched.cost.prefill_s(request.prompt_tokens, cached)

    def _doomed(self, held: _Held, now_s: float) -> Rejection | None:
        """A rejection for ``held`` (not queued yet) when it misses its TTFT SLO even in
        its best case behind the requests held ahead of it by key
        (:func:`~conductor.core.hold_reject.doomed`)."""
        key = held.key  # every held request came earlier: ahead iff its key is not above
        ahead = sorted(h for h in self._heap if h.live and h.key <= key)
        if not ahead:
            return None  # nothing is held ahead of it: admission judges it when it is tried
        prefill_pool, _ = self.scheduler.pools()
        return doomed(
            self.scheduler,
            [(h.request, h.prefill_s) for h in ahead],
            (held.request, held.prefill_s, held.deadline_s - held.arrival_s),
            self._free_list(prefill_pool),
            now_s,
        )

    def withdraw(self, request_id: RequestId) -> bool:
        """Take a held request out of the queue without a decision (its client went away);
        False when it is not held (placed or rejected already, or never submitted)."""
        held = next((h for h in self._heap if h.live and h.request.request_id == request_id), None)
        if held is None:
            return False
        urgent = self._by_deadline[0][2] if self._by_deadline else None
        if held is self._heap[0] or held is urgent:
            self._give_up_s = None  # that was the held head's
        self._remove(held)
        return True

    def _remove(self, held: _Held) -> None:
        held.live = False
        self._live -= 1
        self._prune()

    def _prune(self) -> None:
        heap, by_deadline = self._heap, self._by_deadline
        while heap and not heap[0].live:
            heapq.heappop(heap)
        while by_deadline and not by_deadline[0][2].live:
            heapq.heappop(by_deadline)

    def free_at_s(self) -> float | None:
        """When the first prefill instance is predicted free: its compute queue done and,
        with ``nic_aware``, its egress done sending the KV it is due to (a prefill instance
        whose compute outruns its NIC is not free); None without prefill instances."""
        free = self._free_times()
        return None if free is None else free[0]

    def _free_list(self, prefill_pool: list[InstanceState]) -> list[float]:
        """When each prefill instance is predicted free (see :meth:`free_at_s`)."""
        offsets = self._claim_offsets(prefill_pool)
        nic = self.scheduler.nic if self.rule.nic_aware else None
        out = []
        for inst in prefill_pool:
            iid = inst.spec.instance_id
            t = inst.prefill.busy_until_s
            if nic is not None:
                t = max(t, nic.out_free_s.get(iid, 0.0), nic.planned_out_s.get(iid, 0.0))
            out.append(t + offsets[iid] if offsets is not None else t)
        return out

    def _free_times(self) -> tuple[float, float] | None:
        """When the first and the second prefill instance are predicted free (see
        :meth:`free_at_s`; the second is ``inf`` with one instance)."""
        prefill_pool, _ = self.scheduler.pools()
        if not prefill_pool:
            return None
        offsets = self._claim_offsets(prefill_pool)
        nic = self.scheduler.nic if self.rule.nic_aware else None
        # NicBook.egress_free_s inlined (this loop runs on every release)
        booked = nic.out_free_s.get if nic is not None else None
        planned = nic.planned_out_s.get if nic is not None else None
        best = second = math.inf
        for inst in prefill_pool:
            t = inst.prefill.busy_until_s
            iid = inst.spec.instance_id
            if booked is not None and planned is not None:
                e = booked(iid, 0.0)
                if e > t:
                    t = e
                e = planned(iid, 0.0)
                if e > t:
                    t = e
            if offsets is not None:
                t += offsets[iid]
            if t < best:
                best, second = t, best
            elif t < second:
                second = t
        return best, second

    def _claim_offsets(self, pool: list[InstanceState]) -> dict[InstanceId, float] | None:
        """With several replicas (``claim = (k, n, lag_s)``: this is replica ``k`` of ``n``,
        whose views of each other lag by up to ``lag_s``), the delay after which this
        replica counts each prefill instance as free: instance ``i`` (in instance-id order)
        is replica ``i mod n``'s to claim at once, the next replica's ``lag_s`` later, and
        so on — so the replicas do not all send their held heads to the instance that just
        freed, none of them yet seeing the others' choice. None with one replica."""
        k, n, lag_s = self.claim
        if n <= 1 or lag_s <= 0.0:
            return None
        cached = self._offsets
        if cached is not None and cached[0] is pool and cached[1] == self.claim:
            return cached[2]
        ids = sorted(inst.spec.instance_id for inst in pool)
        offsets = {iid: ((k - i) % n) * lag_s for i, iid in enumerate(ids)}
        self._offsets = (pool, self.claim, offsets)
        return offsets

    def release(self, now_s: float) -> list[Decision]:
        """Schedule the held requests the cluster can start within the horizon, in the
        queue's order; the first that may not go yet stops the release — except that, when
        the decode pool has no room for it, the request with the earliest deadline is tried
        instead, and then the next few by key (with deadline order that is the same request:
        nothing overtakes the most urgent one). The check and the decision are one
        placement (:meth:`~conductor.core.scheduler.Scheduler.prepare`, then ``decide``)."""
        out: list[Decision] = []
        while self._live:
            free = self._free_times()
            if free is None:
                break  # no prefill instance: keep holding (the gateway would 503 instead)
            backlog = free[0] - now_s if free[0] > now_s else 0.0
            head = self._next(now_s, free)
            outcome = self._attempt(head, now_s, backlog, out)
            if outcome == _BLOCKED and self._by_age:
                # a short request held for decode room must not hold up the most urgent one,
                # nor, when that one has no room either, the next by key
                urgent = self._by_deadline[0][2]
                for other in (urgent, *self._after(head, urgent, BLOCKED_TRY_BY_KEY)):
                    if other is head:
                        continue
                    give_up = self._give_up_s
                    outcome = self._attempt(other, now_s, backlog, out)
                    if outcome != _BLOCKED:
                        break
                    if give_up is not None:
                        assert self._give_up_s is not None
                        self._give_up_s = min(give_up, self._give_up_s)
            if outcome != _GONE:
                break
        return out

    def _after(self, head: _Held, urgent: _Held, n: int) -> list[_Held]:
        """The first ``n`` live requests by key other than ``head`` and ``urgent``, found by
        walking the heap from its root in key order (released and withdrawn entries linger
        in the heap and are stepped over)."""
        heap = self._heap
        out: list[_Held] = []
        frontier = [(heap[0], 0)]
        while frontier and len(out) < n:
            held, i = heapq.heappop(frontier)
            if held.live and held is not head and held is not urgent:
                out.append(held)
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))
        return out

    def _attempt(self, held: _Held, now_s: float, backlog: float, out: list[Decision]) -> int:
        """Place or reject ``held`` now (``_GONE``, the decision appended to ``out``), or
        say why not: ``_WAIT`` (no prefill instance free within the horizon) or ``_BLOCKED``
        (no decode room yet; :meth:`_decode_fits` set the give-up time)."""
        sched = self.scheduler
        slo = self._slo(held.request)
        budget = slo - (now_s - held.arrival_s)
        if backlog > self.rule.horizon_s + _EPS_S and budget > backlog:
            return _WAIT
        if budget <= 0.0:
            self._remove(held)
            rid = held.request.request_id
            why = f"waited {slo - budget:.3f}s, past its TTFT SLO"
            out.append(Rejection(rid, "ttft_slo", why))
            return _GONE
        # CPP only when nobody else waits: with requests held the cluster is busy, and
        # its instances look idle only because the queue is here (CPP's helpers must be)
        prepared = sched.prepare(held.request.with_ttft_slo(budget), now_s, cpp=self._live == 1)
        if isinstance(prepared, Rejection):
            self._remove(held)
            out.append(prepared)
            return _GONE
        if self.rule.decode_aware and not self._decode_fits(prepared, now_s, budget):
            return _BLOCKED
        self._remove(held)
        self._give_up_s = None
        out.append(sched.decide(prepared))
        return _GONE

    def _next(self, now_s: float, free: tuple[float, float]) -> _Held:
        """The request the queue considers next: the first by key, unless the one with the
        earliest deadline would miss its TTFT SLO waiting behind it (for the instance free
        after the first, or for the first once that one's prefill is done; the prefill times
        predicted at arrival): then that one."""
        first = self._heap[0]
        if not self._by_age:
            return first
        urgent = self._by_deadline[0][2]
        if urgent is first:
            return first
        f1, f2 = free
        start = min(f2, max(f1, now_s) + first.prefill_s)
        if urgent.deadline_s <= start + urgent.prefill_s:
            return urgent
        return first

    def _decode_fits(self, prepared: Prepared, now_s: float, budget_s: float) -> bool:
        give_up = give_up_s(self.scheduler, self.rule, prepared, now_s, budget_s)
        if give_up is not None:
            self._give_up_s = give_up
        return give_up is None

    def wakeup_s(self, now_s: float) -> float | None:
        """When the head may be released without any event: the earliest time a prefill
        instance's predicted backlog drops below the horizon (None: nothing held, or only
        an event can change it)."""
        if not self._live:
            return None
        free = self.free_at_s()
        if free is None:
            return None
        t = free - self.rule.horizon_s
        if self._give_up_s is not None and (t <= now_s or self._give_up_s < t):
            t = self._give_up_s
        return t if t > now_s else None
