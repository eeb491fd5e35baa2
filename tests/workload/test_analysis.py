"""Trace statistics and prefix-cache hit rates: hand-checked cases and the bundled trace."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conductor.core.errors import InvalidInput
from conductor.workload.analysis import (
    HitRate,
    TraceStats,
    infinite_cache_hits,
    lru_cache_hits,
    trace_stats,
)
from conductor.workload.trace_format import TraceRecord

# Block size 512. Request lengths make the last block partial where noted.
SMALL = [
    TraceRecord(0, 1000, 10, (0, 1)),  # cold: 0 hit
    TraceRecord(1000, 1300, 20, (0, 1, 2)),  # blocks 0, 1 seen: 1024 hit
    TraceRecord(3000, 700, 30, (0, 3)),  # block 0 seen: 512 hit
    TraceRecord(3000, 900, 40, (0, 3)),  # both seen, last block partial: min(1024, 900) = 900
    TraceRecord(4000, 600, 50, (4, 1)),  # first block new: 0 hit although block 1 is cached
]


def test_infinite_cache_counts_leading_runs_with_the_real_last_block_length() -> None:
    assert infinite_cache_hits(SMALL) == HitRate(hit_tokens=2436, total_tokens=4500)
    assert infinite_cache_hits(SMALL).rate == 2436 / 4500
    assert infinite_cache_hits([]) == HitRate(0, 0)
    assert infinite_cache_hits([]).rate == 0.0


def test_lru_evicts_least_recently_touched_blocks() -> None:
    # Capacity 2 blocks. After r0: [0, 1]; r1 hits 0, 1 (1024), then 2 evicts 0 -> [1, 2];
    # r2 misses block 0 (0 hit) -> [0, 3]; r3 hits both (900) -> [0, 3]; r4 misses -> [4, 1].
    assert lru_cache_hits(SMALL, capacity_tokens=1024) == HitRate(1924, 4500)
    # 1023 tokens round down to 1 block: only each request's last block survives it, and no
    # request starts with the previous one's last block, so nothing hits.
    assert lru_cache_hits(SMALL, capacity_tokens=1023) == HitRate(0, 4500)
    assert lru_cache_hits(SMALL, capacity_tokens=0) == HitRate(0, 4500)
    # A big pool behaves like the infinite cache.
    assert lru_cache_hits(SMALL, capacity_tokens=10**9) == infinite_cache_hits(SMALL)


def test_block_size_is_a_parameter() -> None:
    records = [TraceRecord(0, 300, 1, (0, 1, 2)), TraceRecord(1, 250, 1, (0, 1, 3))]
    assert infinite_cache_hits(records, block_size_tokens=100) == HitRate(200, 550)
    assert lru_cache_hits(records, capacity_tokens=200, block_size_tokens=100) == HitRate(0, 550)
    with pytest.raises(InvalidInput, match="block_size_tokens"):
        infinite_cache_hits(records, block_size_tokens=0)
    with pytest.raises(InvalidInput, match="capacity_tokens"):
        lru_cache_hits(records, capacity_tokens=-1)


def test_trace_stats_small() -> None:
    assert trace_stats(SMALL) == TraceStats(
        requests=5,
        first_timestamp_ms=0,
        last_timestamp_ms=4000,
        mean_rate_rps=1.25,
        input_mean_tokens=900.0,
        input_median_tokens=900.0,
        input_max_tokens=1300,
        output_mean_tokens=30.0,
        unique_blocks=5,
    )
    assert trace_stats(SMALL).span_s == 4.0
    assert trace_stats(SMALL[:1]).mean_rate_rps is None
    with pytest.raises(InvalidInput, match="records"):
        trace_stats([])


def test_bundled_trace_statistics(bundled_records: list[TraceRecord]) -> None:
    stats = trace_stats(bundled_records)
    assert (stats.requests, stats.first_timestamp_ms, stats.last_timestamp_ms) == (
        12_031,
        0,
        3_536_999,
    )
    assert stats.mean_rate_rps == pytest.approx(3.4015, abs=1e-4)
    assert stats.input_mean_tokens == pytest.approx(12_035.06, abs=0.01)
    assert (stats.input_median_tokens, stats.input_max_tokens) == (6909, 126_195)
    assert stats.output_mean_tokens == pytest.approx(342.62, abs=0.01)
    assert stats.unique_blocks == 182_790


def test_bundled_trace_infinite_cache_hit_rate(bundled_records: list[TraceRecord]) -> None:
    assert infinite_cache_hits(bundled_records).rate == pytest.approx(0.374, abs=0.001)


def test_bundled_trace_global_lru_hit_rates(bundled_records: list[TraceRecord]) -> None:
    assert lru_cache_hits(bundled_records, capacity_tokens=3_000_000).rate == pytest.approx(
        0.138, abs=0.003
    )
    # 50M tokens nearly reaches the infinite-cache rate (37.1% vs 37.4%).
    assert lru_cache_hits(bundled_records, capacity_tokens=50_000_000).rate == pytest.approx(
        0.371, abs=0.001
    )


def test_models_never_share_blocks() -> None:
    """The same ids under two models are two models' blocks: no hit across, counted apart."""
    records = [
        TraceRecord(0, 1024, 1, (0, 1), model="a"),
        TraceRecord(1, 1024, 1, (0, 1), model="b"),
        TraceRecord(2, 1024, 1, (0, 1), model="a"),
        TraceRecord(3, 1024, 1, (0, 1)),
    ]
    assert infinite_cache_hits(records) == HitRate(1024, 4096)
    assert lru_cache_hits(records, capacity_tokens=1024) == HitRate(1024, 4096)
    assert trace_stats(records).unique_blocks == 6
    same = [replace(r, model=None) for r in records]
    assert infinite_cache_hits(same) == HitRate(3072, 4096)
    assert trace_stats(same).unique_blocks == 2
