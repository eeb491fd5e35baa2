"""The facade shells use: :class:`Scheduler` — ``schedule()``, ``on_event()`` and instance
membership. Pure: time comes in as ``now_s``, randomness from a seeded ``random.Random``.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import cast

from conductor.core.admission import check_early, check_predictive, check_reserve, check_ttft
from conductor.core.chunked_pipeline import PipelinePlan, pipeline_if_faster
from conductor.core.config import SchedulerConfig
from conductor.core.correction import CostCorrection
from conductor.core.costmodel import CostModel
from conductor.core.decode_holdings import DecodeHoldings
from conductor.core.errors import InvalidInput, UnknownInstance
from conductor.core.events import (
    AllBlocksCleared,
    BlocksRemoved,
    BlocksStored,
    DecodeProgress,
    Event,
    InstanceGone,
    PrefillFinished,
    RequestFinished,
)
from conductor.core.eviction_regret import EvictionRegret
from conductor.core.forecast import DecodeForecast
from conductor.core.hotspot import HotspotTracker
from conductor.core.inflight import InFlight
from conductor.core.nic import NicBook
from conductor.core.output_length import OutputLengthModel, length_model, output_cap
from conductor.core.plan import Decision, Fetch, Migration, Plan, Prepared, Rejection
from conductor.core.policies import (
    DecodePolicy,
    PrefillChoice,
    SchedulingContext,
    make_policy,
)
from conductor.core.policies.colocated import colocated_stall_s
from conductor.core.policies.decode import LeastTbtDecode
from conductor.core.policies.join_stalls import load_stall_s
from conductor.core.policies.registry import DEFAULT_POLICY
from conductor.core.prefix_index import PrefixIndex
from conductor.core.state import InstanceSpec, InstanceState
from conductor.core.types import BlockHash, InstanceId, Request, RequestId, Role


class Scheduler:
    """Global scheduler: picks (prefill, decode) per request or rejects it.

    Invariants: every in-flight request's prefill instance has it queued until
    :class:`PrefillFinished`; its decode instance holds its KV reservation until
    :class:`RequestFinished`; an instance removed takes its bookkeeping and blocks along.
    Output lengths are never given: ``output_lengths`` (default: a
    :class:`~conductor.core.output_length.LengthHistogram` with the config's prior) predicts
    them and learns from ``RequestFinished.output_tokens``.
    """

    def __init__(
        self,
        cost: CostModel,
        *,
        policy: str = DEFAULT_POLICY,
        config: SchedulerConfig | None = None,
        decode_policy: DecodePolicy | None = None,
        output_lengths: OutputLengthModel | None = None,
    ) -> None:
        self.cost = cost  # what predictions use: the nominal model, corrected online
        self.config = config or SchedulerConfig()
        self.correction = CostCorrection(cost, enabled=self.config.cost_correction)
        self.policy_name = policy
        self.policy = make_policy(policy)
        if decode_policy is None and hasattr(self.policy, "choose_decode"):
            decode_policy = cast(DecodePolicy, self.policy)  # the policy brings its own
        self.decode_policy: DecodePolicy = decode_policy or LeastTbtDecode()
        self.index = PrefixIndex()
        self.decode_index = DecodeHoldings()  # decode-only instances' caches: no fetch source
        self.regret = EvictionRegret()  # how often an evicted block is asked for again
        self.instances: dict[InstanceId, InstanceState] = {}
        self._inflight: dict[RequestId, InFlight] = {}
        self._rng = random.Random(self.config.seed)
        self._rr = 0
        self._pools: tuple[list[InstanceState], list[InstanceState]] | None = None
        self.lengths: OutputLengthModel = output_lengths or length_model(self.config)
        self.forecast = DecodeForecast(self.config.tbt_slo_s)
        self.hotspots = HotspotTracker() if self.config.replication_enabled else None
        self.nic = NicBook()

    # -- membership ----------------------------------------------------------------------
    def add_instance(self, spec: InstanceSpec) -> None:
        if spec.instance_id in self.instances:
            raise InvalidInput("instance_id", spec.instance_id, "already registered")
        self.instances[spec.instance_id] = InstanceState(spec)
        self.index.add_holder(spec.instance_id)
        if spec.role is Role.DECODE:
            self.decode_index.add_holder(spec.instance_id)
        self._pools = None

    def add_store_node(self, holder: InstanceId) -> None:
        """A node of the shared KV pool: it holds blocks but runs no requests."""
        self.index.add_holder(holder)

    def remove_instance(self, instance: InstanceId) -> list[RequestId]:
        """Forget ``instance``; returns the in-flight requests that were placed on it."""
        if instance not in self.instances and instance not in self.index:
            raise UnknownInstance(instance)
        self.instances.pop(instance, None)
        if instance in self.index:
            self.index.remove_holder(instance)
        self.decode_index.remove_holder(instance)  # a no-op unless decode-only
        self._pools = None
        lost = [
            rid
            for rid, f in self._inflight.items()
            if f.prefill == instance or f.decode == instance or instance in f.cpp_nodes
        ]
        for rid in lost:
            self._forget(rid)
        return lost

    def set_health(self, instance: InstanceId, *, healthy: bool) -> None:
        self._state(instance).healthy = healthy
        self._pools = None

    def set_draining(self, instance: InstanceId, *, draining: bool) -> None:
        self._state(instance).draining = draining
        self._pools = None

    def _state(self, instance: InstanceId) -> InstanceState:
        try:
            return self.instances[instance]
        except KeyError:
            raise UnknownInstance(instance) from None

    def pools(self) -> tuple[list[InstanceState], list[InstanceState]]:
        if self._pools is None:
            states = [s for s in self.instances.values() if s.schedulable]
            self._pools = (
                [s for s in states if s.spec.role.prefills],
                [s for s in states if s.spec.role.decodes],
            )
        return self._pools

    # -- events --------------------------------------------------------------------------
    def on_event(self, event: Event) -> None:
        # most events: the index alone (two plain isinstance checks and direct calls, not
        # a union type and a bound method: KV-event ingest 5-7% faster)
        if isinstance(event, BlocksStored):
            index = self.decode_index if event.holder in self.decode_index else self.index
            index.store(event.holder, event.block_hashes, event.tier)
            return
        if isinstance(event, BlocksRemoved):
            index = self.decode_index if event.holder in self.decode_index else self.index
            index.remove(event.holder, event.block_hashes, event.tier)
            if index is self.index:
                self.regret.on_removed(event.block_hashes)
            return
        consumed = self.correction.observe(event, self.instances, self._inflight.get)
        self.cost = self.correction.cost
        if consumed:  # an engine's timing or load report (conductor.core.correction)
            return
        match event:
            case AllBlocksCleared(holder, tier, _):
                index = self.decode_index if holder in self.decode_index else self.index
                index.clear(holder, tier)
            case InstanceGone(holder):
                self.remove_instance(holder)
            case PrefillFinished(rid, inst, now):
                self._state(inst).prefill.finish(rid, now)
                self.nic.handoff_now(rid, now)
                self.forecast.started(rid, now)
                f = self._inflight.get(rid)
                if f is not None:
                    f.prefill_done = True
                    d = self.instances.get(f.decode) if f.decode is not None else None
                    if d is not None:
                        d.decode.start(rid)
                        d.decode.record_join(now, f.stall_s)
            case RequestFinished(rid, inst, now, out):
                self._state(inst).decode.release(rid)
                self.nic.cancel(rid, now)
                self.forecast.finished(rid, now, out)
                self._inflight.pop(rid, None)
                if out is not None:
                    self.lengths.observe(rid, out)
            case DecodeProgress(rid, inst, generated, _):
                f = self._inflight.get(rid)
                cap = f.output.cap if f is not None else self.config.context_tokens
                expected = generated + self.lengths.remaining(rid, generated, cap)
                self._state(inst).decode.progress(rid, generated, int(expected))
            case _:
                raise InvalidInput("event", event, "not a conductor event")

    def prefilling_requests(self) -> Iterator[Sequence[BlockHash]]:
        """The prompts (block hashes) of the placed requests whose prefill has not ended."""
        return (f.request.block_hashes for f in self._inflight.values() if not f.prefill_done)

    def on_events(self, events: Iterable[Event]) -> None:
        for e in events:
            self.on_event(e)

    def _forget(self, rid: RequestId) -> None:
        f = self._inflight.pop(rid, None)
        self.forecast.remove(rid)
        if f is None:
            return
        for node in f.cpp_nodes or (f.prefill,):
            p = self.instances.get(node)
            if p is not None and not f.prefill_done:
                p.prefill.drop(rid)
        if f.decode is not None:
            d = self.instances.get(f.decode)
            if d is not None:
                d.decode.release(rid)

    def cancel(self, rid: RequestId) -> None:
        """Drop a request's bookkeeping (client went away, or it failed)."""
        self._forget(rid)

    # -- scheduling ----------------------------------------------------------------------
    def validate(self, request: Request) -> None:
        request.check(self.config.block_size_tokens)
        if request.request_id in self._inflight:
            raise InvalidInput("request_id", request.request_id, "already in flight")

    def context(self, request: Request, now_s: float) -> SchedulingContext | None:
        prefill_pool, decode_pool = self.pools()
        if not prefill_pool or not decode_pool:
            return None
        return SchedulingContext(
            request=request,
            now_s=now_s,
            match=self.index.match(request.block_hashes),
            prefill_pool=prefill_pool,
            decode_pool=decode_pool,
            cost=self.cost,
            config=self.config,
            rng=self._rng,
            round_robin_counter=self._rr,
            output=self.lengths.estimate(request, output_cap(request, self.config.context_tokens)),
            nic=self.nic,
            decode_index=self.decode_index,
            index=self.index,
            eviction_regret=self.regret.rate,
        )

    def schedule(self, request: Request, now_s: float) -> Decision:
        """Choose where ``request`` runs, or reject it; commits the choice to the state."""
        prepared = self.prepare(request, now_s)
        return prepared if isinstance(prepared, Rejection) else self.decide(prepared)

    def prepare(self, request: Request, now_s: float, *, cpp: bool = True) -> Prepared | Rejection:
        """The placement ``schedule`` would make now (prefill, CPP unless ``cpp`` is False,
        decode), neither admitted nor committed: a caller may look at it and drop it (late
        binding, :mod:`conductor.core.late_binding`) or hand it to :meth:`decide`
        unchanged, before anything else changes the state."""
        self.validate(request)
        ctx = self.context(request, now_s)
        if ctx is None:
            return Rejection(request.request_id, "no_instance", "no schedulable instance")
        pre = self.policy.choose_prefill(ctx)
        plan = (
            pipeline_if_faster(self.cost, self.config, self.instances[pre.instance], ctx, pre)
            if cpp and self.config.cpp_enabled
            else None
        )
        if plan is not None:
            pre = replace(pre, queue_s=plan.queue_s, prefill_s=plan.prefill_s)
        return Prepared(ctx, pre, self.decode_policy.choose_decode(ctx, pre), plan)

    def decide(self, prepared: Prepared) -> Decision:
        """Admission, then commit, of a placement from :meth:`prepare`."""
        ctx, pre, dec, cpp = prepared.ctx, prepared.pre, prepared.dec, prepared.cpp
        self._rr += 1
        self.regret.on_request(ctx.request.block_hashes)  # once per request
        mode = self.config.admission
        if mode != "off":
            rejection = check_ttft(ctx, pre, dec.tbt_s)
            if rejection is None and mode == "early":
                rejection = check_early(ctx, pre, dec)
            elif rejection is None and mode == "reserve":
                rejection = check_reserve(ctx, pre, dec)
            elif rejection is None and mode == "predictive":
                forecast = check_predictive(ctx, pre, self.forecast, self.lengths)
                if isinstance(forecast, Rejection):
                    rejection = forecast
                else:
                    dec = forecast  # admission and commit: the same decode instance
            if rejection is not None:
                return rejection
        return self._commit(ctx, pre, dec.instance, dec.tbt_s, cpp)

    def _commit(
        self,
        ctx: SchedulingContext,
        pre: PrefillChoice,
        decode: InstanceId,
        tbt_s: float,
        cpp: PipelinePlan | None = None,
    ) -> Plan:
        req = ctx.request
        new_tokens = req.prompt_tokens - pre.cached_tokens
        for node in cpp.nodes if cpp is not None else (pre.instance,):
            self.instances[node].prefill.assign(
                req.request_id, pre.prefill_s + pre.transfer_s, new_tokens, ctx.now_s
            )
        fetch: Fetch | None = None
        migrations: tuple[Migration, ...] = ()
        if pre.fetch_source is not None and pre.fetch_tokens > 0:
            bs = self.config.block_size_tokens
            first = pre.local_tokens // bs
            last = ctx.match.best_blocks
            hashes = tuple(req.block_hashes[first:last])
            fetch = Fetch(pre.fetch_source, pre.fetch_tokens, hashes)
            migrations = (Migration(pre.fetch_source, pre.instance, hashes),)
        transfers = self.nic.book_plan(ctx, pre, decode)
        deferred = self.config.admission == "baseline"
        stall_s = load_stall_s(ctx, pre.instance, decode)
        if not deferred:
            out, rid = ctx.output, req.request_id
            self.forecast.add(rid, decode, ctx.now_s + pre.ttft_s, req.prompt_tokens, out)
            self.instances[decode].decode.admit(
                rid, req.prompt_tokens, int(out.mean), stall_s=stall_s
            )
        if decode == pre.instance and cpp is None:
            inst = self.instances[decode]
            if inst.spec.role is Role.BOTH:  # its prefill stalls the decodes there
                inst.decode.record_join(ctx.now_s, colocated_stall_s(ctx, pre))
        self._inflight[req.request_id] = InFlight(
            req,
            pre.instance,
            None if deferred else decode,
            ctx.output,
            cpp.nodes if cpp else (),
            transfers=transfers,
            stall_s=stall_s,
        )
        if self.hotspots is not None:
            best = ctx.match.best_blocks
            if best:
                self.hotspots.record(req.block_hashes[:best], ctx.now_s)
            migrations += tuple(self.hotspots.plan(ctx.now_s, ctx.prefill_pool, self.index))
        return Plan(
            request_id=req.request_id,
            prefill=pre.instance,
            decode=decode,
            policy=self.policy_name,
            local_tokens=pre.local_tokens,
            fetch=fetch,
            predicted_ttft_s=pre.ttft_s,
            queue_s=pre.queue_s,
            transfer_s=pre.transfer_s,
            prefill_s=pre.prefill_s,
            predicted_tbt_s=tbt_s,
            migrations=migrations,
            cpp=cpp,
        )

    def confirm_decode(self, rid: RequestId, now_s: float) -> InstanceId | Rejection:
        """At the end of prefill, pick (again) the decode instance and check the TBT SLO
        against the load *now* — the local double-check of arXiv §3, and the decode-side
        check of the ``baseline`` admission. Reserves the KV on success; on rejection the
        request is forgotten (its prefill work is wasted)."""
        f = self._inflight.get(rid)
        if f is None:
            raise InvalidInput("request_id", rid, "not in flight")
        if f.decode is not None:
            return f.decode
        _, decode_pool = self.pools()
        ctx = self.context(f.request, now_s)
        if ctx is None or not decode_pool:
            self._forget(rid)
            return Rejection(rid, "no_instance", "no schedulable decode instance")
        dec = self.decode_policy.choose_decode(ctx, ctx.local_choice(self.instances[f.prefill]))
        if not dec.fits:
            self._forget(rid)
            tbt_slo = f.request.tbt_slo_s or self.config.tbt_slo_s
            code = "tbt_slo" if dec.tbt_s > tbt_slo else "kv_capacity"
            return Rejection(rid, code, f"decode check at prefill end: {code}", None, dec.tbt_s)
        req = f.request
        started = f.prefill_done
        self.instances[dec.instance].decode.admit(
            rid, req.prompt_tokens, int(f.output.mean), started=started
        )
        self.forecast.add(rid, dec.instance, now_s, req.prompt_tokens, f.output, started=started)
        f.decode = dec.instance
        return dec.instance

    def inflight(self) -> int:
        return len(self._inflight)
