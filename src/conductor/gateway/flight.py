"""One accepted request's life in the scheduler: from ``schedule()`` to ``RequestFinished``
or ``cancel()``.

Invariants:

- :meth:`Flight.close` runs at most once, and every flight is closed: by the request path
  when it ends, by the streaming response when its body ends or the client goes away
  (:class:`~conductor.gateway.proxy.TrackedStream`), and by the retry loop when an attempt
  fails. A completed flight emits ``RequestFinished``; any other ending calls ``cancel()``.
- ``PrefillFinished`` is emitted at most once, before ``RequestFinished``.
- Events go to an engine only while it is the same registered instance as at scheduling
  time (an engine removed meanwhile took the request's bookkeeping with it).
- ``on_change`` (late binding's release, :mod:`conductor.gateway.hold`) is called after
  each transition that may free capacity: the prefill's end, the flight's end.
"""

from __future__ import annotations

import asyncio
import enum
import json
import re
from collections.abc import Callable

from conductor.core.events import PrefillFinished, RequestFinished
from conductor.core.plan import Plan
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceState
from conductor.core.types import InstanceId, RequestId
from conductor.gateway.metrics import PoolMetrics
from conductor.gateway.prefill_times import PrefillTimes
from conductor.gateway.stream_tbt import TokenGaps

_USAGE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')


def completion_tokens(body: bytes) -> int | None:
    """``usage.completion_tokens`` of an OpenAI JSON answer (None when absent)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    usage = data.get("usage") if isinstance(data, dict) else None
    n = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


class StreamTokens:
    """Counts the generated tokens of an SSE stream as it passes: the ``usage`` chunk's
    ``completion_tokens`` when the engine sends one (``stream_options.include_usage``),
    else one token per ``data:`` event that is not ``[DONE]`` (vLLM sends one per token,
    so this is a lower bound when it merges some)."""

    __slots__ = ("events", "usage")

    def __init__(self) -> None:
        self.events = 0
        self.usage: int | None = None

    def feed(self, chunk: bytes) -> int:
        """Count ``chunk``; returns its token events (``[DONE]`` and a usage-only event with
        no choices not counted)."""
        n = chunk.count(b"data: ") - chunk.count(b"data: [DONE]")
        m = _USAGE.search(chunk) if b"completion_tokens" in chunk else None
        if m is not None:
            self.usage = int(m.group(1))
            n -= len(_NO_CHOICES.findall(chunk))
        self.events += n
        return n

    @property
    def tokens(self) -> int:
        return self.usage if self.usage is not None else self.events


class Outcome(enum.Enum):
    COMPLETED = "completed"
    UPSTREAM_ERROR = "upstream_error"
    CLIENT_DISCONNECT = "client_disconnect"
    TIMEOUT = "timeout"
    RETRIED = "retried"
    ERROR = "error"


class Mode(enum.Enum):
    AGGREGATED = "aggregated"
    DISAGGREGATED = "disaggregated"


class Flight:
    """Bookkeeping of one scheduled attempt; see the module docstring."""

    def __init__(
        self,
        conductor: Scheduler,
        plan: Plan,
        mode: Mode,
        *,
        clock: Callable[[], float],
        metrics: PoolMetrics,
        scheduled_at_s: float,
        on_change: Callable[[], None] | None = None,
        prefill_times: PrefillTimes | None = None,
        dispatched_at_s: float | None = None,
    ) -> None:
        self.conductor = conductor
        self.plan = plan
        self.mode = mode
        self.clock = clock
        self.metrics = metrics
        self.scheduled_at_s = scheduled_at_s
        self.decode: InstanceId = plan.decode
        self._prefill_state = conductor.instances.get(plan.prefill)
        self._decode_state = conductor.instances.get(plan.decode)
        self.prefill_done = False
        self.first_token_seen = False
        self.outcome: Outcome | None = None
        self.output_tokens: int | None = None
        """The tokens the engine generated, once known (``RequestFinished`` carries it)."""
        self.token_gaps: TokenGaps | None = None
        """A streamed answer's token intervals as relayed (its TBT is observed on completion)."""
        self._timer: asyncio.TimerHandle | None = None
        self._on_change = on_change
        """Called after each event that may free capacity (late binding's release)."""
        self._times = prefill_times
        self.dispatched_at_s = scheduled_at_s if dispatched_at_s is None else dispatched_at_s
        """When the request left for its prefill engine (after any wait in the hold queue)."""

    @property
    def request_id(self) -> RequestId:
        return self.plan.request_id

    @property
    def closed(self) -> bool:
        return self.outcome is not None

    def _same(self, instance: InstanceId, state: InstanceState | None) -> bool:
        return state is not None and self.conductor.instances.get(instance) is state

    def set_decode(self, instance: InstanceId) -> None:
        """The decode instance was (re)chosen at the end of prefill (``confirm_decode``)."""
        self.decode = instance
        self._decode_state = self.conductor.instances.get(instance)

    def prefill_finished(self, at_s: float | None = None) -> None:
        """The prefill ended at ``at_s`` (default now), observed: prefill leg answered, or
        first token seen. Its duration (:mod:`conductor.gateway.prefill_times`) goes with
        the event, for the scheduler's online correction."""
        if self.prefill_done or self.closed:
            return
        self._end_prefill(observed_at_s=self.clock() if at_s is None else at_s)

    def _assumed_prefill_end(self) -> None:
        if not (self.prefill_done or self.closed):
            self._end_prefill()

    def _end_prefill(self, observed_at_s: float | None = None) -> None:
        if self.prefill_done:
            return
        self.prefill_done = True
        self._cancel_timer()
        if self._same(self.plan.prefill, self._prefill_state):
            prefill = self.plan.prefill
            took: float | None = None
            cached: int | None = None
            if observed_at_s is not None and self._times is not None and self.plan.cpp is None:
                took = self._times.duration_s(prefill, self.dispatched_at_s, observed_at_s)
                cached = self.plan.cached_tokens
            self.conductor.on_event(
                PrefillFinished(self.request_id, prefill, self.clock(), took, cached)
            )
            if self._on_change is not None:
                self._on_change()

    def first_token(self, at_s: float | None = None) -> None:
        """The first generated token reached us (streaming) at ``at_s`` (default now):
        observe TTFT."""
        if self.first_token_seen:
            return
        self.first_token_seen = True
        seen_s = self.clock() if at_s is None else at_s
        self.metrics.child(self.metrics.observed_ttft, self.plan.policy, self.mode.value).observe(
            seen_s - self.scheduled_at_s
        )
        self.prefill_finished(seen_s)

    def assume_prefill_end(self, loop: asyncio.AbstractEventLoop) -> None:
        """When the prefill's end cannot be observed (a non-streamed aggregated answer
        arrives whole), take it to end at its predicted time rather than hold the engine's
        prefill queue for the whole generation."""
        if not self.prefill_done and self._timer is None:
            self._timer = loop.call_later(
                max(self.plan.predicted_ttft_s, 0.0), self._assumed_prefill_end
            )

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self, outcome: Outcome, *, soon: asyncio.AbstractEventLoop | None = None) -> None:
        """End the flight (idempotent): ``RequestFinished`` if completed, else ``cancel()``.
        With ``soon``, the flight is closed now but the scheduler and metrics hear of it on
        that loop's next pass (after what is queued to be sent goes out)."""
        if self.closed:
            return
        self.outcome = outcome
        if soon is None:
            self._settle(outcome)
        else:
            soon.call_soon(self._settle, outcome)

    def _settle(self, outcome: Outcome) -> None:
        self._cancel_timer()
        if outcome is Outcome.COMPLETED:
            self._end_prefill()
            tbt = self.token_gaps.tbt_s() if self.token_gaps is not None else None
            if tbt is not None:
                self.metrics.child(self.metrics.observed_tbt, self.plan.policy).observe(tbt)
            if self._same(self.decode, self._decode_state):
                self.conductor.on_event(
                    RequestFinished(self.request_id, self.decode, self.clock(), self.output_tokens)
                )
            else:
                self.conductor.cancel(self.request_id)
        else:
            self.conductor.cancel(self.request_id)
        self.metrics.child(self.metrics.finished, outcome.value).inc()
        if self._on_change is not None:
            self._on_change()
