"""Simultaneous arrivals in a trace, given an order in time (``conductor trace spread``).

Mooncake's conversation trace stamps its requests to about 3 s: runs of up to 28 requests
share one timestamp. The simulator takes such a run in file order, at one instant. A replay
sends them at once too, but they reach the gateway in whatever order the client's
connections, the gateway's body reads and its tokenizer finish them — short prompts tend to
come first — so the engines see a different order than the simulator, and a different
first-come-first-served queue (docs/fidelity.md, "Simultaneous arrivals"). Moving the
``k``-th request of a run ``k x gap`` later, in file order, gives the replay and the
simulator one order to agree on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from conductor.core.errors import InvalidInput
from conductor.workload.trace_format import TraceRecord

DEFAULT_GAP_MS = 10
"""Milliseconds between the requests of a run (``conductor trace spread --gap-ms``, the
fidelity benches' ``--tie-gap-ms``)."""


@dataclass(frozen=True, slots=True)
class Ties:
    """How many requests share a timestamp with an earlier one (``tied``), and the largest
    run of requests with one timestamp (``largest_run``; 1 when all differ, 0 when empty)."""

    tied: int
    largest_run: int


def ties(records: Sequence[TraceRecord]) -> Ties:
    """Simultaneous arrivals in ``records`` (sorted by timestamp, as ``read_trace`` gives
    them)."""
    tied = 0
    run = largest = 0
    previous: int | None = None
    for record in records:
        if record.timestamp_ms == previous:
            tied += 1
            run += 1
        else:
            run = 1
            previous = record.timestamp_ms
        largest = max(largest, run)
    return Ties(tied, largest)


def spread_ties(records: Sequence[TraceRecord], gap_ms: int) -> list[TraceRecord]:
    """``records`` (sorted by timestamp) with each run of equal timestamps spread out: the
    ``k``-th request of a run of ``n`` moves ``k x step`` ms later, ``step = min(gap_ms,
    (next timestamp - this one) // n)`` so that the run stays before the next timestamp and
    the file's order is the order in time (a run with less than 1 ms per request before the
    next one stays tied; the last run uses ``gap_ms``). Everything else is kept."""
    if gap_ms < 1:
        raise InvalidInput("gap_ms", gap_ms, "must be an integer >= 1")
    out: list[TraceRecord] = []
    i, n = 0, len(records)
    while i < n:
        ts = records[i].timestamp_ms
        j = i + 1
        while j < n and records[j].timestamp_ms == ts:
            j += 1
        if j < n and records[j].timestamp_ms < ts:
            raise InvalidInput(
                "timestamp",
                records[j].timestamp_ms,
                f"records must be sorted by timestamp (line {records[j].line_no} comes after {ts})",
            )
        step = gap_ms if j == n else min(gap_ms, (records[j].timestamp_ms - ts) // (j - i))
        for k in range(i, j):
            record = records[k]
            out.append(record if k == i else replace(record, timestamp_ms=ts + (k - i) * step))
        i = j
    return out
