"""Decision benchmark: how long :meth:`Scheduler.schedule` takes, and how fast the prefix
index ingests KV events, on the bundled Mooncake conversation trace.

1. **Warm**: every trace row's ``hash_ids`` is stored on 1-2 prefill instances chosen by a
   seeded RNG, each copy as one :class:`BlocksStored` event in the GPU or DRAM tier, fed
   through :meth:`Scheduler.on_event`. The ingest rate is block hashes (one *block event*
   each) per second of ``on_event`` time.
2. **Decide**: the first ``warmup + requests`` rows (cycling through the trace if more are
   asked for) are scheduled in arrival order; only ``schedule()`` is timed, one
   ``perf_counter_ns`` pair per call, and the first ``warmup`` calls (cold memos and
   interpreter caches) are left out of the figures. Every ``finish_every`` decisions the
   oldest in-flight requests get their :class:`PrefillFinished` and
   :class:`RequestFinished` events (untimed) until at most ``inflight_per_decode``
   requests per decode instance remain, so queues stay bounded. The garbage collector stays
   on; what exists before the timed loop (trace, index) is moved out of its way with
   ``gc.freeze()``, as a long-running service would do.

This is a shell around the core (it reads files and the clock); figures are printed by the
CLI (``conductor bench decision``) and by ``bench/decision.py``, never asserted in tests.
"""

from __future__ import annotations

import gc
import math
import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import conductor
from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import DEFAULT_PRESET, preset
from conductor.core.events import BlocksStored, PrefillFinished, RequestFinished
from conductor.core.plan import Plan
from conductor.core.policies import DEFAULT_POLICY
from conductor.core.scheduler import Scheduler
from conductor.core.state import CACHE_CAPACITY_TOKENS, InstanceSpec
from conductor.core.types import BlockHash, InstanceId, Request, RequestId, Role, Tier
from conductor.workload.trace import bundled_trace_path, read_trace
from conductor.workload.trace_format import DEFAULT_BLOCK_SIZE_TOKENS, TraceRecord

DEFAULT_REQUESTS = 5000
"""Timed ``schedule()`` calls per run."""
DEFAULT_WARMUP = 100
"""Untimed calls before them."""

BUCKETS: tuple[tuple[str, int], ...] = (
    ("<=8", 8),
    ("<=32", 32),
    ("<=64", 64),
    (">64", 1 << 62),
)
"""Prompt-length buckets (upper bound in blocks, inclusive) for the per-length figures."""


def load_trace(path: Path | None = None) -> list[TraceRecord]:
    """The records of a (gzipped) Mooncake JSONL trace (:func:`read_trace`); the bundled
    one by default."""
    return read_trace(path or bundled_trace_path()).records


def _hashes(record: TraceRecord) -> tuple[BlockHash, ...]:
    # BlockHash is a NewType of int: the ids are already the right values.
    return cast(tuple[BlockHash, ...], record.hash_ids)


@dataclass(frozen=True, slots=True)
class BucketStats:
    bucket: str
    count: int
    p50_us: float
    p99_us: float
    mean_us: float


@dataclass(frozen=True, slots=True)
class DecisionBenchResult:
    """Figures of one run; :meth:`to_json` gives the documented JSON object."""

    prefill: int
    decode: int
    policy: str
    requests: int
    warmup_requests: int
    p50_us: float
    p99_us: float
    mean_us: float
    max_us: float
    ingest_block_events_per_s: float
    ingest_events: int
    ingest_block_events: int
    ingest_s: float
    plans: int
    rejections: int
    fetches: int
    preset: str
    seed: int
    by_blocks: tuple[BucketStats, ...] = field(default=())
    repeats: int = 1
    p99_us_runs: tuple[float, ...] = field(default=())
    handoff: str = "stream"
    """The hand-off the scheduler predicted (``SchedulerConfig.handoff``)."""
    build: str = field(default_factory=lambda: conductor.NATIVE_MODE)
    """Which build ran: ``conductor.NATIVE_MODE`` (``compiled``: the ``conductor compile``
    build; otherwise the sources)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "prefill": self.prefill,
            "decode": self.decode,
            "policy": self.policy,
            "requests": self.requests,
            "warmup_requests": self.warmup_requests,
            "p50_us": self.p50_us,
            "p99_us": self.p99_us,
            "mean_us": self.mean_us,
            "max_us": self.max_us,
            "ingest_block_events_per_s": self.ingest_block_events_per_s,
            "ingest_events": self.ingest_events,
            "ingest_block_events": self.ingest_block_events,
            "ingest_s": self.ingest_s,
            "plans": self.plans,
            "rejections": self.rejections,
            "fetches": self.fetches,
            "preset": self.preset,
            "seed": self.seed,
            "repeats": self.repeats,
            "handoff": self.handoff,
            "build": self.build,
            "p99_us_runs": list(self.p99_us_runs or (self.p99_us,)),
            "by_blocks": [
                {
                    "bucket": b.bucket,
                    "count": b.count,
                    "p50_us": b.p50_us,
                    "p99_us": b.p99_us,
                    "mean_us": b.mean_us,
                }
                for b in self.by_blocks
            ],
        }


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 100]) of an ascending sequence; 0 if empty."""
    n = len(sorted_values)
    if n == 0:
        return 0.0
    rank = math.ceil(q / 100.0 * n)
    return float(sorted_values[min(n - 1, max(0, rank - 1))])


def bucket_of(n_blocks: int) -> str:
    for name, most in BUCKETS:
        if n_blocks <= most:
            return name
    raise AssertionError("unreachable: the last bucket is unbounded")


def make_cluster(
    n_prefill: int,
    n_decode: int,
    *,
    policy: str,
    preset_name: str,
    seed: int,
    handoff: str = "stream",
) -> Scheduler:
    config = SchedulerConfig(
        block_size_tokens=DEFAULT_BLOCK_SIZE_TOKENS, seed=seed, handoff=handoff
    )
    c = Scheduler(preset(preset_name), policy=policy, config=config)
    for i in range(n_prefill):  # caches of the simulator's size: eviction pricing runs
        spec = InstanceSpec(
            InstanceId(f"p{i}"), Role.PREFILL, cache_capacity_tokens=CACHE_CAPACITY_TOKENS
        )
        c.add_instance(spec)
    for i in range(n_decode):
        c.add_instance(InstanceSpec(InstanceId(f"d{i}"), Role.DECODE))
    return c


def warm_events(rows: Sequence[TraceRecord], n_prefill: int, seed: int) -> list[BlocksStored]:
    """One :class:`BlocksStored` per copy: each row's blocks on 1-2 distinct prefill
    instances (seeded), each copy in the GPU or the DRAM tier."""
    rng = random.Random(seed)
    names = [InstanceId(f"p{i}") for i in range(n_prefill)]
    events: list[BlocksStored] = []
    for row in rows:
        if not row.hash_ids:
            continue
        copies = 1 if n_prefill == 1 else rng.randint(1, 2)
        for holder in rng.sample(names, copies):
            tier = Tier.GPU if rng.random() < 0.5 else Tier.DRAM
            events.append(BlocksStored(holder, _hashes(row), tier))
    return events


def trace_requests(rows: Sequence[TraceRecord], count: int) -> list[Request]:
    """The first ``count`` rows as requests; past the end the trace repeats, shifted in time
    by its span, with fresh request ids."""
    if not rows:
        raise ValueError("empty trace")
    span_s = rows[-1].timestamp_ms / 1e3 + 1.0
    out: list[Request] = []
    for i in range(count):
        lap, j = divmod(i, len(rows))
        row = rows[j]
        out.append(
            Request(
                RequestId(f"r{i}"),
                max(1, row.input_length),
                _hashes(row),
                arrival_s=lap * span_s + row.timestamp_ms / 1e3,
            )
        )
    return out


def ingest(conductor: Scheduler, events: Sequence[BlocksStored]) -> float:
    """Feed ``events`` through ``on_event``; returns the seconds it took."""
    on_event = conductor.on_event
    t0 = time.perf_counter_ns()
    for e in events:
        on_event(e)
    return (time.perf_counter_ns() - t0) / 1e9


def run_decision_bench(
    n_prefill: int,
    n_decode: int,
    *,
    policy: str = DEFAULT_POLICY,
    requests: int = DEFAULT_REQUESTS,
    warmup: int = DEFAULT_WARMUP,
    seed: int = 0,
    preset_name: str = DEFAULT_PRESET,
    handoff: str = "stream",
    finish_every: int = 8,
    inflight_per_decode: int = 4,
    rows: Sequence[TraceRecord] | None = None,
) -> DecisionBenchResult:
    """Warm a cluster of ``n_prefill`` + ``n_decode`` instances from the trace, then time
    ``schedule()`` on ``requests`` trace requests; see the module docstring."""
    if n_prefill < 1 or n_decode < 1:
        raise ValueError("need at least one prefill and one decode instance")
    if requests < 1 or warmup < 0:
        raise ValueError("requests must be >= 1 and warmup >= 0")
    trace = rows if rows is not None else load_trace()
    conductor = make_cluster(
        n_prefill, n_decode, policy=policy, preset_name=preset_name, seed=seed, handoff=handoff
    )
    events = warm_events(trace, n_prefill, seed)
    block_events = sum(len(e.block_hashes) for e in events)
    all_reqs = trace_requests(trace, warmup + requests)
    reqs = all_reqs[warmup:]

    # Long-lived objects (trace, index) go to the permanent generation so that the collector
    # does not walk them during the timed loop; it still runs for what schedule() allocates.
    gc.collect()
    gc.freeze()
    try:
        ingest_s = ingest(conductor, events)
        samples_ns, plans, fetches = _time_schedule(
            conductor,
            all_reqs,
            [trace[i % len(trace)].output_length for i in range(len(all_reqs))],
            warmup,
            finish_every,
            max(1, inflight_per_decode * n_decode),
        )
    finally:
        gc.unfreeze()

    us = [ns / 1e3 for ns in samples_ns]
    by_bucket: dict[str, list[float]] = {name: [] for name, _ in BUCKETS}
    for r, t in zip(reqs, us, strict=True):
        by_bucket[bucket_of(len(r.block_hashes))].append(t)
    buckets = []
    for name, _ in BUCKETS:
        vals = sorted(by_bucket[name])
        if vals:
            buckets.append(
                BucketStats(
                    name,
                    len(vals),
                    percentile(vals, 50),
                    percentile(vals, 99),
                    sum(vals) / len(vals),
                )
            )
    srt = sorted(us)
    return DecisionBenchResult(
        prefill=n_prefill,
        decode=n_decode,
        policy=policy,
        requests=len(reqs),
        warmup_requests=warmup,
        p50_us=percentile(srt, 50),
        p99_us=percentile(srt, 99),
        mean_us=sum(srt) / len(srt),
        max_us=srt[-1],
        ingest_block_events_per_s=block_events / ingest_s if ingest_s > 0 else math.inf,
        ingest_events=len(events),
        ingest_block_events=block_events,
        ingest_s=ingest_s,
        plans=plans,
        rejections=len(reqs) - plans,
        fetches=fetches,
        preset=preset_name,
        seed=seed,
        by_blocks=tuple(buckets),
        handoff=handoff,
    )


def run_repeated(
    n_prefill: int, n_decode: int, *, repeat: int = 1, **kwargs: Any
) -> DecisionBenchResult:
    """:func:`run_decision_bench` ``repeat`` times on fresh clusters; returns the run with
    the median p99 (decisions are deterministic, so only timings differ between runs), with
    every run's p99 in ``p99_us_runs``. On a shared machine this damps one-off stalls."""
    if repeat < 1:
        raise ValueError("repeat must be >= 1")
    if "rows" not in kwargs:
        kwargs["rows"] = load_trace()
    runs = [run_decision_bench(n_prefill, n_decode, **kwargs) for _ in range(repeat)]
    chosen = sorted(runs, key=lambda r: r.p99_us)[(repeat - 1) // 2]
    return replace(chosen, repeats=repeat, p99_us_runs=tuple(r.p99_us for r in runs))


def _time_schedule(
    conductor: Scheduler,
    reqs: Sequence[Request],
    outputs: Sequence[int],
    warmup: int,
    finish_every: int,
    max_inflight: int,
) -> tuple[list[int], int, int]:
    """Schedule ``reqs`` in order, timing each ``schedule()``; request ``i`` finishes
    (untimed) after ``outputs[i]`` tokens. Returns, for the calls after the first
    ``warmup``: ns per call, plans, plans with a remote fetch."""
    schedule = conductor.schedule
    on_event = conductor.on_event
    clock = time.perf_counter_ns
    samples: list[int] = []
    inflight: deque[tuple[Plan, int]] = deque()
    plans = fetches = 0
    for i, req in enumerate(reqs):
        now = req.arrival_s
        t0 = clock()
        decision = schedule(req, now)
        t1 = clock()
        if isinstance(decision, Plan):
            inflight.append((decision, outputs[i]))
        if i >= warmup:
            samples.append(t1 - t0)
            if isinstance(decision, Plan):
                plans += 1
                fetches += decision.fetch is not None
        if (i + 1) % finish_every == 0:
            while len(inflight) > max_inflight:
                p, out = inflight.popleft()
                on_event(PrefillFinished(p.request_id, p.prefill, now))
                on_event(RequestFinished(p.request_id, p.decode, now, out))
    return samples, plans, fetches


def format_result(r: DecisionBenchResult) -> str:
    """A small plain-text table of one run."""
    runs = ""
    if r.repeats > 1:
        p99s = ", ".join(f"{p:.0f}" for p in r.p99_us_runs)
        runs = f"\nrun with the median p99 of {r.repeats} (p99 us: {p99s})"
    lines = [
        f"decision benchmark: {r.prefill} prefill + {r.decode} decode, policy {r.policy}, "
        f"preset {r.preset}, seed {r.seed}, build {r.build}{runs}",
        f"ingest: {r.ingest_events} events, {r.ingest_block_events} block events in "
        f"{r.ingest_s * 1e3:.1f} ms = {r.ingest_block_events_per_s:,.0f} block events/s",
        f"schedule(): {r.requests} requests after {r.warmup_requests} untimed ({r.plans} plans, "
        f"{r.rejections} rejections, {r.fetches} with a remote fetch)",
        "",
        f"{'blocks':>8} {'count':>7} {'p50 us':>9} {'p99 us':>9} {'mean us':>9}",
    ]
    for b in r.by_blocks:
        lines.append(
            f"{b.bucket:>8} {b.count:>7} {b.p50_us:>9.1f} {b.p99_us:>9.1f} {b.mean_us:>9.1f}"
        )
    lines.append(
        f"{'all':>8} {r.requests:>7} {r.p50_us:>9.1f} {r.p99_us:>9.1f} {r.mean_us:>9.1f}"
        f"   (max {r.max_us:.1f} us)"
    )
    return "\n".join(lines)
