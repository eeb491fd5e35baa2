"""Chunked pipeline parallelism (CPP) for long prompts (arXiv §5.1, FAST §3.3).

A group of ``X`` prefill nodes splits the model's layers into ``X`` pipeline stages; the
prompt's uncached tokens are cut into chunks of at most ``prefill_chunk_tokens``. Chunk ``j``
runs on stage ``s`` once chunk ``j`` left stage ``s-1`` and chunk ``j-1`` left stage ``s``::

    end[j][s] = max(end[j-1][s], end[j][s-1]) + T_j / X + handoff_j * (s > 0)

``T_j`` is the single-node prefill time of chunk ``j`` given everything before it as context
(the cost model's ``prefill(prefix + c_j, prefix) - overhead``), so the attention cost of late
chunks is counted. ``handoff_j`` moves chunk ``j``'s activations (``c_j * hidden * bytes``)
across a stage boundary over the slower NIC of the pair; it overlaps with the compute of the
next chunk, which the recurrence captures.

Node choice: the lead (the best single-node candidate) plus the least-loaded other prefill
nodes, same rack first (network topology: cross-rack hand-offs use ``cross_rack_factor`` of
the bandwidth).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import CostModel
from conductor.core.policies.base import PrefillChoice, SchedulingContext
from conductor.core.state import InstanceState
from conductor.core.types import InstanceId


@dataclass(frozen=True, slots=True)
class PipelinePlan:
    nodes: tuple[InstanceId, ...]
    chunk_tokens: tuple[int, ...]
    queue_s: float
    prefill_s: float


def split_chunks(new_tokens: int, prefill_chunk_tokens: int) -> list[int]:
    """Near-equal chunks, each at most ``prefill_chunk_tokens``."""
    n = max(1, math.ceil(new_tokens / prefill_chunk_tokens))
    base, extra = divmod(new_tokens, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def pipelined_prefill_s(
    cost: CostModel,
    prompt_tokens: int,
    cached_tokens: int,
    chunks: Sequence[int],
    stages: int,
    handoff_bytes_per_s: float,
) -> float:
    """Predicted prefill time of a CPP group of ``stages`` nodes (see module docstring)."""
    overhead = cost.prefill_s(2, 1)  # the per-request fixed cost, paid once
    per_token_bytes = cost.model.hidden * cost.model.bytes_per_elem
    done = min(cached_tokens, prompt_tokens - 1)
    prev = [0.0] * stages
    for c in chunks:
        t_chunk = max(0.0, cost.prefill_s(done + c, done) - overhead) / stages
        hand = c * per_token_bytes / handoff_bytes_per_s
        cur = [0.0] * stages
        for s in range(stages):
            ready = cur[s - 1] + hand if s > 0 else 0.0
            cur[s] = max(prev[s], ready) + t_chunk
        prev = cur
        done += c
    return prev[-1] + overhead


def choose_group(
    lead: InstanceState, pool: Sequence[InstanceState], size: int, now_s: float
) -> list[InstanceState]:
    """``lead`` plus the ``size - 1`` least-loaded others, same rack first."""
    others = [i for i in pool if i is not lead]
    others.sort(
        key=lambda i: (i.spec.rack != lead.spec.rack, i.prefill.queue_s(now_s), i.spec.instance_id)
    )
    return [lead, *others[: size - 1]]


def plan_pipeline(
    cost: CostModel,
    lead: InstanceState,
    pool: Sequence[InstanceState],
    *,
    prompt_tokens: int,
    cached_tokens: int,
    now_s: float,
    prefill_chunk_tokens: int,
    max_nodes: int,
    max_helper_queue_s: float = float("inf"),
    cross_rack_factor: float = 0.5,
) -> PipelinePlan | None:
    """The CPP plan with the smallest predicted queue + prefill time over group sizes
    2..``max_nodes``, or None when the pool is too small or the prompt fits one chunk.

    Only nodes whose queue is at most ``max_helper_queue_s`` may join as helpers: a CPP
    group spends more node-time than one node would (pipeline bubbles), which is worth it
    on idle nodes and harmful on busy ones, where it delays everything queued behind."""
    new = prompt_tokens - min(cached_tokens, prompt_tokens - 1)
    chunks = split_chunks(new, prefill_chunk_tokens)
    pool = [i for i in pool if i is lead or i.prefill.queue_s(now_s) <= max_helper_queue_s]
    if len(chunks) < 2 or len(pool) < 2:
        return None
    best: PipelinePlan | None = None
    nic = lead.spec.nic_bytes_per_s or cost.transfer_bytes_per_s
    for size in range(2, min(max_nodes, len(pool)) + 1):
        group = choose_group(lead, pool, size, now_s)
        cross = any(g.spec.rack != lead.spec.rack for g in group)
        bw = nic * (cross_rack_factor if cross else 1.0)
        prefill = pipelined_prefill_s(cost, prompt_tokens, cached_tokens, chunks, size, bw)
        queue = max(g.prefill.queue_s(now_s) for g in group)
        plan = PipelinePlan(tuple(g.spec.instance_id for g in group), tuple(chunks), queue, prefill)
        if best is None or queue + prefill < best.queue_s + best.prefill_s:
            best = plan
    return best


def pipeline_if_faster(
    cost: CostModel,
    config: SchedulerConfig,
    lead: InstanceState,
    ctx: SchedulingContext,
    pre: PrefillChoice,
) -> PipelinePlan | None:
    """The pipelined plan led by ``lead`` (the best single-node choice ``pre``) when the
    prompt itself, not the queue, is what misses the SLO (CPP spends more node-time than one
    node would, so it must not be a cure for overload) and it predicts a lower TTFT."""
    slo = ctx.ttft_slo_s
    if pre.prefill_s + pre.transfer_s <= config.cpp_trigger_fraction * slo:
        return None
    cpp = plan_pipeline(
        cost,
        lead,
        ctx.prefill_pool,
        prompt_tokens=ctx.request.prompt_tokens,
        cached_tokens=pre.cached_tokens,
        now_s=ctx.now_s,
        prefill_chunk_tokens=config.prefill_chunk_tokens,
        max_nodes=config.cpp_max_nodes,
        max_helper_queue_s=config.cpp_helper_queue_fraction * slo,
    )
    if cpp is None or cpp.queue_s + cpp.prefill_s >= pre.queue_s + pre.prefill_s:
        return None
    return cpp
