"""Overload-oriented admission (arXiv §7): predicted decode load for early rejection.

``DecodeForecast`` keeps, for every request holding a decode reservation, its predicted decode
start (its predicted prefill end, corrected to the real one when prefill finishes) and its
predicted decode end. The *system-level* prediction of arXiv §7.4 assumes a uniform decode
time ``t_d``: at a future moment ``t``, a request is on its decode instance iff
``start <= t < start + t_d``. The *request-level* variant uses the request's own expected
output length times the current step time instead of ``t_d``.

``load_ratio(t)`` is "the average TBT ratio of all decoding instances to l_tbt": for each
decode instance the step time with the requests predicted to be there at ``t``, divided by
the TBT SLO, averaged over the pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conductor.core.costmodel import CostModel
from conductor.core.state import InstanceState
from conductor.core.types import InstanceId, RequestId


@dataclass(slots=True)
class _Entry:
    instance: InstanceId
    start_s: float
    end_s: float
    context_tokens: int


class DecodeForecast:
    """Predicted decode membership over time; see the module docstring.

    ``decode_time_s`` (the uniform t_d) starts at the configured value and then follows the
    decode durations actually observed (start of decode to finish), as an exponentially
    weighted mean with weight ``learning_rate``: the paper leaves t_d unspecified, and a
    fixed guess that is too short admits work the decode pool cannot hold.
    """

    __slots__ = ("_entries", "decode_time_s", "learning_rate")

    def __init__(self, decode_time_s: float = 20.0, learning_rate: float = 0.05) -> None:
        self._entries: dict[RequestId, _Entry] = {}
        self.decode_time_s = decode_time_s
        self.learning_rate = learning_rate

    def __len__(self) -> int:
        return len(self._entries)

    def add(
        self,
        rid: RequestId,
        instance: InstanceId,
        start_s: float,
        duration_s: float,
        context_tokens: int,
    ) -> None:
        self._entries[rid] = _Entry(instance, start_s, start_s + duration_s, context_tokens)

    def started(self, rid: RequestId, now_s: float) -> None:
        """The request's prefill ended at ``now_s``: its decode starts now, not as predicted."""
        e = self._entries.get(rid)
        if e is not None:
            e.end_s += now_s - e.start_s
            e.start_s = now_s

    def remove(self, rid: RequestId) -> None:
        self._entries.pop(rid, None)

    def finished(self, rid: RequestId, now_s: float) -> None:
        """``rid`` left decode at ``now_s``: learn its decode duration, forget it."""
        e = self._entries.pop(rid, None)
        if e is not None and now_s > e.start_s:
            lr = self.learning_rate
            self.decode_time_s += lr * ((now_s - e.start_s) - self.decode_time_s)

    def membership_at(self, t: float) -> dict[InstanceId, tuple[int, int]]:
        """``instance -> (batch size, context tokens)`` predicted at time ``t``."""
        out: dict[InstanceId, tuple[int, int]] = {}
        for e in self._entries.values():
            if e.start_s <= t < e.end_s:
                b, c = out.get(e.instance, (0, 0))
                out[e.instance] = (b + 1, c + e.context_tokens)
        return out

    def load_ratio(
        self,
        t: float,
        pool: Sequence[InstanceState],
        cost: CostModel,
        tbt_slo_s: float,
        extra: tuple[InstanceId, int] | None = None,
    ) -> tuple[float, float]:
        """(mean TBT / SLO over ``pool`` at ``t``, TBT of ``extra``'s instance at ``t``),
        with ``extra = (instance, context tokens)`` added as a request there."""
        members = self.membership_at(t)
        total = 0.0
        own = 0.0
        for inst in pool:
            iid = inst.spec.instance_id
            b, c = members.get(iid, (0, 0))
            if extra is not None and extra[0] == iid:
                b += 1
                c += extra[1]
                own = cost.decode_step_s(b, c)
                total += own
            elif b:
                total += cost.decode_step_s(b, c)
        return (total / len(pool) / tbt_slo_s if pool else 0.0), own
