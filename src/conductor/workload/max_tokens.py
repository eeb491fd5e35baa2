"""What a replayed request tells the scheduler about its output (``--max-tokens``).

A trace records how many tokens each request generated; a gateway never knows that in
advance. :class:`MaxTokens` decides what a replay sends as ``max_tokens`` and what the
simulated engine then generates:

* ``none`` (default): no ``max_tokens`` (the cap is the model's context); the engine
  generates the trace's length;
* ``trace``: the trace's true length is sent as ``max_tokens`` (a client that knows it);
* ``cap:N``: ``max_tokens = N``; the engine generates ``min(trace, N)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from conductor.core.errors import InvalidInput

MODES = ("none", "trace", "cap")


@dataclass(frozen=True, slots=True)
class MaxTokens:
    """One ``--max-tokens`` setting: ``mode`` in :data:`MODES`, ``cap`` for ``cap``."""

    mode: str = "none"
    cap: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidInput("max_tokens", self.mode, "must be none, trace or cap:N")
        if self.mode == "cap" and (self.cap is None or self.cap < 1):
            raise InvalidInput("max_tokens", f"cap:{self.cap}", "N must be an integer >= 1")

    @classmethod
    def parse(cls, text: str) -> MaxTokens:
        """``none``, ``trace`` or ``cap:N``; anything else raises :class:`InvalidInput`
        naming ``max_tokens`` and the text."""
        value = text.strip().lower()
        if value in ("none", "trace"):
            return cls(value)
        head, sep, tail = value.partition(":")
        if head != "cap" or not sep:
            raise InvalidInput("max_tokens", text, "must be none, trace or cap:N")
        try:
            n = int(tail)
        except ValueError:
            raise InvalidInput("max_tokens", text, "N must be an integer >= 1") from None
        if n < 1:
            raise InvalidInput("max_tokens", text, "N must be an integer >= 1")
        return cls("cap", n)

    def __str__(self) -> str:
        return f"cap:{self.cap}" if self.mode == "cap" else self.mode

    def sent(self, trace_output_tokens: int) -> int | None:
        """The ``max_tokens`` the request carries."""
        if self.mode == "trace":
            return max(1, trace_output_tokens)
        return self.cap  # None for "none"

    def generated(self, trace_output_tokens: int) -> int:
        """How many tokens the simulated engine generates."""
        if self.cap is not None:
            return min(trace_output_tokens, self.cap)
        return trace_output_tokens


NO_MAX_TOKENS = MaxTokens()
"""The default: requests carry no ``max_tokens``."""
