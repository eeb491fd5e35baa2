"""The decode side: continuous batching on simulated decode instances, and the TBT of each
request computed afterwards from its instance's log of iteration end times.

One event per batch iteration; per-request work happens only when a request joins or
leaves a batch.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from conductor.core.events import DecodeStepsObserved, RequestFinished
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceSpec
from conductor.core.types import InstanceId, Request, Role
from conductor.sim.config import SimConfig
from conductor.sim.events import DecodeStep, EventQueue
from conductor.sim.nodes import DecodeNode
from conductor.sim.perturb import EngineCost
from conductor.sim.records import RequestRecord, tail_mean_tbt

REPORT_EVERY_STEPS = 32
"""A decode node reports its iteration statistics (``DecodeStepsObserved``) this often."""


class DecodeSide:
    """The decode instances ``decode-0`` .. ``decode-{n-1}``, registered with the scheduler
    in that order.

    A request joins its node's batch when its whole KV (prompt + output) fits and the batch
    has room, FCFS; a node with an empty batch admits the head request whatever its size.
    It leaves after ``output_tokens - 1`` iterations. ``placed[i] = (node, join, last)``:
    request ``i`` ran iterations ``join`` .. ``last`` of ``node``."""

    def __init__(
        self,
        cfg: SimConfig,
        scheduler: Scheduler,
        requests: Sequence[Request],
        records: list[RequestRecord],
        events: EventQueue,
    ) -> None:
        self.engine_cost = EngineCost.of(cfg)  # the engines' own timing (perturbed model)
        self.step_s = cfg.cost.decode.step_s  # the nominal step, used when the engines are exact
        self.job_factor: dict[int, float] = {}  # request index -> its engine factor
        self.factor_sum: dict[InstanceId, float] = {}  # per node: its batch's factors summed
        # per node: [iterations, busy seconds, batch sum, context sum] since its last report
        self.window: dict[InstanceId, list[float]] = {}
        self.scheduler = scheduler
        self.requests = requests
        self.records = records
        self.push = events.push
        self.nodes: dict[InstanceId, DecodeNode] = {}
        self.steps: dict[InstanceId, DecodeStep] = {}
        self.placed: dict[int, tuple[DecodeNode, int, int]] = {}
        for i in range(cfg.n_decode):
            iid = InstanceId(f"decode-{i}")
            scheduler.add_instance(InstanceSpec(iid, Role.DECODE))
            node = DecodeNode(iid, cfg.cost.kv_capacity_tokens, cfg.cost.max_batch_size)
            self.nodes[iid] = node
            self.steps[iid] = DecodeStep(node)
            self.factor_sum[iid] = 0.0
            self.window[iid] = [0, 0.0, 0, 0]

    def on_join(self, t: float, decode: InstanceId, i: int) -> None:
        node = self.nodes[decode]
        rec = self.records[i]
        rec.decode_join_s = t
        if rec.output_tokens <= 1:
            rec.finish_s = t
            rec.tbt_s = 0.0
            self.scheduler.on_event(
                RequestFinished(self.requests[i].request_id, node.iid, t, rec.output_tokens)
            )
            return
        node.waiting.append(i)
        if not node.stepping:
            self.start_step(t, node, self.steps[decode])

    def start_step(self, t: float, node: DecodeNode, step: DecodeStep) -> None:
        """Admit what fits from ``node``'s waiting line and start its next iteration, whose
        end is ``step`` (the node's one step event)."""
        waiting = node.waiting
        exact = self.engine_cost.exact
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
            self.placed[i] = (node, join, last)
            node.batch += 1
            node.kv_used += need
            node.context_tokens += rec.prompt_tokens + 1
            if not exact:
                f = self.engine_cost.job_factor(self.requests[i].request_id)
                self.job_factor[i] = f
                self.factor_sum[node.iid] += f
        if node.batch == 0:
            node.stepping = False
            return
        node.stepping = True
        if exact:
            d = self.step_s(node.batch, node.context_tokens)
        else:
            fsum = self.factor_sum[node.iid]
            d = self.engine_cost.decode_step_s(node.batch, node.context_tokens, fsum)
        w = self.window[node.iid]
        w[0] += 1
        w[1] += d
        w[2] += node.batch
        w[3] += node.context_tokens
        if w[0] >= REPORT_EVERY_STEPS:
            n, busy, b, c = w
            w[:] = [0, 0.0, 0, 0]
            obs = DecodeStepsObserved(node.iid, int(n), busy, int(b), int(c), t)
            self.scheduler.on_event(obs)
        self.push(t + d, step)

    def on_step_end(self, t: float, step: DecodeStep) -> None:
        node = step.node
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
            f = self.job_factor.pop(i, None)
            if f is not None:
                self.factor_sum[node.iid] -= f
            self.scheduler.on_event(
                RequestFinished(self.requests[i].request_id, node.iid, t, rec.output_tokens)
            )
        self.start_step(t, node, step)

    def finish_tbt(self) -> None:
        """Set every placed request's ``tbt_s`` from its node's iteration log."""
        ends = {iid: np.asarray(n.step_ends) for iid, n in self.nodes.items()}
        diffs = {iid: np.diff(a) for iid, a in ends.items()}
        for i, (node, join, last) in self.placed.items():
            rec = self.records[i]
            if rec.prefill_end_s is None:
                continue
            e = ends[node.iid]
            first = e[join] - rec.prefill_end_s
            intervals = np.concatenate(([first], diffs[node.iid][join:last]))
            rec.tbt_s = tail_mean_tbt(intervals)
