"""The decode forecast behind predictive admission (arXiv §7.4), without oracle lengths.

For every request holding a decode reservation :class:`DecodeForecast` keeps its decode
instance, its decode start (the predicted prefill end, then the real one once its prefill
finished), its prompt and its predicted output (:class:`OutputEstimate`). At a decision at
``now``, a request's predicted decode end is

* not started yet: ``start + E[min(L, cap)] * token_s``;
* decoding since ``start``: it has produced about ``g = (now - start) / token_s`` tokens, so
  it ends at ``now + E[min(L, cap) - g | L > g] * token_s`` (:meth:`OutputLengthModel.remaining`):
  a request stays in the forecast as long as it runs, however far past the mean it goes
  (the forecast of the paper's uniform ``t_d`` dropped 20% of the running requests).

A member's decode step cost reads its mean context over the rest of its decode (prompt +
generated + half of what it has left: the KV grows a token per step and the step is linear
in the context); the KV room check reads its context at its end.

``token_s`` (seconds per output token, queueing in the decode batch included) is learnt as
an exponentially weighted mean of finished requests' ``decode time / (output tokens - 1)``,
starting at the TBT SLO (conservative: requests stay longer until it is learnt).

:meth:`DecodeForecast.window` turns that into, per decode instance, the load over a future
window ``[t0, t1]``: membership changes only when a request starts or ends, so one sweep over
those moments finds the peak batch, context and step time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conductor.core.costmodel import CostModel
from conductor.core.output_length import OutputEstimate, OutputLengthModel
from conductor.core.state import InstanceState
from conductor.core.types import InstanceId, RequestId


@dataclass(slots=True, init=False)
class _Entry:
    instance: InstanceId
    start_s: float
    started: bool
    prompt_tokens: int
    output: OutputEstimate

    def __init__(
        self,
        instance: InstanceId,
        start_s: float,
        started: bool,
        prompt_tokens: int,
        output: OutputEstimate,
    ) -> None:
        self.instance = instance
        self.start_s = start_s
        self.started = started
        self.prompt_tokens = prompt_tokens
        self.output = output


@dataclass(frozen=True, slots=True)
class WindowLoad:
    """One decode instance over ``[t0, t1]`` with the new request on it: the peak step time
    and the batch and mean context at that peak (every member's prompt + generated + half of
    its predicted rest: the KV a decode step reads grows a token at a time), the largest KV
    at any moment (prompt + predicted output of every member, for the KV room check), and the
    step time at ``t0`` without the new request."""

    instance: InstanceId
    peak_step_s: float
    peak_batch: int
    peak_context_tokens: int
    max_kv_tokens: int
    max_batch: int
    step_at_t0_s: float


class DecodeForecast:
    """Predicted decode membership over time; see the module docstring."""

    __slots__ = ("_entries", "learning_rate", "token_s")

    def __init__(self, token_s: float, learning_rate: float = 0.05) -> None:
        self._entries: dict[RequestId, _Entry] = {}
        self.token_s = token_s
        self.learning_rate = learning_rate

    def __len__(self) -> int:
        return len(self._entries)

    def add(
        self,
        rid: RequestId,
        instance: InstanceId,
        start_s: float,
        prompt_tokens: int,
        output: OutputEstimate,
        *,
        started: bool = False,
    ) -> None:
        self._entries[rid] = _Entry(instance, start_s, started, prompt_tokens, output)

    def started(self, rid: RequestId, now_s: float) -> None:
        """The request's prefill ended at ``now_s``: its decode starts now, not as predicted."""
        e = self._entries.get(rid)
        if e is not None:
            e.start_s = now_s
            e.started = True

    def remove(self, rid: RequestId) -> None:
        self._entries.pop(rid, None)

    def finished(self, rid: RequestId, now_s: float, output_tokens: int | None) -> None:
        """``rid`` left decode at ``now_s`` after ``output_tokens``: learn the time per
        token, forget it."""
        e = self._entries.pop(rid, None)
        if e is None or not e.started or output_tokens is None or output_tokens < 2:
            return
        sample = (now_s - e.start_s) / (output_tokens - 1)
        if sample > 0:
            self.token_s += self.learning_rate * (sample - self.token_s)

    def span(
        self, rid: RequestId, e: _Entry, now_s: float, lengths: OutputLengthModel
    ) -> tuple[float, float, float]:
        """``e``'s predicted decode end as seen at ``now_s``, its mean context over the rest
        of its decode (the KV grows a token per step: prompt + generated + half of what is
        left) and its context at that end."""
        tok = self.token_s
        if e.start_s >= now_s:
            out = e.output.mean
            return e.start_s + out * tok, e.prompt_tokens + out / 2, e.prompt_tokens + out
        generated = (now_s - e.start_s) / tok
        left = lengths.remaining(rid, generated, e.output.cap)
        now_ctx = e.prompt_tokens + generated
        return now_s + left * tok, now_ctx + left / 2, now_ctx + left

    def end_s(self, rid: RequestId, e: _Entry, now_s: float, lengths: OutputLengthModel) -> float:
        """``e``'s predicted decode end as seen at ``now_s``."""
        return self.span(rid, e, now_s, lengths)[0]

    def window(
        self,
        now_s: float,
        t0: float,
        t1: float,
        pool: Sequence[InstanceState],
        own_context_tokens: float,
        cost: CostModel,
        lengths: OutputLengthModel,
    ) -> list[WindowLoad]:
        """Per instance of ``pool`` (in order), its predicted load over ``[t0, t1]`` with a
        request of mean context ``own_context_tokens`` added for the whole window."""
        per: dict[InstanceId, list[tuple[float, float, float, float]]] = {
            i.spec.instance_id: [] for i in pool
        }
        for rid, e in self._entries.items():
            spans = per.get(e.instance)
            if spans is None:
                continue
            end, ctx, kv = self.span(rid, e, now_s, lengths)
            if end > t0 and e.start_s <= t1:
                spans.append((e.start_s, end, ctx, kv))
        step = cost.decode_step_s
        out: list[WindowLoad] = []
        for inst in pool:
            iid = inst.spec.instance_id
            b = 0
            c = k = 0.0
            moves: list[tuple[float, int, float, float]] = []
            for start, end, ctx, kv in per[iid]:
                if start <= t0:
                    b += 1
                    c += ctx
                    k += kv
                else:
                    moves.append((start, 1, ctx, kv))
                if end <= t1:
                    moves.append((end, -1, ctx, kv))
            at_t0 = step(b, int(c)) if b else 0.0
            peak = step(b + 1, int(c + own_context_tokens))
            peak_b, peak_c, max_k, max_b = b, c, k, b
            moves.sort()  # at equal times ends (-1) come before starts (+1)
            for _, sign, ctx, kv in moves:
                b += sign
                c += sign * ctx
                k += sign * kv
                if sign > 0:
                    s = step(b + 1, int(c + own_context_tokens))
                    if s > peak:
                        peak, peak_b, peak_c = s, b, c
                    max_k = max(max_k, k)
                    max_b = max(max_b, b)
            out.append(WindowLoad(iid, peak, peak_b + 1, int(peak_c), int(max_k), max_b, at_t0))
        return out
