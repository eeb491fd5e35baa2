"""``preble`` — Preble's E2 (exploit + explore) global scheduling, as a baseline.

Sources: Preble (ICLR'25, arXiv 2407.00023) and WukLab/preble
``multi_node/global_scheduler_with_time.py`` (``runtime_selector``,
``SlidingWindowHistogram``, ``handle_important_node_stealing``); summarised in
``reference/simulation-and-cost-models.md`` §4.2. Our own code, written from those
descriptions.

Per prefill instance ``i`` at time ``now``, with a window ``W`` (3 minutes)::

    prefill_load_i = Σ predicted prefill seconds of the requests routed to i in (now - W, now]
    decode_load_i  = batch_i × mean_output_tokens × decode_step_s(batch_i, context_i)
    load_i         = prefill_load_i + decode_load_i

    L = the longest local prefix (tokens) any prefill instance holds
    if L > prompt_tokens - L:   exploit: among the instances holding L, the min load_i
    else:                       explore: the min load_i over all instances
    rebalance: once R requests have been routed, if load(pick) > H × min(load),
               send the request to the min-load instance instead

Ties: pool order (Preble uses ``np.argmin``). Parameters (``SchedulerConfig.policy_params``):
``preble_window_s`` 180 (Preble's 3-minute window), ``preble_high_load_ratio`` H = 1.5 (the
paper's threshold; one code version sets ``HIGH_LOAD_THRESHOLD = 15`` with the call
commented out), ``preble_rebalance_after_requests`` R = 50 (Preble's
``sum(per_gpu_load) < 50`` warm-up guard).

State: the policy object lives as long as its Scheduler and keeps, per instance id, the
``(time, predicted prefill seconds)`` of the requests it routed, plus ``(time, predicted
output tokens)`` of all of them, expiring entries older than ``now - W`` at each call (times
are assumed non-decreasing, as in the simulator and the gateway).

Simplifications, honestly:

* *Miss-rate weighting.* Preble sums, over prefix-tree nodes in the window,
  ``miss_rate × request_count × prefill_time(node) / #GPUs holding the node``. We record per
  request the predicted prefill time of its *uncached* tokens on the instance it went to
  (``PrefillChoice.prefill_s``): the miss rate realised per request rather than estimated per
  node, and charged wholly to the instance that ran it.
* *Decode.* Preble uses ``active requests × mean output length of the node × measured
  TPOT``; we use the instance's decode batch, the mean predicted output of the requests
  routed in the window (this request's when none) and the cost model's predicted step time.
  A pure prefill instance of a disaggregated cluster has no decode batch, so its decode load
  is 0.
* *Exploit set.* Preble exploits among the GPUs its tree *allocated* the prefix to; we use
  the instances that hold the longest local (GPU + DRAM) prefix in the precise index.
* *Rebalancing.* Preble moves whole prefix subtrees from the most to the least loaded GPU
  after an assignment (and replicates a hot prefix when its TTFT doubles over the window);
  we apply the ratio test to each request's pick — the form that redirects the requests the
  subtree move would redirect — and do not model the TTFT-overload replication.
* *Not modelled:* the optional eviction cost (off by default in Preble's code), the
  per-request recomputation cost (zero in the code version read), the local scheduler's
  priority groups. A request rejected by admission after the choice still counts in the
  window (the policy does not see the admission outcome). Decode placement: the
  Scheduler's default.
"""

from __future__ import annotations

from collections import deque
from typing import ClassVar

from conductor.core.policies.base import PrefillChoice, SchedulingContext
from conductor.core.policies.registry import register
from conductor.core.policies.selection import param
from conductor.core.state import InstanceState
from conductor.core.types import InstanceId

DEFAULTS: dict[str, float] = {
    "preble_window_s": 180.0,
    "preble_high_load_ratio": 1.5,
    "preble_rebalance_after_requests": 50.0,
}


class _Window:
    """``(time, value)`` entries in arrival order with their running sum."""

    __slots__ = ("entries", "total")

    def __init__(self) -> None:
        self.entries: deque[tuple[float, float]] = deque()
        self.total = 0.0

    def add(self, t: float, value: float) -> None:
        self.entries.append((t, value))
        self.total += value

    def expire(self, before: float) -> None:
        e = self.entries
        while e and e[0][0] < before:
            self.total -= e.popleft()[1]
        if not e:
            self.total = 0.0  # no float residue once empty


@register
class PreblePolicy:
    name: ClassVar[str] = "preble"

    def __init__(self) -> None:
        self._prefill: dict[InstanceId, _Window] = {}
        self._outputs = _Window()
        self.routed = 0

    def _expire(self, ctx: SchedulingContext) -> None:
        before = ctx.now_s - param(ctx, DEFAULTS, "preble_window_s")
        for w in self._prefill.values():
            w.expire(before)
        self._outputs.expire(before)

    def mean_output_tokens(self, ctx: SchedulingContext) -> float:
        n = len(self._outputs.entries)
        return self._outputs.total / n if n else ctx.output.mean

    def load(self, ctx: SchedulingContext, inst: InstanceState) -> float:
        """Preble's load cost of ``inst`` (seconds); call after expiring the window."""
        w = self._prefill.get(inst.spec.instance_id)
        prefill = w.total if w is not None else 0.0
        d = inst.decode
        if d.batch_size == 0:
            return prefill
        step = ctx.cost.decode_step_s(d.batch_size, d.context_tokens)
        return prefill + d.batch_size * self.mean_output_tokens(ctx) * step

    def loads(self, ctx: SchedulingContext) -> list[float]:
        """Every prefill instance's load cost at ``ctx.now_s``, in pool order."""
        self._expire(ctx)
        return [self.load(ctx, i) for i in ctx.prefill_pool]

    def choose_prefill(self, ctx: SchedulingContext) -> PrefillChoice:
        pool = ctx.prefill_pool
        loads = self.loads(ctx)
        lightest = loads.index(min(loads))
        local = [ctx.local_tokens(i) for i in pool]
        longest = max(local)
        if longest > ctx.request.prompt_tokens - longest:  # exploit
            holders = [k for k, t in enumerate(local) if t == longest]
            pick = min(holders, key=lambda k: loads[k])
        else:  # explore
            pick = lightest
        after = param(ctx, DEFAULTS, "preble_rebalance_after_requests")
        ratio = param(ctx, DEFAULTS, "preble_high_load_ratio")
        if self.routed >= after and loads[pick] > ratio * loads[lightest]:
            pick = lightest
        choice = ctx.local_choice(pool[pick])
        self._prefill.setdefault(choice.instance, _Window()).add(ctx.now_s, choice.prefill_s)
        self._outputs.add(ctx.now_s, ctx.output.mean)
        self.routed += 1
        return choice
