"""The prefill side: carries out the scheduler's plans on the prefill-capable engines.

LRU prefix caches that publish KV events, prefix fetches and background replica copies over
both ends' NICs, chunked-pipeline stages, and the KV hand-off to decode (over the NICs of
the prefill and the decode engine, streamed layer by layer while the prefill runs). The
engines' own scheduling is :mod:`conductor.sim.engine`'s.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from functools import partial

from conductor.core.events import BlocksRemoved, BlocksStored, Event, PrefillFinished
from conductor.core.late_binding import HoldQueue
from conductor.core.late_binding_rule import claim_lag_s, late_binding_of
from conductor.core.plan import Decision, Plan, Rejection
from conductor.core.scheduler import Scheduler
from conductor.core.types import BlockHash, InstanceId, Request, RequestId, Role, Tier
from conductor.sim.config import SimConfig
from conductor.sim.decode_cache import held_tokens
from conductor.sim.engine import EngineLoop
from conductor.sim.events import (
    CopyDone,
    DecodeJoin,
    Dispatch,
    EventQueue,
    FetchDone,
    KvEventDue,
    Reported,
    Wakeup,
)
from conductor.sim.nodes import CppGroup, Engine, Seq, transfer
from conductor.sim.records import RequestRecord
from conductor.sim.replicas import ReplicaSet


class PrefillSide:
    """Arrivals -> plans -> prefill engines -> hand-off. ``nodes``: the prefill-capable
    engines (``prefill-*`` then ``both-*``); ``engines``: every engine by id."""

    def __init__(
        self,
        cfg: SimConfig,
        scheduler: Scheduler,
        requests: Sequence[Request],
        records: list[RequestRecord],
        events: EventQueue,
        engines: dict[InstanceId, Engine],
        loop: EngineLoop,
    ) -> None:
        self.cfg = cfg
        self.cost = cfg.cost  # KV transfers keep their nominal time
        self.engine_cost = loop.engine_cost
        self.block = cfg.scheduler.block_size_tokens
        self.scheduler = scheduler
        self.requests = requests
        self.records = records
        self.push = events.push
        self.rng = random.Random(cfg.seed)
        self.copies = 0
        self.engines = engines
        self.nodes = {iid: e for iid, e in engines.items() if e.role.prefills}
        self.loop = loop
        self.baseline = cfg.scheduler.admission == "baseline"
        # late binding: one hold queue per scheduler replica (each gateway holds its own
        # arrivals, deciding on its own lagging view)
        rule = late_binding_of(scheduler)
        self.replicas = scheduler if isinstance(scheduler, ReplicaSet) else None
        peers: list[Scheduler] = list(self.replicas.peers) if self.replicas else [scheduler]
        n, lag = len(peers), claim_lag_s(cfg.sync_delay_s)
        self.holds = (
            [HoldQueue(p, rule, (k, n, lag)) for k, p in enumerate(peers)]
            if rule is not None
            else []
        )
        self.turn = 0  # the replica whose queue releases first next time
        self.held_index: dict[RequestId, int] = {}
        self.room: dict[int, int] = {}  # request index -> cache blocks its running prefill holds
        self.wake_s = math.inf  # the earliest Wakeup in the queue
        loop.on_start = self.on_start
        loop.on_chunk = self.on_chunk
        loop.on_first_token = self.on_first_token
        loop.on_stage_done = self.on_stage_done

    # -- KV events -----------------------------------------------------------------------
    def emit(self, t: float, event: Event) -> None:
        if self.cfg.kv_event_delay_s > 0:
            self.push(t + self.cfg.kv_event_delay_s, KvEventDue(event))
        else:
            self.scheduler.on_event(event)

    def store_blocks(
        self, t: float, node: Engine, hashes: Sequence[BlockHash], index: int | None = None
    ) -> None:
        """Store ``hashes`` in ``node``'s cache (giving back the room request ``index``'s
        prefill held there) and publish what was stored and evicted."""
        if node.cache is None:
            return
        if index is not None:
            node.cache.release(self.room.pop(index, 0))
        stored, evicted = node.cache.insert(hashes)
        self.publish(t, node, stored, evicted)

    def publish(
        self, t: float, node: Engine, stored: Sequence[BlockHash], evicted: Sequence[BlockHash]
    ) -> None:
        """The KV events of a change to ``node``'s cache: what it evicted, then stored."""
        if evicted:
            self.emit(t, BlocksRemoved(node.iid, tuple(evicted), Tier.DRAM))
        if stored:
            self.emit(t, BlocksStored(node.iid, tuple(stored), Tier.DRAM))

    # -- a plan arrives ------------------------------------------------------------------
    def on_arrival(self, t: float, i: int) -> None:
        req = self.requests[i]
        if not self.holds:
            self.carry_out(t, i, self.scheduler.schedule(req, t))
            return
        self.held_index[req.request_id] = i
        k = self.replicas.next_replica() if self.replicas else 0
        hold = self.holds[k]
        self.carry_out_all(t, self.on_replica(k, t, lambda: hold.submit(req, t)))

    def on_replica(self, k: int, t: float, act: Callable[[], list[Decision]]) -> list[Decision]:
        return self.replicas.on_replica(k, t, act) if self.replicas else act()

    def release(self, t: float) -> None:
        """Late binding: place the held requests the cluster can now start, and ask to be
        woken when the next one may go (:mod:`conductor.core.late_binding`)."""
        n = len(self.holds)
        first = self.turn
        self.turn = (first + 1) % n if n else 0
        for j in range(n):  # whose view sees the freed capacity first rotates
            k = (first + j) % n
            hold = self.holds[k]
            if len(hold):
                self.carry_out_all(t, self.on_replica(k, t, partial(hold.release, t)))

    def carry_out_all(self, t: float, decisions: list[Decision]) -> None:
        for d in decisions:
            self.carry_out(t, self.held_index.pop(d.request_id), d)
        for hold in self.holds:
            wake = hold.wakeup_s(t)
            if wake is not None and wake < self.wake_s:
                self.wake_s = wake
                self.push(wake, Wakeup())

    def on_wakeup(self, t: float) -> None:
        if t >= self.wake_s:
            self.wake_s = math.inf
        self.release(t)

    def carry_out(self, t: float, i: int, decision: Decision) -> None:
        req = self.requests[i]
        rec = self.records[i]
        if isinstance(decision, Rejection):
            rec.rejected = decision.code
            rec.predicted_ttft_s = decision.predicted_ttft_s
            return
        plan = decision
        rec.prefill = plan.prefill
        rec.decode = plan.decode
        rec.predicted_ttft_s = plan.predicted_ttft_s
        node = self.nodes[plan.prefill]
        here = plan.decode == plan.prefill and node.role is Role.BOTH and not self.baseline
        seq = Seq(i, plan, req.prompt_tokens, rec.output_tokens, decodes=here)
        if here:
            self.loop.segments[i] = []
        seq.factor = self.engine_cost.job_factor(req.request_id)
        seq.noise = seq.factor
        if self.cfg.prefill_noise > 0:
            seq.noise *= math.exp(self.rng.gauss(0.0, self.cfg.prefill_noise))
        if plan.fetch is not None:
            src = self.nodes.get(plan.fetch.source)
            hashes = plan.fetch.block_hashes
            have = src.cache.prefix_blocks(hashes) if src is not None and src.cache else 0
            if have > 0 and src is not None:
                fetched = hashes[:have]
                tokens = min(len(fetched) * self.block, req.prompt_tokens)
                end = transfer(src, node, t, self.cost.transfer_s(tokens))
                seq.fetch_pending = True
                self.push(end, FetchDone(seq, fetched))
        for m in plan.migrations:
            if (
                plan.fetch is not None
                and m.source == plan.fetch.source
                and m.target == plan.prefill
            ):
                continue  # Algorithm 1's copy-on-fetch, carried out above
            self.copy_blocks(t, m.source, m.target, m.block_hashes)
        if plan.cpp is not None:
            self.add_cpp_stages(t, seq, plan)
        if self.cfg.dispatch_latency_s > 0:
            self.push(t + self.cfg.dispatch_latency_s, Dispatch(node, seq))
        else:
            self.loop.enqueue(t, node, seq)

    def copy_blocks(
        self, t: float, source: InstanceId, target: InstanceId, hashes: tuple[BlockHash, ...]
    ) -> None:
        """Background hot-spot replication: copy what ``source`` still holds of ``hashes``
        to ``target`` over both NICs (queued behind their other transfers)."""
        src = self.nodes.get(source)
        dst = self.nodes.get(target)
        if src is None or dst is None or src.cache is None:
            return
        have = src.cache.prefix_blocks(hashes)
        if have == 0:
            return
        end = transfer(src, dst, t, self.cost.transfer_s(have * self.block))
        self.copies += 1
        self.push(end, CopyDone(dst, hashes[:have]))

    def add_cpp_stages(self, t: float, seq: Seq, plan: Plan) -> None:
        """CPP: every node of the group runs a stage alone for the whole pipelined time;
        the prefill ends when the last stage ends (see ``conductor.core.chunked_pipeline``).
        Simplification: each node starts its stage when *it* is free, so the request ends
        at the latest start + the pipelined time, as in a real gang, but a node that would
        sit waiting for the others is counted as free until its own start (optimistic)."""
        assert plan.cpp is not None
        req = self.requests[seq.index]
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
        group = CppGroup(len(nodes), compute)
        seq.group = group
        seq.exclusive_s = compute
        seq.decodes = False
        self.records[seq.index].cpp_nodes = len(nodes)
        for iid in nodes:
            if iid == plan.prefill:
                continue
            helper = Seq(seq.index, plan, req.prompt_tokens, 0, decodes=False)
            helper.group = group
            helper.exclusive_s = compute
            helper.helper = True
            helper.started = True
            self.loop.enqueue(t, self.nodes[iid], helper)

    def on_fetch_done(self, t: float, seq: Seq, fetched: tuple[BlockHash, ...]) -> None:
        assert seq.plan is not None
        node = self.nodes[seq.plan.prefill]
        self.store_blocks(t, node, fetched)
        seq.fetch_pending = False
        self.loop.kick(t, node)

    # -- engine hooks --------------------------------------------------------------------
    def on_start(self, t: float, node: Engine, seq: Seq) -> None:
        """``seq`` is considered for admission on ``node``: what of its prompt is cached."""
        req = self.requests[seq.index]
        rec = self.records[seq.index]
        depth = node.cache.prefix_blocks(req.block_hashes) if node.cache is not None else 0
        cached = min(depth * self.block, req.prompt_tokens - 1)
        fetched = 0
        plan = seq.plan
        if plan is not None and plan.fetch is not None:
            fetched = max(0, min(cached - plan.local_tokens, plan.fetch.tokens))
        rec.local_tokens = cached - fetched
        rec.fetched_tokens = fetched
        seq.computed = seq.base = cached
        seq.stored = depth
        if seq.exclusive_s > 0:
            rec.prefill_start_s = t
        cache = node.cache
        if cache is not None and node.role.prefills and cached < seq.target:
            # the prefill holds room for the blocks it will store from now on (its hits
            # refreshed first, so they are not what makes that room)
            chain = req.block_hashes
            cache.touch(chain[:depth])
            n = cache.kept(len(chain)) - depth
            if n > 0:
                self.room[seq.index] = n
                self.publish(t, node, (), cache.reserve(n))

    def on_chunk(self, t: float, node: Engine, seq: Seq) -> None:
        """A chunk of ``seq``'s prompt was computed on ``node`` and more is to come: its
        full blocks computed so far are cached (out of the room its prefill holds) and
        published, as vLLM caches a partial prefill's blocks step by step."""
        cache = node.cache
        if cache is None or not node.role.prefills:
            return
        chain = self.requests[seq.index].block_hashes
        n = min(seq.computed // self.block, cache.kept(len(chain)))
        if n <= seq.stored:
            return
        part = chain[seq.stored : n]
        seq.stored = n
        held = self.room.get(seq.index, 0)
        stored, give = cache.store_held(part, held)
        if give:
            self.room[seq.index] = held - give
        # more new blocks than the room held: over the capacity, the oldest others go
        evicted = cache.trim(len(part)) if len(stored) > give else []
        self.publish(t, node, stored, evicted)

    def on_first_token(self, t: float, node: Engine, seq: Seq) -> None:
        """The prefill of ``seq``'s prompt ended on ``node`` at ``t``."""
        req = self.requests[seq.index]
        rec = self.records[seq.index]
        # the engine reports the compute it spent on this prefill and the tokens it reused
        cached = rec.local_tokens + rec.fetched_tokens
        done = PrefillFinished(req.request_id, node.iid, t, rec.prefill_compute_s, cached)
        if self.cfg.report_latency_s > 0:
            rec.first_token_lag_s = self.cfg.report_latency_s
            self.push(t + self.cfg.report_latency_s, Reported(done))
        else:
            self.scheduler.on_event(done)
            self.release(t)
        rec.prefill_end_s = t
        self.store_blocks(t, node, req.block_hashes, seq.index)
        if seq.decodes:  # role=both: it decodes where it was prefilled
            rec.decode_join_s = t
            return
        start = rec.prefill_start_s if rec.prefill_start_s is not None else t
        self.hand_off(t, node, seq, t - start)

    def on_stage_done(self, t: float, node: Engine, seq: Seq) -> None:
        """A chunked-pipeline stage ended; the last one ends the prefill on the lead."""
        assert seq.group is not None and seq.plan is not None
        req = self.requests[seq.index]
        rec = self.records[seq.index]
        self.scheduler.on_event(PrefillFinished(req.request_id, node.iid, t))
        group = seq.group
        group.remaining -= 1
        rec.prefill_compute_s += group.compute_s
        if group.remaining > 0:
            return
        lead = self.nodes[seq.plan.prefill]
        rec.prefill_end_s = t
        self.store_blocks(t, lead, req.block_hashes, seq.index)
        self.hand_off(t, lead, seq, group.compute_s)
        if lead is not node:
            self.loop.kick(t, lead)

    def hand_off(self, t: float, node: Engine, seq: Seq, overlap_s: float) -> None:
        """Send ``seq``'s KV from ``node`` to its decode engine, over ``node``'s egress and
        the decode engine's ingress. With ``handoff="stream"`` the transfer streams layer by
        layer during the prefill (it may have started ``overlap_s`` before ``t``); with
        ``"serial"`` it starts at ``t``."""
        assert seq.plan is not None
        i = seq.index
        req = self.requests[i]
        rec = self.records[i]
        decode_iid = seq.plan.decode
        if self.baseline:
            d = self.scheduler.confirm_decode(req.request_id, t)
            if isinstance(d, Rejection):
                rec.rejected = d.code
                rec.rejected_after_prefill = True
                return
            decode_iid = d
        rec.decode = decode_iid
        dst = self.engines[decode_iid]
        if dst is node:
            self.push(t, DecodeJoin(decode_iid, i))
            return
        rec.decode_emits_first = self.cfg.first_token == "decode"
        if self.cfg.handoff == "load":  # the decode engine reads it in its step
            self.push(t, DecodeJoin(decode_iid, i))
            return
        if self.cfg.handoff == "serial":
            overlap_s = 0.0
        held = held_tokens(dst, req.block_hashes, self.block, req.prompt_tokens)
        rec.handoff_held_tokens = held
        seconds = self.cost.transfer_s(req.prompt_tokens - held)
        end = transfer(node, dst, t - overlap_s, seconds)
        self.push(end if end > t else t, DecodeJoin(decode_iid, i))
