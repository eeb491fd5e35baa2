"""Simultaneous arrivals: counted, and ordered in time in file order."""

from __future__ import annotations

import pytest

from conductor.core.errors import InvalidInput
from conductor.workload.spread import Ties, spread_ties, ties
from conductor.workload.trace import bundled_trace_path, read_trace
from conductor.workload.trace_format import TraceRecord


def rec(ts: int, n: int) -> TraceRecord:
    """A one-block request whose ``input_length`` tells the records apart."""
    return TraceRecord(ts, n, 1, (n,), line_no=n)


def stamps(records: list[TraceRecord]) -> list[tuple[int, int]]:
    return [(r.timestamp_ms, r.input_length) for r in records]


def test_ties_counts_requests_after_the_first_of_a_run_and_the_largest_run() -> None:
    assert ties([]) == Ties(0, 0)
    assert ties([rec(0, 1), rec(5, 2)]) == Ties(0, 1)
    assert ties([rec(0, 1), rec(0, 2), rec(0, 3), rec(9, 4), rec(9, 5)]) == Ties(3, 3)


def test_a_run_is_spread_by_the_gap_in_file_order() -> None:
    records = [rec(0, 1), rec(0, 2), rec(0, 3), rec(100, 4), rec(200, 5), rec(200, 6)]
    assert stamps(spread_ties(records, 10)) == [
        (0, 1), (10, 2), (20, 3), (100, 4), (200, 5), (210, 6)  # the last run: the gap
    ]  # fmt: skip


def test_a_run_is_narrowed_to_fit_before_the_next_timestamp() -> None:
    four = [rec(0, 1), rec(0, 2), rec(0, 3), rec(0, 4), rec(20, 5)]
    assert stamps(spread_ties(four, 10)) == [(0, 1), (5, 2), (10, 3), (15, 4), (20, 5)]
    # under 1 ms per request before the next timestamp: the run stays tied
    three = [rec(0, 1), rec(0, 2), rec(0, 3), rec(2, 4)]
    assert spread_ties(three, 10) == three


def test_everything_but_the_timestamp_is_kept() -> None:
    a = TraceRecord(7, 600, 3, (1, 2), line_no=4, model="m")
    b = TraceRecord(7, 10, 0, (9,), line_no=5)
    first, second = spread_ties([a, b], 3)
    assert first == a
    assert second == TraceRecord(10, 10, 0, (9,), line_no=5)


def test_bad_gap_or_unsorted_records_are_refused() -> None:
    with pytest.raises(InvalidInput, match="gap_ms"):
        spread_ties([rec(0, 1)], 0)
    with pytest.raises(InvalidInput, match=r"sorted by timestamp \(line 2 comes after 5\)"):
        spread_ties([rec(5, 1), rec(3, 2)], 1)


def test_the_bundled_trace_loses_every_tie_and_keeps_its_order() -> None:
    records = read_trace(bundled_trace_path()).records
    assert ties(records) == Ties(10851, 28)
    spread = spread_ties(records, 10)
    assert ties(spread) == Ties(0, 1)
    assert [r.line_no for r in spread] == [r.line_no for r in records]
    times = [r.timestamp_ms for r in spread]
    assert times == sorted(times)
    assert max(s.timestamp_ms - r.timestamp_ms for s, r in zip(spread, records, strict=True)) == 270
