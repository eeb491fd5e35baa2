"""The TBT a streamed answer had as the gateway relayed it (:class:`TokenGaps`): FAST's
definition (:mod:`conductor.core.tbt`), as the simulator and ``conductor replay`` measure
it. The gateway observes it per completed stream (``conductor_observed_tbt_seconds``), so what the
engines deliver can be told from what reaches a client, and from what the scheduler
predicted (docs/gateway.md "Metrics")."""

from __future__ import annotations

from conductor.core.tbt import tail_mean


class TokenGaps:
    """The intervals between a stream's token events, from the times the relay saw its
    chunks: a chunk carrying ``events`` events adds the gap since the previous one and
    ``events - 1`` zero gaps (its tokens reach the client together); the first chunk's
    first event is the first token (its wait is TTFT, not an interval)."""

    __slots__ = ("gaps", "last_s")

    def __init__(self) -> None:
        self.gaps: list[float] = []
        self.last_s: float | None = None

    def mark(self, now_s: float, events: int) -> None:
        if events <= 0:
            return
        if self.last_s is not None:
            self.gaps.append(now_s - self.last_s)
        if events > 1:
            self.gaps.extend([0.0] * (events - 1))
        self.last_s = now_s

    def tbt_s(self) -> float | None:
        """FAST's TBT of the stream so far; None with fewer than two tokens."""
        return tail_mean(self.gaps)
