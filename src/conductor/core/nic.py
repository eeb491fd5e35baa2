"""Predicted NIC occupancy, so that a plan's transfer time includes the wait for the NICs.

Every KV transfer a plan makes (a prefix fetch to the prefill instance, the prompt's KV to
the decode instance) holds the source's egress and the target's ingress for its predicted
time, after the transfers already requested on either (FIFO per NIC direction in the order the
transfers are requested, the model the simulator executes). A transfer's predicted time is
then its wait plus its own duration. The prompt's KV hand-off to the decode instance is
requested only when its prefill ends (it may start, streaming, from the prefill's start):
until that predicted end it is held back, so that it does not make the prefill instance's
egress look busy from the moment of the plan on (a fetch from it, requested before, goes
first, as in the simulator). When the prefill really ends (:meth:`NicBook.handoff_now`, on
``PrefillFinished``) the hand-off is booked then, and the plans still pending are chained
again without it: a prefill predicted to end late (behind a long queue the engine did not
keep: it runs prompts side by side) would otherwise leave its NICs looking busy until its
predicted end, long after its KV moved. Pure bookkeeping: times come in as arguments.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from conductor.core.types import InstanceId

if TYPE_CHECKING:
    from conductor.core.policies.base import PrefillChoice, SchedulingContext


@dataclass(slots=True, init=False, unsafe_hash=True)
class Transfers:
    """One plan's KV transfers, times relative to the plan: a prefix fetch of ``fetch_s``
    from ``fetch_source`` into ``prefill`` (None: no fetch), and the prompt's KV hand-off of
    ``handoff_s`` from ``prefill`` to ``decode`` (None: it decodes where it prefilled),
    requested ``handoff_request_s`` after the plan and streaming from ``handoff_start_s``
    after it. What a replica publishes so the others book the same NIC time."""

    prefill: Final[InstanceId]
    fetch_source: Final[InstanceId | None]
    fetch_s: Final[float]
    decode: Final[InstanceId | None]
    handoff_start_s: Final[float]
    handoff_request_s: Final[float]
    handoff_s: Final[float]

    def __init__(
        self,
        prefill: InstanceId,
        fetch_source: InstanceId | None,
        fetch_s: float,
        decode: InstanceId | None,
        handoff_start_s: float,
        handoff_request_s: float,
        handoff_s: float,
    ) -> None:
        self.prefill = prefill
        self.fetch_source = fetch_source
        self.fetch_s = fetch_s
        self.decode = decode
        self.handoff_start_s = handoff_start_s
        self.handoff_request_s = handoff_request_s
        self.handoff_s = handoff_s


@dataclass(slots=True)
class NicBook:
    """When each instance's egress (``out_free_s``) and ingress (``in_free_s``) is next free,
    as predicted from the transfers booked so far."""

    out_free_s: dict[InstanceId, float] = field(default_factory=dict)
    in_free_s: dict[InstanceId, float] = field(default_factory=dict)
    pending: list[tuple[float, int, InstanceId, InstanceId, float, float]] = field(
        default_factory=list
    )
    """Transfers requested in the future: a heap of (request time, sequence, source, target,
    earliest start, seconds), booked once ``now_s`` reaches their request time."""
    _seq: int = 0
    planned_in_s: dict[InstanceId, float] = field(default_factory=dict)
    """When each ingress is free once every transfer booked *or pending* into it has run
    (pending ones chained in booking order from their earliest start): what a decode
    instance's ingress looks like when a new hand-off reaches it."""
    planned_out_s: dict[InstanceId, float] = field(default_factory=dict)
    """The same for each egress: when a prefill instance has sent every KV it is due to."""
    keyed: dict[object, tuple[float, int, InstanceId, InstanceId, float, float]] = field(
        default_factory=dict
    )
    """The pending transfers booked with a key (a request's hand-off), by key."""
    key_of: dict[int, object] = field(default_factory=dict)
    """The key of each keyed pending transfer, by sequence number."""
    latest_request_s: float = 0.0
    """The latest request time of any transfer made pending (an upper bound on the
    pending ones')."""
    dropped: set[int] = field(default_factory=set)
    """Sequence numbers of pending transfers taken out of ``pending`` early (booked at
    their real request time, or cancelled): skipped when the heap reaches them."""

    def later(
        self,
        request_s: float,
        source: InstanceId,
        target: InstanceId,
        start_s: float,
        seconds: float,
        key: object = None,
    ) -> None:
        """Book a transfer that will be requested at ``request_s`` (it may start from
        ``start_s``); it holds no NIC for requests made before ``request_s``. With ``key``
        (a request id), :meth:`handoff_now` or :meth:`cancel` can find it again."""
        self._seq += 1
        entry = (request_s, self._seq, source, target, start_s, seconds)
        heapq.heappush(self.pending, entry)
        if request_s > self.latest_request_s:
            self.latest_request_s = request_s
        if key is not None:
            self.keyed[key] = entry
            self.key_of[self._seq] = key
        planned = self.planned_in_s.get(target, 0.0)
        self.planned_in_s[target] = (planned if planned > start_s else start_s) + seconds
        planned = self.planned_out_s.get(source, 0.0)
        self.planned_out_s[source] = (planned if planned > start_s else start_s) + seconds

    def release(self, now_s: float) -> None:
        """Book, in request order, the pending transfers requested by ``now_s``."""
        pending = self.pending
        dropped = self.dropped
        key_of = self.key_of
        while pending and pending[0][0] <= now_s:
            _, seq, source, target, start_s, seconds = heapq.heappop(pending)
            if dropped and seq in dropped:
                dropped.discard(seq)
                continue
            if key_of:
                key = key_of.pop(seq, None)
                if key is not None:
                    del self.keyed[key]
            self.book(source, target, start_s, seconds)

    def release_due(self, now_s: float) -> None:
        """:meth:`release`, when some pending transfer has been requested by ``now_s``."""
        if self.pending and self.pending[0][0] <= now_s:
            self.release(now_s)

    def wait_s(self, source: InstanceId | None, target: InstanceId, now_s: float) -> float:
        """How long a transfer from ``source`` to ``target`` requested at ``now_s`` waits."""
        if source is None:
            return 0.0
        self.release_due(now_s)
        free = max(self.out_free_s.get(source, 0.0), self.in_free_s.get(target, 0.0))
        return free - now_s if free > now_s else 0.0

    def book(self, source: InstanceId, target: InstanceId, start_s: float, seconds: float) -> float:
        """Book a transfer of ``seconds`` from ``source`` to ``target`` starting no earlier
        than ``start_s``; returns its predicted end."""
        start = max(start_s, self.out_free_s.get(source, 0.0), self.in_free_s.get(target, 0.0))
        end = start + seconds
        self.out_free_s[source] = end
        self.in_free_s[target] = end
        if end > self.planned_in_s.get(target, 0.0):
            self.planned_in_s[target] = end
        if end > self.planned_out_s.get(source, 0.0):
            self.planned_out_s[source] = end
        return end

    def handoff_now(self, key: object, now_s: float) -> None:
        """The transfer booked under ``key`` is requested now (its prefill has ended): book
        it from now (or from its planned start, if that is earlier), and chain the pending
        ones again without it. Nothing if it was booked already or never keyed."""
        entry = self._unkey(key, now_s)
        if entry is not None:
            _, _, source, target, start_s, seconds = entry
            self.book(source, target, start_s if start_s < now_s else now_s, seconds)
            self._replan()

    def cancel(self, key: object, now_s: float) -> None:
        """Forget the pending transfer booked under ``key`` (its request ended before its
        prefill did), and chain the pending ones again without it."""
        if self._unkey(key, now_s) is not None:
            self._replan()

    def _unkey(
        self, key: object, now_s: float
    ) -> tuple[float, int, InstanceId, InstanceId, float, float] | None:
        """Take the pending transfer of ``key`` out (lazily: the heap skips it), after
        booking what is due by ``now_s``; None if it is not pending."""
        self.release_due(now_s)  # what was requested before this one goes first
        entry = self.keyed.pop(key, None)
        if entry is None:  # not keyed, or booked by its request time already
            return None
        del self.key_of[entry[1]]
        self.dropped.add(entry[1])
        return entry

    def _replan(self) -> None:
        """``planned_in_s`` / ``planned_out_s`` from the booked NIC times and every pending
        transfer chained in booking order (as :meth:`later` chains them)."""
        self.planned_in_s, self.planned_out_s = self._chained(math.inf)

    def planned_before(
        self, request_s: float
    ) -> tuple[dict[InstanceId, float], dict[InstanceId, float]]:
        """``(planned_in_s, planned_out_s)`` as a transfer requested at ``request_s`` finds
        them: the pending transfers requested after it go after it (FIFO per NIC direction
        in request order; at the same time, in the order made), so only those requested by
        then are chained. The book's own dicts when no pending transfer is requested later."""
        pending = self.pending
        if not pending or self.latest_request_s <= request_s:
            return self.planned_in_s, self.planned_out_s
        return self._chained(request_s)

    def _chained(self, request_s: float) -> tuple[dict[InstanceId, float], dict[InstanceId, float]]:
        """The booked NIC times with the pending transfers requested by ``request_s``
        chained on them in booking order (the dropped ones left out)."""
        dropped = self.dropped
        planned_in = dict(self.in_free_s)
        planned_out = dict(self.out_free_s)
        for req_s, seq, source, target, start_s, seconds in sorted(self.pending, key=_by_seq):
            if req_s > request_s or seq in dropped:
                continue
            p = planned_in.get(target, 0.0)
            planned_in[target] = (p if p > start_s else start_s) + seconds
            p = planned_out.get(source, 0.0)
            planned_out[source] = (p if p > start_s else start_s) + seconds
        return planned_in, planned_out

    def egress_free_s(
        self, source: InstanceId, planned_out: dict[InstanceId, float] | None = None
    ) -> float:
        """When ``source``'s egress has sent everything booked or planned on it (planned:
        ``planned_out``, e.g. from :meth:`planned_before`; the book's own by default)."""
        booked = self.out_free_s.get(source, 0.0)
        planned = (self.planned_out_s if planned_out is None else planned_out).get(source, 0.0)
        return booked if booked > planned else planned

    def handoff_tail_s(
        self, source: InstanceId, target: InstanceId, start_s: float, end_s: float, seconds: float
    ) -> float:
        """How long after ``end_s`` (the prefill's predicted end, when it is requested) a
        hand-off of ``seconds`` from ``source`` to ``target``, streaming from ``start_s``, is
        predicted to end: it waits for ``source``'s egress and ``target``'s ingress as
        booked, and for the transfers planned on them that are requested by ``end_s``
        (:meth:`planned_before`)."""
        planned_in, planned_out = self.planned_before(end_s)
        start = max(start_s, self.egress_free_s(source, planned_out), planned_in.get(target, 0.0))
        tail = start + seconds - end_s
        return tail if tail > 0.0 else 0.0

    def book_plan(
        self, ctx: SchedulingContext, pre: PrefillChoice, decode: InstanceId
    ) -> Transfers:
        """Book a plan's KV transfers (:meth:`transfers`; the hand-off keyed by the request
        id) and return them."""
        planned = self.transfers(ctx, pre, decode)
        self.book_transfers(planned, ctx.now_s, ctx.request.request_id)
        return planned

    @staticmethod
    def transfers(ctx: SchedulingContext, pre: PrefillChoice, decode: InstanceId) -> Transfers:
        """A plan's KV transfers: the prefix fetch now, and the prompt's KV to ``decode``
        (less what ``decode`` already holds), requested at the predicted end of the prefill
        and streamed (layer by layer) from its predicted start."""
        cost = ctx.cost
        bw = next(
            (
                i.spec.nic_bytes_per_s
                for i in ctx.prefill_pool
                if i.spec.instance_id == pre.instance
            ),
            None,
        )
        fetch = pre.fetch_source if pre.fetch_tokens > 0 else None
        fetch_s = cost.transfer_s(pre.fetch_tokens, bw) if fetch is not None else 0.0
        if decode == pre.instance:
            return Transfers(pre.instance, fetch, fetch_s, None, 0.0, 0.0, 0.0)
        return Transfers(
            pre.instance,
            fetch,
            fetch_s,
            decode,
            pre.ttft_s - pre.prefill_s,
            pre.ttft_s,
            cost.transfer_s(ctx.handoff_tokens(decode), bw),
        )

    def book_transfers(self, t: Transfers, now_s: float, key: object = None) -> None:
        """Book ``t`` (planned at ``now_s``: its times count from then); ``key`` names its
        hand-off for :meth:`handoff_now`."""
        self.release(now_s)
        if t.fetch_source is not None and t.fetch_s > 0.0:
            self.book(t.fetch_source, t.prefill, now_s, t.fetch_s)
        if t.decode is not None:
            self.later(
                now_s + t.handoff_request_s,
                t.prefill,
                t.decode,
                now_s + t.handoff_start_s,
                t.handoff_s,
                key,
            )


def _by_seq(entry: tuple[float, int, InstanceId, InstanceId, float, float]) -> int:
    return entry[1]
