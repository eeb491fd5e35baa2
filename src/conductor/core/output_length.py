"""Output-length prediction from completed requests (no oracle).

A scheduler sees a request's prompt and, at most, its ``max_tokens``; how many tokens it will
generate is unknown until it finishes. :class:`LengthHistogram` learns the distribution of
output lengths online from ``RequestFinished.output_tokens``:

* **buckets**: log-spaced, four per power of two (bucket ``k`` holds the lengths with
  ``floor(4 * log2(L)) == k``), each with a weight and the sum of the
  lengths it received (so a bucket's mean is exact, not its midpoint);
* **bounded memory, adapting**: when the total weight passes ``max_weight`` every bucket is
  halved, so old observations fade geometrically (deterministic: no sampling);
* **kept tables**: each observation adds itself to the suffix sums (weight and tokens of
  buckets ``k..``) of the buckets at and below its own, so a query reads them (a quantile by
  bisection) and no decision after a finished request rebuilds a table;
* **prior**: before any observation the distribution is ``prior_weight`` pseudo-requests of
  ``prior_tokens`` tokens; they fade like everything else.

Queries, each capped by the request's cap ``c = min(max_tokens, context - prompt)``:

* ``E[min(L, c)]`` (:meth:`LengthHistogram.estimate` ``.mean``): what the request is expected
  to generate — the decode policy's context, the KV reservation and the TBT prediction;
* ``q``-quantile of ``min(L, c)`` (``.high``): the KV headroom a new request must find;
* ``E[min(L, c) - g | L > g]`` (:meth:`LengthHistogram.remaining`): what a request that has
  already produced ``g`` tokens still has to go — predictive admission keeps a decoding
  request in its forecast for this long, however long it has run.

:class:`OracleLengths` is the ablation that knows every request's true length.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from conductor.core.types import Request, RequestId

if TYPE_CHECKING:
    from conductor.core.config import SchedulerConfig

BUCKETS_PER_DOUBLING = 4
MAX_LOG2_TOKENS = 21
TOP_TOKENS = 2**MAX_LOG2_TOKENS
"""Lengths up to 2**21 tokens get their own buckets; longer ones share the last."""


@dataclass(slots=True, init=False, unsafe_hash=True)
class OutputEstimate:
    """Predicted output of one request, in tokens: ``mean = E[min(L, cap)]``, ``high`` the
    configured quantile of ``min(L, cap)``; ``cap`` the most it may generate."""

    mean: Final[float]
    high: Final[float]
    cap: Final[int]

    def __init__(self, mean: float, high: float, cap: int) -> None:
        self.mean = mean
        self.high = high
        self.cap = cap


UNKNOWN_OUTPUT = OutputEstimate(1.0, 1.0, 1)
"""A placeholder estimate (one token) for contexts built without a predictor."""


class OutputLengthModel(Protocol):
    """What the scheduler asks about output lengths (one model per served model)."""

    def estimate(self, request: Request, cap: int) -> OutputEstimate: ...

    def remaining(self, rid: RequestId, generated: float, cap: int) -> float: ...

    def observe(self, rid: RequestId, tokens: int) -> None: ...


class LengthHistogram:
    """The streaming log-bucket distribution of observed output lengths."""

    __slots__ = (
        "_counts",
        "_quantiles",
        "_suffix_s",
        "_suffix_w",
        "_sums",
        "high_quantile",
        "max_weight",
        "prior_tokens",
    )  # fmt: skip

    def __init__(
        self,
        *,
        prior_tokens: int = 256,
        prior_weight: float = 4.0,
        max_weight: float = 2048.0,
        high_quantile: float = 0.9,
    ) -> None:
        self.prior_tokens = prior_tokens
        self.max_weight = max_weight
        self.high_quantile = high_quantile
        n = MAX_LOG2_TOKENS * BUCKETS_PER_DOUBLING + 1
        self._counts = [0.0] * n
        self._sums = [0.0] * n
        # suffix_w[k] / suffix_s[k]: weight / token sum of buckets k.. (k = n: none), kept
        # up to date by each observation (O(bucket)) so that no query rebuilds them
        self._suffix_w = [0.0] * (n + 1)
        self._suffix_s = [0.0] * (n + 1)
        self._quantiles: dict[float, float] = {}  # q -> uncapped quantile, until a change
        self._add(prior_tokens, prior_weight)

    def _bucket(self, tokens: float) -> int:
        if tokens < 2.0:
            return 0
        if tokens >= TOP_TOKENS:
            return len(self._counts) - 1
        return int(math.log2(tokens) * BUCKETS_PER_DOUBLING)

    def _add(self, tokens: int, weight: float) -> None:
        k = self._bucket(tokens)
        tw = weight * tokens
        self._counts[k] += weight
        self._sums[k] += tw
        suffix_w = self._suffix_w
        suffix_s = self._suffix_s
        for j in range(k + 1):
            suffix_w[j] += weight
            suffix_s[j] += tw
        self._quantiles.clear()

    def observe(self, rid: RequestId, tokens: int) -> None:
        """A request finished after generating ``tokens`` (>= 1)."""
        self._add(max(1, tokens), 1.0)
        if self._suffix_w[0] > self.max_weight:
            self._counts = [c * 0.5 for c in self._counts]
            self._sums = [s * 0.5 for s in self._sums]
            self._suffix_w = [w * 0.5 for w in self._suffix_w]
            self._suffix_s = [s * 0.5 for s in self._suffix_s]

    @property
    def weight(self) -> float:
        return self._suffix_w[0]

    def _overall_mean(self) -> float:
        w = self._suffix_w[0]
        return self._suffix_s[0] / w if w > 0 else float(self.prior_tokens)

    def mean(self, cap: float = math.inf) -> float:
        """``E[min(L, cap)]``."""
        k = self._bucket(cap)
        w_hi = self._suffix_w[k]
        if w_hi == 0.0:
            return self._overall_mean()
        s_hi = self._suffix_s[k]
        # buckets below cap's contribute their lengths, cap's bucket and above contribute cap
        return ((self._suffix_s[0] - s_hi) + cap * w_hi) / self._suffix_w[0]

    def quantile(self, q: float, cap: float = math.inf) -> float:
        """The ``q``-quantile of ``min(L, cap)`` (the mean of the bucket it falls in;
        memoised per ``q`` until the next observation)."""
        v = self._quantiles.get(q)
        if v is None:
            v = self._quantiles[q] = self._quantile(q)
        return min(v, cap)

    def _quantile(self, q: float) -> float:
        """The first bucket whose cumulative weight reaches ``q`` of the total: the first
        ``k`` with ``suffix_w[k + 1] <= total - target`` (suffix weights fall with ``k``),
        found by bisection."""
        suffix_w = self._suffix_w
        total = suffix_w[0]
        target = q * total
        if target <= 0.0:  # the first bucket with any weight
            for k, c in enumerate(self._counts):
                if c > 0:
                    return self._sums[k] / c
            return self._overall_mean()
        rest = total - target
        lo, hi = 0, len(self._counts)  # the answer k lies in [lo, hi)
        while lo < hi:
            mid = (lo + hi) // 2
            if suffix_w[mid + 1] <= rest:
                hi = mid
            else:
                lo = mid + 1
        if lo < len(self._counts) and self._counts[lo] > 0:
            return self._sums[lo] / self._counts[lo]
        return self._overall_mean()

    def remaining(self, rid: RequestId, generated: float, cap: int) -> float:
        """``E[min(L, cap) - g | L > g]`` for ``g = generated`` (at least one token); past
        every observed length, half what it generated so far."""
        left = cap - generated
        if left <= 1.0:
            return 1.0
        k = self._bucket(generated) + 1
        w = self._suffix_w[k]
        s = self._suffix_s[k]
        c = self._counts[k - 1]
        if c > 0 and self._sums[k - 1] / c > generated:  # generated's own bucket, if above
            w += c
            s += self._sums[k - 1]
        rest = (s / w - generated) if w > 0 else 0.5 * generated
        return min(max(rest, 1.0), left)

    def estimate(self, request: Request, cap: int) -> OutputEstimate:
        q = self.high_quantile
        return OutputEstimate(max(1.0, self.mean(cap)), max(1.0, self.quantile(q, cap)), cap)


class OracleLengths:
    """The ablation: every request's true output length is known in advance
    (``conductor simulate --oracle-lengths``). Unknown requests fall back to ``fallback``."""

    __slots__ = ("fallback", "lengths")

    def __init__(self, lengths: Mapping[RequestId, int], fallback: LengthHistogram) -> None:
        self.lengths = lengths
        self.fallback = fallback

    def estimate(self, request: Request, cap: int) -> OutputEstimate:
        true = self.lengths.get(request.request_id)
        if true is None:
            return self.fallback.estimate(request, cap)
        n = float(max(1, min(true, cap)))
        return OutputEstimate(n, n, cap)

    def remaining(self, rid: RequestId, generated: float, cap: int) -> float:
        true = self.lengths.get(rid)
        if true is None:
            return self.fallback.remaining(rid, generated, cap)
        return max(1.0, min(true, cap) - generated)

    def observe(self, rid: RequestId, tokens: int) -> None:
        self.fallback.observe(rid, tokens)


def output_cap(request: Request, context_tokens: int) -> int:
    """The most ``request`` may generate: its ``max_tokens``, at most the context left
    after its prompt (at least one token)."""
    room = context_tokens - request.prompt_tokens
    cap = room if request.max_tokens is None else min(request.max_tokens, room)
    return cap if cap > 1 else 1


def length_model(config: SchedulerConfig) -> LengthHistogram:
    """The output-length predictor ``config`` describes (its prior, window and quantile)."""
    return LengthHistogram(
        prior_tokens=config.output_prior_tokens,
        prior_weight=config.output_prior_weight,
        max_weight=config.output_window,
        high_quantile=config.output_high_quantile,
    )
