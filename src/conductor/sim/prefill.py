"""The prefill side: executes the scheduler's plans on simulated prefill instances.

FCFS queues, LRU KV caches that publish KV events, prefix fetches and background replica
copies over the source node's NIC, chunked-pipeline stages, and the KV hand-off to decode.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from conductor.core.events import BlocksRemoved, BlocksStored, Event, PrefillFinished
from conductor.core.plan import Plan, Rejection
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceSpec
from conductor.core.types import BlockHash, InstanceId, Request, Role, Tier
from conductor.sim.cache import LruBlockCache
from conductor.sim.config import SimConfig
from conductor.sim.events import (
    CopyDone,
    DecodeJoin,
    EventQueue,
    FetchDone,
    KvEventDue,
    PrefillDone,
)
from conductor.sim.nodes import CppGroup, Job, PrefillNode
from conductor.sim.perturb import EngineCost
from conductor.sim.records import RequestRecord


class PrefillSide:
    """The prefill instances ``prefill-0`` .. ``prefill-{n-1}``, registered with the
    scheduler in that order.

    A node runs one job at a time, in arrival order; the job at the head waits while its
    fetch is in flight. With chunked pipelining the lead node keeps the KV blocks and the
    prefill ends when the group's last stage ends."""

    def __init__(
        self,
        cfg: SimConfig,
        scheduler: Scheduler,
        requests: Sequence[Request],
        records: list[RequestRecord],
        events: EventQueue,
    ) -> None:
        self.cfg = cfg
        self.cost = cfg.cost
        self.engine_cost = EngineCost.of(cfg)  # the engines' own timing (perturbed model)
        self.block = cfg.scheduler.block_size_tokens
        self.scheduler = scheduler
        self.requests = requests
        self.records = records
        self.push = events.push
        self.rng = random.Random(cfg.seed)
        self.copies = 0
        self.nodes: dict[InstanceId, PrefillNode] = {}
        for i in range(cfg.n_prefill):
            iid = InstanceId(f"prefill-{i}")
            scheduler.add_instance(InstanceSpec(iid, Role.PREFILL))
            self.nodes[iid] = PrefillNode(iid, LruBlockCache(cfg.cache_capacity_blocks))

    # -- KV events -----------------------------------------------------------------------
    def emit(self, t: float, event: Event) -> None:
        if self.cfg.kv_event_delay_s > 0:
            self.push(t + self.cfg.kv_event_delay_s, KvEventDue(event))
        else:
            self.scheduler.on_event(event)

    def store_blocks(self, t: float, node: PrefillNode, hashes: Sequence[BlockHash]) -> None:
        stored, evicted = node.cache.insert(hashes)
        if evicted:
            self.emit(t, BlocksRemoved(node.iid, tuple(evicted), Tier.DRAM))
        if stored:
            self.emit(t, BlocksStored(node.iid, tuple(stored), Tier.DRAM))

    # -- a plan arrives ------------------------------------------------------------------
    def on_arrival(self, t: float, i: int) -> None:
        req = self.requests[i]
        rec = self.records[i]
        decision = self.scheduler.schedule(req, t)
        if isinstance(decision, Rejection):
            rec.rejected = decision.code
            rec.predicted_ttft_s = decision.predicted_ttft_s
            return
        plan = decision
        rec.prefill = plan.prefill
        rec.decode = plan.decode
        rec.predicted_ttft_s = plan.predicted_ttft_s
        job = Job(i, req, plan)
        node = self.nodes[plan.prefill]
        if plan.fetch is not None:
            src = self.nodes.get(plan.fetch.source)
            hashes = plan.fetch.block_hashes
            have = src.cache.prefix_blocks(hashes) if src is not None else 0
            if have > 0 and src is not None:
                fetched = hashes[:have]
                tokens = min(len(fetched) * self.block, req.prompt_tokens)
                end = src.send(t, self.cost.transfer_s(tokens))
                job.fetch_pending = True
                self.push(end, FetchDone(job, fetched))
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
        src = self.nodes.get(source)
        dst = self.nodes.get(target)
        if src is None or dst is None:
            return
        have = src.cache.prefix_blocks(hashes)
        if have == 0:
            return
        end = src.send(t, self.cost.transfer_s(have * self.block))
        self.copies += 1
        self.push(end, CopyDone(dst, hashes[:have]))

    def add_cpp_stages(self, t: float, job: Job, plan: Plan) -> None:
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
        compute = self.engine_cost.pipelined_prefill_s(
            req.request_id,
            req.prompt_tokens,
            plan.cached_tokens,
            plan.cpp.chunk_tokens,
            len(nodes),
            bw,
        )
        job.group = CppGroup(len(nodes), compute)
        self.records[job.index].cpp_nodes = len(nodes)
        for iid in nodes:
            if iid == plan.prefill:
                continue
            helper = Job(job.index, req, plan, group=job.group, helper=True)
            self.nodes[iid].queue.append(helper)
            self.try_start(t, self.nodes[iid])

    def on_fetch_done(self, t: float, job: Job, fetched: tuple[BlockHash, ...]) -> None:
        node = self.nodes[job.plan.prefill]
        self.store_blocks(t, node, fetched)
        job.fetch_pending = False
        self.try_start(t, node)

    # -- compute -------------------------------------------------------------------------
    def try_start(self, t: float, node: PrefillNode) -> None:
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
            self.push(t + job.compute_s, PrefillDone(node, job))
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
            compute = self.engine_cost.prefill_s(req.request_id, req.prompt_tokens, cached)
            if self.cfg.prefill_noise > 0:
                compute *= math.exp(self.rng.gauss(0.0, self.cfg.prefill_noise))
        job.compute_s = compute
        rec.prefill_start_s = t
        rec.prefill_compute_s += compute
        node.busy = True
        self.push(t + compute, PrefillDone(node, job))

    def on_prefill_done(self, t: float, node: PrefillNode, job: Job) -> None:
        node.busy = False
        req = job.request
        rec = self.records[job.index]
        if job.group is None:  # the engine reports its compute time and reused tokens
            cached = rec.local_tokens + rec.fetched_tokens
            done = PrefillFinished(req.request_id, node.iid, t, job.compute_s, cached)
        else:
            done = PrefillFinished(req.request_id, node.iid, t)
        self.scheduler.on_event(done)
        lead = self.nodes[job.plan.prefill]  # with CPP, the lead keeps the KV blocks
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
            d = self.scheduler.confirm_decode(req.request_id, t)
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
            self.push(join, DecodeJoin(decode_iid, job.index))
        self.try_start(t, node)
        if node is not lead:
            self.try_start(t, lead)
