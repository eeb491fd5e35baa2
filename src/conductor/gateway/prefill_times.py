"""How long each prefill took on its engine, as the gateway can observe it.

The gateway sees when it sent a request to its prefill engine and when the prefill ended
(the prefill leg's answer, or the first streamed token), not the engine's own timings. An
engine works its prefills one after another, as the cost model prices them, so a prefill's
duration is taken from the later of its dispatch and the engine's previous observed prefill
end to its own end: a request queued behind another counts only its own share. What this
measures includes the HTTP round trip and the engine's own overheads. It feeds
``PrefillFinished.duration_s``, from which the scheduler corrects its prefill model online
(:mod:`conductor.core.correction`).
"""

from __future__ import annotations

from conductor.core.types import InstanceId


class PrefillTimes:
    """Per engine, the end of its last observed prefill."""

    __slots__ = ("_last_end_s",)

    def __init__(self) -> None:
        self._last_end_s: dict[InstanceId, float] = {}

    def duration_s(self, engine: InstanceId, dispatched_s: float, end_s: float) -> float:
        """The prefill dispatched to ``engine`` at ``dispatched_s`` ended at ``end_s``: its
        duration (0 or more), and the engine's last end moves on."""
        last = self._last_end_s.get(engine)
        start = dispatched_s if last is None or last < dispatched_s else last
        if last is None or end_s > last:
            self._last_end_s[engine] = end_s
        return end_s - start if end_s > start else 0.0
