"""The state of simulated instances: prefill nodes and their jobs, decode nodes."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from conductor.core.plan import Plan
from conductor.core.types import InstanceId, Request
from conductor.sim.cache import LruBlockCache


@dataclass(slots=True)
class CppGroup:
    """The nodes of one chunked-pipeline prefill: ``remaining`` stages still running, each
    for ``compute_s`` (the whole pipelined time)."""

    remaining: int
    compute_s: float


@dataclass(slots=True)
class Job:
    """One request's prefill on one node: the lead stage (keeps the KV blocks) or, with
    ``helper``, a chunked-pipeline stage on another node of ``group``.

    A job with ``fetch_pending`` waits at the head of its node's queue until its remote
    blocks arrive."""

    index: int
    request: Request
    plan: Plan
    fetch_pending: bool = False
    compute_s: float = 0.0
    group: CppGroup | None = None
    helper: bool = False


@dataclass(slots=True)
class PrefillNode:
    """A prefill instance: FCFS ``queue`` (one job runs at a time, ``busy``), its LRU KV
    ``cache`` and its NIC, which sends one transfer at a time (free from ``nic_free_s``)."""

    iid: InstanceId
    cache: LruBlockCache
    queue: deque[Job] = field(default_factory=deque)
    busy: bool = False
    nic_free_s: float = 0.0

    def send(self, t: float, seconds: float) -> float:
        """Queue a transfer of ``seconds`` on this node's NIC at ``t``; returns its end."""
        end = max(t, self.nic_free_s) + seconds
        self.nic_free_s = end
        return end


@dataclass(slots=True)
class DecodeNode:
    """A decode instance under continuous batching.

    ``batch`` requests run, holding ``kv_used`` tokens of KV and ``context_tokens`` of
    context; ``waiting`` holds request indices that do not fit yet. ``step_ends`` logs
    every batch iteration's end; ``finish_heap`` holds ``(last iteration, request)``.
    ``stepping``: an iteration is in flight (at most one at a time)."""

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
