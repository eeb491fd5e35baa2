"""The event loop: arrivals -> Scheduler.schedule -> fetch -> prefill -> KV hand-off -> decode.

One heap of ``(time, seq, kind, a, b)`` tuples gives a total order (``seq`` breaks ties), so a
run is a pure function of (requests, config). Decode runs one event per batch iteration;
per-request work happens only when a request joins or leaves a batch. A request's TBT is
computed afterwards from its instance's log of iteration end times.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from conductor.core.chunked_pipeline import pipelined_prefill_s
from conductor.core.events import (
    BlocksRemoved,
    BlocksStored,
    Event,
    PrefillFinished,
    RequestFinished,
)
from conductor.core.plan import Plan, Rejection
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceSpec
from conductor.core.types import BlockHash, InstanceId, Request, Role, Tier
from conductor.sim.cache import LruBlockCache
from conductor.sim.config import SimConfig
from conductor.sim.records import RequestRecord, summarize, tail_mean_tbt

ARRIVAL, FETCH_DONE, PREFILL_DONE, DECODE_JOIN, DECODE_STEP, KV_EVENT, COPY_DONE = range(7)

Progress = Callable[[int, int], None]


@dataclass(slots=True)
class _CppGroup:
    remaining: int
    compute_s: float


@dataclass(slots=True)
class _Job:
    index: int
    request: Request
    plan: Plan
    fetch_pending: bool = False
    compute_s: float = 0.0
    group: _CppGroup | None = None
    helper: bool = False  # a CPP stage on a node other than the lead


@dataclass(slots=True)
class _PrefillNode:
    iid: InstanceId
    cache: LruBlockCache
    queue: deque[_Job] = field(default_factory=deque)
    busy: bool = False
    nic_free_s: float = 0.0


@dataclass(slots=True)
class _DecodeNode:
    iid: InstanceId
    kv_capacity_tokens: int
    max_batch: int
    waiting: deque[int] = field(default_factory=deque)
    finish_heap: list[tuple[int, int]] = field(default_factory=list)
    step_ends: list[float] = field(default_factory=list)
    batch: int = 0
    context_tokens: int = 0
    kv_used: int = 0
    stepping: bool = False


@dataclass(slots=True)
class SimResult:
    config: SimConfig
    records: list[RequestRecord]
    summary: dict[str, object]
    sim_wall_s: float
    duration_s: float
    load_samples: list[tuple[float, float, float]] = field(default_factory=list)
    replica_samples: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)
    copies: int = 0


class _Simulation:
    def __init__(self, requests: Sequence[Request], cfg: SimConfig) -> None:
        self.cfg = cfg
        self.requests = requests
        self.cost = cfg.cost
        self.conductor = Scheduler(cfg.cost, policy=cfg.policy, config=cfg.scheduler)
        self.block = cfg.scheduler.block_size_tokens
        self.records = [
            RequestRecord(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens)
            for r in requests
        ]
        self.prefill: dict[InstanceId, _PrefillNode] = {}
        self.decode: dict[InstanceId, _DecodeNode] = {}
        self.decode_of: dict[int, tuple[_DecodeNode, int, int]] = {}
        self.heap: list[tuple[float, int, int, object, object]] = []
        self.seq = 0
        self.rng = random.Random(cfg.seed)
        self.load_samples: list[tuple[float, float, float]] = []
        self.copies = 0
        self.replica_samples: list[tuple[float, tuple[int, ...]]] = []
        self.tracked_blocks: tuple[BlockHash, ...] = ()
        if cfg.replica_sample_every_s > 0:
            counts: dict[BlockHash, int] = {}
            for r in requests:
                for h in r.block_hashes:
                    counts[h] = counts.get(h, 0) + 1
            ranked = sorted(counts, key=lambda h: (-counts[h], h))
            self.tracked_blocks = tuple(
                ranked[k - 1] for k in cfg.replica_ranks if k - 1 < len(ranked)
            )
        cap_blocks = cfg.cache_capacity_blocks
        for i in range(cfg.n_prefill):
            iid = InstanceId(f"prefill-{i}")
            self.conductor.add_instance(InstanceSpec(iid, Role.PREFILL))
            self.prefill[iid] = _PrefillNode(iid, LruBlockCache(cap_blocks))
        for i in range(cfg.n_decode):
            iid = InstanceId(f"decode-{i}")
            self.conductor.add_instance(InstanceSpec(iid, Role.DECODE))
            self.decode[iid] = _DecodeNode(
                iid, cfg.cost.kv_capacity_tokens, cfg.cost.max_batch_size
            )

    # -- plumbing ------------------------------------------------------------------------
    def push(self, t: float, kind: int, a: object = None, b: object = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def emit(self, t: float, event: Event) -> None:
        if self.cfg.kv_event_delay_s > 0:
            self.push(t + self.cfg.kv_event_delay_s, KV_EVENT, event)
        else:
            self.conductor.on_event(event)

    def store_blocks(self, t: float, node: _PrefillNode, hashes: Sequence[BlockHash]) -> None:
        stored, evicted = node.cache.insert(hashes)
        if evicted:
            self.emit(t, BlocksRemoved(node.iid, tuple(evicted), Tier.DRAM))
        if stored:
            self.emit(t, BlocksStored(node.iid, tuple(stored), Tier.DRAM))

    # -- run -----------------------------------------------------------------------------
    def run(self, progress: Progress | None) -> None:
        for i, r in enumerate(self.requests):
            self.push(r.arrival_s, ARRIVAL, i)
        n = len(self.requests)
        arrived = 0
        heap = self.heap
        pop = heapq.heappop
        every = self.cfg.load_sample_every_s
        next_sample = self.requests[0].arrival_s if (every > 0 and self.requests) else math.inf
        r_every = self.cfg.replica_sample_every_s
        next_replica = self.requests[0].arrival_s if (r_every > 0 and self.requests) else math.inf
        while heap:
            t, _, kind, a, b = pop(heap)
            while t >= next_sample:
                self.sample_load(next_sample)
                next_sample += every
            while t >= next_replica:
                self.replica_samples.append(
                    (
                        next_replica,
                        tuple(
                            sum(1 for n in self.prefill.values() if h in n.cache)
                            for h in self.tracked_blocks
                        ),
                    )
                )
                next_replica += r_every
            if kind == DECODE_STEP:
                self.on_step_end(t, a)  # type: ignore[arg-type]
            elif kind == ARRIVAL:
                self.on_arrival(t, a)  # type: ignore[arg-type]
                arrived += 1
                if progress is not None and arrived % 500 == 0:
                    progress(arrived, n)
            elif kind == PREFILL_DONE:
                self.on_prefill_done(t, a, b)  # type: ignore[arg-type]
            elif kind == DECODE_JOIN:
                self.on_decode_join(t, a, b)  # type: ignore[arg-type]
            elif kind == FETCH_DONE:
                self.on_fetch_done(t, a, b)  # type: ignore[arg-type]
            elif kind == COPY_DONE:
                self.store_blocks(t, a, b)  # type: ignore[arg-type]
            else:
                self.conductor.on_event(a)  # type: ignore[arg-type]
        if progress is not None:
            progress(n, n)

    def sample_load(self, t: float) -> None:
        """Prefill load = mean predicted queue / TTFT SLO; decode load = mean step time /
        TBT SLO (arXiv §7.1 defines load against the SLOs)."""
        sched = self.cfg.scheduler
        p = self.conductor.instances
        pre = sum(p[i].prefill.queue_s(t) for i in self.prefill) / len(self.prefill)
        dec = sum(
            self.cost.decode_step_s(n.batch, n.context_tokens) for n in self.decode.values()
        ) / len(self.decode)
        self.load_samples.append((t, pre / sched.ttft_slo_s, dec / sched.tbt_slo_s))

    # -- prefill side --------------------------------------------------------------------
    def on_arrival(self, t: float, i: int) -> None:
        req = self.requests[i]
        rec = self.records[i]
        decision = self.conductor.schedule(req, t)
        if isinstance(decision, Rejection):
            rec.rejected = decision.code
            rec.predicted_ttft_s = decision.predicted_ttft_s
            return
        plan = decision
        rec.prefill = plan.prefill
        rec.decode = plan.decode
        rec.predicted_ttft_s = plan.predicted_ttft_s
        job = _Job(i, req, plan)
        node = self.prefill[plan.prefill]
        if plan.fetch is not None:
            src = self.prefill.get(plan.fetch.source)
            hashes = plan.fetch.block_hashes
            have = src.cache.prefix_blocks(hashes) if src is not None else 0
            if have > 0 and src is not None:
                fetched = hashes[:have]
                tokens = min(len(fetched) * self.block, req.prompt_tokens)
                start = max(t, src.nic_free_s)
                end = start + self.cost.transfer_s(tokens)
                src.nic_free_s = end
                job.fetch_pending = True
                self.push(end, FETCH_DONE, job, fetched)
        for m in plan.migrations:
            if (
                plan.fetch is not None
                and m.source == plan.fetch.source
                and m.target == plan.prefill
            ):
                continue  # Algorithm 1's copy-on-fetch, carried out above
            self.copy_blocks(t, m.source, m.target, m.block_hashes)
        node.queue.append(job)
        if plan.cpp is not None:
            self.add_cpp_stages(t, job, plan)
        self.try_start(t, node)

    def copy_blocks(
        self, t: float, source: InstanceId, target: InstanceId, hashes: tuple[BlockHash, ...]
    ) -> None:
        """Background hot-spot replication: copy what ``source`` still holds of ``hashes``
        to ``target`` over ``source``'s NIC (queued behind its other transfers)."""
        src = self.prefill.get(source)
        dst = self.prefill.get(target)
        if src is None or dst is None:
            return
        have = src.cache.prefix_blocks(hashes)
        if have == 0:
            return
        start = max(t, src.nic_free_s)
        end = start + self.cost.transfer_s(have * self.block)
        src.nic_free_s = end
        self.copies += 1
        self.push(end, COPY_DONE, dst, hashes[:have])

    def add_cpp_stages(self, t: float, job: _Job, plan: Plan) -> None:
        """CPP: every node of the group runs a stage for the whole pipelined time; the
        prefill ends when the last stage ends (see ``conductor.core.chunked_pipeline``).
        Simplification:
        each node starts its stage when *it* is free, so the request ends at the latest
        start + the pipelined time, as in a real gang, but a node that would sit waiting
        for the others is counted as free until its own start (slightly optimistic)."""
        assert plan.cpp is not None
        req = job.request
        nodes = plan.cpp.nodes
        bw = self.cost.transfer_bytes_per_s
        compute = pipelined_prefill_s(
            self.cost, req.prompt_tokens, plan.cached_tokens, plan.cpp.chunk_tokens, len(nodes), bw
        )
        job.group = _CppGroup(len(nodes), compute)
        self.records[job.index].cpp_nodes = len(nodes)
        for iid in nodes:
            if iid == plan.prefill:
                continue
            helper = _Job(job.index, req, plan, group=job.group, helper=True)
            self.prefill[iid].queue.append(helper)
            self.try_start(t, self.prefill[iid])

    def on_fetch_done(self, t: float, job: _Job, fetched: tuple[BlockHash, ...]) -> None:
        node = self.prefill[job.plan.prefill]
        self.store_blocks(t, node, fetched)
        job.fetch_pending = False
        self.try_start(t, node)

    def try_start(self, t: float, node: _PrefillNode) -> None:
        if node.busy or not node.queue or node.queue[0].fetch_pending:
            return
        job = node.queue.popleft()
        req = job.request
        rec = self.records[job.index]
        if job.helper:
            assert job.group is not None
            job.compute_s = job.group.compute_s
            rec.prefill_compute_s += job.compute_s
            node.busy = True
            self.push(t + job.compute_s, PREFILL_DONE, node, job)
            return
        depth = node.cache.prefix_blocks(req.block_hashes)
        cached = min(depth * self.block, req.prompt_tokens - 1)
        fetched = 0
        if job.plan.fetch is not None:
            fetched = max(0, min(cached - job.plan.local_tokens, job.plan.fetch.tokens))
        rec.local_tokens = cached - fetched
        rec.fetched_tokens = fetched
        if job.group is not None:
            compute = job.group.compute_s
        else:
            compute = self.cost.prefill_s(req.prompt_tokens, cached)
            if self.cfg.prefill_noise > 0:
                compute *= math.exp(self.rng.gauss(0.0, self.cfg.prefill_noise))
        job.compute_s = compute
        rec.prefill_start_s = t
        rec.prefill_compute_s += compute
        node.busy = True
        self.push(t + compute, PREFILL_DONE, node, job)

    def on_prefill_done(self, t: float, node: _PrefillNode, job: _Job) -> None:
        node.busy = False
        req = job.request
        rec = self.records[job.index]
        self.conductor.on_event(PrefillFinished(req.request_id, node.iid, t))
        lead = self.prefill[job.plan.prefill]  # with CPP, the lead keeps the KV blocks
        if job.group is not None:
            job.group.remaining -= 1
            if job.group.remaining > 0:
                self.try_start(t, node)
                return
        rec.prefill_end_s = t
        self.store_blocks(t, lead, req.block_hashes)
        decode_iid = job.plan.decode
        rejected = False
        if self.cfg.scheduler.admission == "baseline":
            d = self.conductor.confirm_decode(req.request_id, t)
            if isinstance(d, Rejection):
                rec.rejected = d.code
                rec.rejected_after_prefill = True
                rejected = True
            else:
                decode_iid = d
        if not rejected:
            rec.decode = decode_iid
            xfer = self.cost.transfer_s(req.prompt_tokens)
            tail = xfer - job.compute_s
            join = t + (tail if tail > 0 else 0.0)
            self.push(join, DECODE_JOIN, self.decode[decode_iid], job.index)
        self.try_start(t, node)
        if node is not lead:
            self.try_start(t, lead)

    # -- decode side ---------------------------------------------------------------------
    def on_decode_join(self, t: float, node: _DecodeNode, i: int) -> None:
        rec = self.records[i]
        rec.decode_join_s = t
        if rec.output_tokens <= 1:
            rec.finish_s = t
            rec.tbt_s = 0.0
            self.conductor.on_event(RequestFinished(self.requests[i].request_id, node.iid, t))
            return
        node.waiting.append(i)
        if not node.stepping:
            self.start_step(t, node)

    def start_step(self, t: float, node: _DecodeNode) -> None:
        waiting = node.waiting
        while waiting:
            i = waiting[0]
            rec = self.records[i]
            need = rec.prompt_tokens + rec.output_tokens
            fits = node.kv_used + need <= node.kv_capacity_tokens and node.batch < node.max_batch
            if not fits and node.batch > 0:
                break
            waiting.popleft()
            join = len(node.step_ends)
            last = join + rec.output_tokens - 2  # output - 1 decode tokens
            heapq.heappush(node.finish_heap, (last, i))
            self.decode_of[i] = (node, join, last)
            node.batch += 1
            node.kv_used += need
            node.context_tokens += rec.prompt_tokens + 1
        if node.batch == 0:
            node.stepping = False
            return
        node.stepping = True
        self.push(t + self.cost.decode_step_s(node.batch, node.context_tokens), DECODE_STEP, node)

    def on_step_end(self, t: float, node: _DecodeNode) -> None:
        idx = len(node.step_ends)
        node.step_ends.append(t)
        node.context_tokens += node.batch
        fh = node.finish_heap
        while fh and fh[0][0] == idx:
            _, i = heapq.heappop(fh)
            rec = self.records[i]
            rec.finish_s = t
            node.batch -= 1
            node.kv_used -= rec.prompt_tokens + rec.output_tokens
            node.context_tokens -= rec.prompt_tokens + rec.output_tokens
            self.conductor.on_event(RequestFinished(self.requests[i].request_id, node.iid, t))
        self.start_step(t, node)

    # -- results -------------------------------------------------------------------------
    def finish_tbt(self) -> None:
        ends = {iid: np.asarray(n.step_ends) for iid, n in self.decode.items()}
        diffs = {iid: np.diff(a) for iid, a in ends.items()}
        for i, (node, join, last) in self.decode_of.items():
            rec = self.records[i]
            if rec.prefill_end_s is None:
                continue
            e = ends[node.iid]
            first = e[join] - rec.prefill_end_s
            intervals = np.concatenate(([first], diffs[node.iid][join:last]))
            rec.tbt_s = tail_mean_tbt(intervals)


def simulate(
    requests: Sequence[Request], cfg: SimConfig, *, progress: Progress | None = None
) -> SimResult:
    """Replay ``requests`` (sorted by arrival) through a cluster built from ``cfg``."""
    t0 = time.perf_counter()
    sim = _Simulation(requests, cfg)
    sim.run(progress)
    sim.finish_tbt()
    wall = time.perf_counter() - t0
    duration = requests[-1].arrival_s - requests[0].arrival_s if requests else 0.0
    sched = cfg.scheduler
    summary: dict[str, object] = {
        "policy": cfg.policy,
        "admission": sched.admission,
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
        sim.copies,
    )
