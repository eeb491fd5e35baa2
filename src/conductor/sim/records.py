"""Per-request outcome records and the summary metrics computed from them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from conductor.core.tbt import tail_count


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request (times in seconds of simulated time)."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefill: str | None = None
    decode: str | None = None
    rejected: str | None = None
    rejected_after_prefill: bool = False
    predicted_ttft_s: float | None = None
    local_tokens: int = 0
    fetched_tokens: int = 0
    handoff_held_tokens: int = 0
    """Prompt tokens its decode engine already held (``SimConfig.decode_cache``): the
    hand-off did not carry them."""
    prefill_start_s: float | None = None
    prefill_end_s: float | None = None
    first_token_lag_s: float = 0.0
    """How long after the engine's first token the client sees it (``report_latency_s``)."""
    prefill_compute_s: float = 0.0
    decode_join_s: float | None = None
    decode_emits_first: bool = False
    """The decode engine makes the client's first token (``SimConfig.first_token ==
    "decode"`` and a separate decode engine)."""
    first_token_s: float | None = None
    """When the decode engine made the first token (``decode_emits_first``); None: the
    prefill's end is the first token."""
    finish_s: float | None = None
    tbt_s: float | None = None
    cpp_nodes: int = 1
    preemptions: int = 0

    @property
    def cached_tokens(self) -> int:
        return self.local_tokens + self.fetched_tokens

    @property
    def ttft_s(self) -> float | None:
        if self.prefill_end_s is None or self.rejected is not None:
            return None
        first = self.first_token_s if self.decode_emits_first else self.prefill_end_s
        if first is None:
            return None
        return first + self.first_token_lag_s - self.arrival_s

    @property
    def completed(self) -> bool:
        return self.finish_s is not None and self.rejected is None


PROMPT_BUCKETS = (
    ("<=32k", 0, 32_768),
    ("32k-64k", 32_768, 65_536),
    (">64k", 65_536, 1 << 62),
)


def tail_mean_tbt(intervals: np.ndarray) -> float:
    """FAST §5.1: the mean of the longest 10% of a request's token intervals
    (:func:`conductor.core.tbt.tail_mean`, on a numpy array)."""
    n = intervals.shape[0]
    if n == 0:
        return 0.0
    k = tail_count(n)
    if k >= n:
        return float(intervals.mean())
    part = np.partition(intervals, n - k)[n - k :]
    return float(part.mean())


def _pct(values: Sequence[float], scale: float = 1.0) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    a = np.asarray(values, dtype=float) * scale
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {
        "mean": round(float(a.mean()), 6),
        "p50": round(float(p50), 6),
        "p90": round(float(p90), 6),
        "p99": round(float(p99), 6),
    }


def summarize(
    records: Sequence[RequestRecord],
    *,
    ttft_slo_s: float,
    tbt_slo_s: float,
    duration_s: float,
) -> dict[str, object]:
    """The metrics of one run. Rejected requests count as failures in ``slo_attainment``
    and ``goodput_rps``; ``goodput_rps`` = good requests / trace duration;
    ``goodput_tokens_per_s`` = prompt + output tokens of the good requests / trace duration;
    ``rejected_by_prompt``: rejections per prompt-length band; ``prefill_compute_s``: the
    instance-seconds of prefill compute spent (every CPP node's share included)."""
    completed = [r for r in records if r.completed]
    ttfts = [r.ttft_s for r in completed if r.ttft_s is not None]
    tbts = [r.tbt_s for r in completed if r.tbt_s is not None]
    good_records = [
        r
        for r in completed
        if r.ttft_s is not None
        and r.ttft_s <= ttft_slo_s
        and (r.tbt_s is None or r.tbt_s <= tbt_slo_s)
    ]
    good = len(good_records)
    good_tokens = sum(r.prompt_tokens + r.output_tokens for r in good_records)
    prefilled = [r for r in records if r.prefill_end_s is not None]
    prompt = sum(r.prompt_tokens for r in prefilled)
    cached = sum(r.cached_tokens for r in prefilled)
    n = len(records)
    return {
        "requests": n,
        "completed": len(completed),
        "rejected": sum(1 for r in records if r.rejected is not None),
        "rejected_after_prefill": sum(1 for r in records if r.rejected_after_prefill),
        "wasted_prefill_s": round(
            sum(r.prefill_compute_s for r in records if r.rejected_after_prefill), 6
        ),
        "ttft_s": _pct(ttfts),
        "tbt_ms": _pct(tbts, 1e3),
        "slo_attainment": round(good / n, 6) if n else 0.0,
        "goodput_rps": round(good / duration_s, 6) if duration_s > 0 else 0.0,
        "goodput_tokens_per_s": round(good_tokens / duration_s, 3) if duration_s > 0 else 0.0,
        "cache_hit_rate": round(cached / prompt, 6) if prompt else 0.0,
        "fetched_tokens": sum(r.fetched_tokens for r in prefilled),
        "handoff_held_tokens": sum(r.handoff_held_tokens for r in prefilled),
        "cpp_requests": sum(1 for r in prefilled if r.cpp_nodes > 1),
        "preemptions": sum(r.preemptions for r in records),
        "ttft_by_prompt_s": {
            name: _pct(
                [r.ttft_s for r in completed if r.ttft_s is not None and lo < r.prompt_tokens <= hi]
            )
            for name, lo, hi in PROMPT_BUCKETS
        },
        "rejected_by_prompt": {
            name: sum(1 for r in records if r.rejected is not None and lo < r.prompt_tokens <= hi)
            for name, lo, hi in PROMPT_BUCKETS
        },
        "prefill_compute_s": round(sum(r.prefill_compute_s for r in records), 6),
    }
