"""The event loop: arrivals -> Scheduler.schedule -> fetch -> prefill -> KV hand-off -> decode.

``simulate`` replays a trace through a cluster built from a :class:`SimConfig`: it pops
typed events in ``(time, seq)`` order (see :mod:`conductor.sim.events`) and hands each to
the prefill side (:mod:`conductor.sim.prefill`) or the decode side
(:mod:`conductor.sim.decode`), sampling load and replica counts along the way.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from conductor.core.errors import InvalidInput
from conductor.core.output_length import OracleLengths, length_model
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceSpec
from conductor.core.types import BlockHash, InstanceId, Request, Role
from conductor.sim.cache import LruBlockCache
from conductor.sim.config import SimConfig
from conductor.sim.cruise import catch_up
from conductor.sim.decode import DecodeSide
from conductor.sim.engine import EngineLoop
from conductor.sim.events import (
    Arrival,
    CopyDone,
    DecodeJoin,
    Dispatch,
    EngineStep,
    EventQueue,
    FetchDone,
    Reported,
    Wakeup,
)
from conductor.sim.nodes import Engine
from conductor.sim.perturb import EngineCost
from conductor.sim.prefill import PrefillSide
from conductor.sim.records import RequestRecord, summarize
from conductor.sim.replicas import make_scheduler

Progress = Callable[[int, int], None]


@dataclass(slots=True)
class SimResult:
    """One run: per-request ``records`` (trace order), the ``summary`` metrics (JSON-ready;
    only ``sim_wall_s`` depends on the machine), samples, and the background ``copies``."""

    config: SimConfig
    records: list[RequestRecord]
    summary: dict[str, object]
    sim_wall_s: float
    duration_s: float
    load_samples: list[tuple[float, float, float]] = field(default_factory=list)
    replica_samples: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)
    copies: int = 0

    @property
    def slo_attainment(self) -> float:
        value = self.summary["slo_attainment"]
        assert isinstance(value, float)
        return value


def tracked_blocks(requests: Sequence[Request], ranks: Sequence[int]) -> tuple[BlockHash, ...]:
    """The blocks ranked ``ranks`` (1 = most used) by use in ``requests``; ties by hash."""
    counts: dict[BlockHash, int] = {}
    for r in requests:
        for h in r.block_hashes:
            counts[h] = counts.get(h, 0) + 1
    ranked = sorted(counts, key=lambda h: (-counts[h], h))
    return tuple(ranked[k - 1] for k in ranks if k - 1 < len(ranked))


def make_engines(cfg: SimConfig, scheduler: Scheduler) -> dict[InstanceId, Engine]:
    """``prefill-*``, ``decode-*`` then ``both-*`` engines, registered with ``scheduler``
    in that order; prefill-capable ones get an LRU prefix cache, decode ones with
    ``cfg.decode_cache`` one in their free KV blocks."""
    eng = cfg.engine
    cost = cfg.cost
    kv_tokens = eng.kv_capacity_tokens or cost.kv_capacity_tokens
    seqs = eng.max_num_seqs or cost.max_batch_size
    out: dict[InstanceId, Engine] = {}
    for role, n in (
        (Role.PREFILL, cfg.n_prefill),
        (Role.DECODE, cfg.n_decode),
        (Role.BOTH, cfg.n_both),
    ):
        for i in range(n):
            iid = InstanceId(f"{role.value}-{i}")
            cache_tokens = cfg.cache_capacity_tokens if role.prefills else None
            scheduler.add_instance(
                InstanceSpec(
                    iid,
                    role,
                    pulls_kv=cfg.kv_fetch,
                    cache_capacity_tokens=cache_tokens,
                    prefill_lanes=cfg.prefill_lanes,
                    prefill_chunk_tokens=eng.long_prefill_token_threshold,
                )
            )
            cache = LruBlockCache(cfg.cache_capacity_blocks) if role.prefills else None
            if role is Role.DECODE and cfg.decode_cache:
                cache = LruBlockCache(0)  # sized to the free KV (sim.decode_cache)
            out[iid] = Engine(
                iid,
                role,
                cache,
                kv_tokens // eng.block_size_tokens,
                seqs,
                eng.max_num_batched_tokens,
                eng.long_prefill_token_threshold,
                eng.block_size_tokens,
            )
    return out


class _Simulation:
    """One run's state: the scheduler, one record per request, the event queue, the
    engines and the two sides that drive them. Every event is handled at its time, in
    ``(time, seq)`` order."""

    def __init__(self, requests: Sequence[Request], cfg: SimConfig, outputs: Sequence[int]) -> None:
        self.cfg = cfg
        self.requests = requests
        generated = list(outputs)
        if len(generated) != len(requests):
            raise InvalidInput(
                "outputs", len(generated), f"must be one per request ({len(requests)})"
            )
        lengths = (
            OracleLengths(
                {r.request_id: n for r, n in zip(requests, generated, strict=True)},
                length_model(cfg.scheduler),
            )
            if cfg.oracle_lengths
            else None
        )
        self.scheduler: Scheduler = make_scheduler(cfg, lengths)
        self.records = [
            RequestRecord(r.request_id, r.arrival_s, r.prompt_tokens, n)
            for r, n in zip(requests, generated, strict=True)
        ]
        self.events = EventQueue()
        self.load_samples: list[tuple[float, float, float]] = []
        self.replica_samples: list[tuple[float, tuple[int, ...]]] = []
        self.tracked_blocks: tuple[BlockHash, ...] = ()
        if cfg.replica_sample_every_s > 0:
            self.tracked_blocks = tracked_blocks(requests, cfg.replica_ranks)
        self.engines = make_engines(cfg, self.scheduler)
        self.loop = EngineLoop(EngineCost.of(cfg), self.records, self.events)
        self.loop.report = self.scheduler.on_event
        for e in self.engines.values():
            self.loop.add(e)
        self.prefill = PrefillSide(
            cfg, self.scheduler, requests, self.records, self.events, self.engines, self.loop
        )
        self.decode = DecodeSide(
            self.scheduler,
            requests,
            self.records,
            self.engines,
            self.loop,
            load_kv=cfg.handoff == "load",
            block=cfg.scheduler.block_size_tokens,
            emit=self.prefill.emit,
        )
        self.decode.on_release = self.prefill.release

    def run(self, progress: Progress | None) -> None:
        push = self.events.push
        for i, r in enumerate(self.requests):
            push(r.arrival_s, Arrival(i))
        n = len(self.requests)
        arrived = 0
        heap = self.events.heap
        pop = heapq.heappop  # the queue's own pop, inlined: this loop runs once per event
        prefill = self.prefill
        decode = self.decode
        step_end = self.loop.on_step_end  # the hot path: ~95% of events on the bundled trace
        step_kind = EngineStep
        every = self.cfg.load_sample_every_s
        next_sample = self.requests[0].arrival_s if (every > 0 and self.requests) else math.inf
        r_every = self.cfg.replica_sample_every_s
        next_replica = self.requests[0].arrival_s if (r_every > 0 and self.requests) else math.inf
        while heap:
            t, _, ev = pop(heap)
            while t >= next_sample:
                for e in self.engines.values():
                    catch_up(e, next_sample)  # the steps before it (sample_load reads engines)
                self.sample_load(next_sample)
                next_sample += every
            while t >= next_replica:
                self.sample_replicas(next_replica)
                next_replica += r_every
            if isinstance(ev, step_kind):
                step_end(t, ev)
            elif isinstance(ev, Arrival):
                prefill.on_arrival(t, ev.index)
                arrived += 1
                if progress is not None and arrived % 500 == 0:
                    progress(arrived, n)
            elif isinstance(ev, DecodeJoin):
                decode.on_join(t, ev.decode, ev.index)
            elif isinstance(ev, FetchDone):
                prefill.on_fetch_done(t, ev.seq, ev.fetched)
            elif isinstance(ev, CopyDone):
                prefill.store_blocks(t, ev.engine, ev.hashes)
            elif isinstance(ev, Wakeup):
                prefill.on_wakeup(t)
            elif isinstance(ev, Dispatch):
                self.loop.enqueue(t, ev.node, ev.seq)
            elif isinstance(ev, Reported):
                self.scheduler.on_event(ev.event)
                prefill.release(t)
            else:  # KvEventDue (mypy checks that no other kind is left)
                self.scheduler.on_event(ev.event)
        if progress is not None:
            progress(n, n)

    def sample_load(self, t: float) -> None:
        """Prefill load = mean predicted queue / TTFT SLO; decode load = mean step time /
        TBT SLO (arXiv §7.1 defines load against the SLOs)."""
        sched = self.cfg.scheduler
        cost = self.cfg.cost
        p = self.scheduler.instances
        pre = sum(p[i].prefill.queue_s(t) for i in self.prefill.nodes) / len(self.prefill.nodes)
        dec = sum(
            cost.decode_step_s(n.batch, n.context_tokens) for n in self.decode.nodes.values()
        ) / len(self.decode.nodes)
        self.load_samples.append((t, pre / sched.ttft_slo_s, dec / sched.tbt_slo_s))

    def sample_replicas(self, t: float) -> None:
        """How many prefill caches hold each tracked block at ``t``."""
        caches = [n.cache for n in self.prefill.nodes.values() if n.cache is not None]
        counts = tuple(sum(1 for c in caches if h in c) for h in self.tracked_blocks)
        self.replica_samples.append((t, counts))


def max_tokens_outputs(requests: Sequence[Request]) -> list[int]:
    """Each request's ``max_tokens``, as what it generates; :class:`InvalidInput` naming the
    first request without one (there is no default output length)."""
    out: list[int] = []
    for i, r in enumerate(requests):
        if r.max_tokens is None:
            why = "has no max_tokens: give simulate() the output lengths"
            raise InvalidInput(f"requests[{i}].max_tokens", None, why)
        out.append(r.max_tokens)
    return out


def simulate(
    requests: Sequence[Request],
    cfg: SimConfig,
    *,
    outputs: Sequence[int],
    progress: Progress | None = None,
) -> SimResult:
    """Replay ``requests`` (sorted by arrival) through a cluster built from ``cfg``;
    request ``i`` generates ``outputs[i]`` tokens (a trace's lengths:
    :func:`conductor.workload.trace.generated_tokens`; requests that generate exactly their
    ``max_tokens``: :func:`max_tokens_outputs`). The scheduler never sees ``outputs`` unless
    ``cfg.oracle_lengths``."""
    t0 = time.perf_counter()
    sim = _Simulation(requests, cfg, outputs)
    sim.run(progress)
    sim.decode.finish_tbt()
    wall = time.perf_counter() - t0
    duration = requests[-1].arrival_s - requests[0].arrival_s if requests else 0.0
    sched = cfg.scheduler
    summary: dict[str, object] = {
        "policy": cfg.policy,
        "admission": sched.admission,
        "cpp": sched.cpp_enabled,
        "oracle_lengths": cfg.oracle_lengths,
        "cost_error": cfg.cost_error,
        "cost_bias": cfg.cost_bias,
        "cost_correction": sched.cost_correction,
        "kv_fetch": cfg.kv_fetch,
        "prefill_lanes": cfg.prefill_lanes,
        **summarize(
            sim.records,
            ttft_slo_s=sched.ttft_slo_s,
            tbt_slo_s=sched.tbt_slo_s,
            duration_s=duration,
        ),
        "sim_wall_s": round(wall, 3),
    }
    return SimResult(
        cfg,
        sim.records,
        summary,
        wall,
        duration,
        sim.load_samples,
        sim.replica_samples,
        sim.prefill.copies,
    )
