"""Canonical events the core consumes.

KV events (what a holder caches) come from engines' KV-event streams (gateway) or from the
simulator's cache model. Lifecycle events (prefill done, request finished, instance up or
down) come from whoever executes the plans. All are immutable dataclasses with ``slots``
(``Final`` fields; tests/core/test_hot_values.py says why they write ``__init__`` by hand).
``seq`` is the publisher's sequence number when known (gap detection lives in the shells).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from conductor.core.types import BlockHash, InstanceId, RequestId, Tier


@dataclass(slots=True, init=False, unsafe_hash=True)
class _BlockChange:
    """A change to what ``holder`` caches: ``block_hashes`` (a chain, in prefix order) in
    ``tier``. Compared by class too: a store never equals a removal of the same blocks."""

    holder: Final[InstanceId]
    block_hashes: Final[tuple[BlockHash, ...]]
    tier: Final[Tier]
    seq: Final[int | None]

    def __init__(
        self,
        holder: InstanceId,
        block_hashes: tuple[BlockHash, ...],
        tier: Tier = Tier.GPU,
        seq: int | None = None,
    ) -> None:
        self.holder = holder
        self.block_hashes = block_hashes
        self.tier = tier
        self.seq = seq


@dataclass(slots=True, init=False, unsafe_hash=True)
class BlocksStored(_BlockChange):
    """``holder`` now caches ``block_hashes`` (a chain, in prefix order) in ``tier``."""


@dataclass(slots=True, init=False, unsafe_hash=True)
class BlocksRemoved(_BlockChange):
    """``holder`` evicted ``block_hashes`` from ``tier``."""


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """``holder`` dropped every block (of ``tier``, or of all tiers when ``tier`` is None)."""

    holder: InstanceId
    tier: Tier | None = None
    seq: int | None = None


@dataclass(frozen=True, slots=True)
class InstanceGone:
    """``holder`` died or was removed: its blocks leave the index and its load is dropped."""

    holder: InstanceId


@dataclass(slots=True, init=False, unsafe_hash=True)
class PrefillFinished:
    """The prefill of ``request_id`` ended on ``instance`` at ``now_s`` (first token out).
    ``duration_s`` (its compute time) and ``cached_tokens`` (the prompt tokens it reused), when
    the engine reports them, let the scheduler correct its prefill model
    (:mod:`conductor.core.correction`)."""

    request_id: Final[RequestId]
    instance: Final[InstanceId]
    now_s: Final[float]
    duration_s: Final[float | None]
    cached_tokens: Final[int | None]

    def __init__(
        self,
        request_id: RequestId,
        instance: InstanceId,
        now_s: float,
        duration_s: float | None = None,
        cached_tokens: int | None = None,
    ) -> None:
        self.request_id = request_id
        self.instance = instance
        self.now_s = now_s
        self.duration_s = duration_s
        self.cached_tokens = cached_tokens


@dataclass(slots=True, init=False, unsafe_hash=True)
class RequestFinished:
    """``request_id`` left its decode instance (completed, aborted or failed) after
    generating ``output_tokens`` (None: not known); the output-length predictor learns from
    it."""

    request_id: Final[RequestId]
    instance: Final[InstanceId]
    now_s: Final[float]
    output_tokens: Final[int | None]

    def __init__(
        self,
        request_id: RequestId,
        instance: InstanceId,
        now_s: float,
        output_tokens: int | None = None,
    ) -> None:
        self.request_id = request_id
        self.instance = instance
        self.now_s = now_s
        self.output_tokens = output_tokens


@dataclass(frozen=True, slots=True)
class DecodeProgress:
    """``request_id`` on ``instance`` has produced ``generated_tokens`` so far (optional)."""

    request_id: RequestId
    instance: InstanceId
    generated_tokens: int
    now_s: float


@dataclass(slots=True, init=False, unsafe_hash=True)
class DecodeStepsObserved:
    """``instance`` ran ``steps`` decode iterations taking ``busy_s`` seconds in all, with
    ``batch_sum`` requests and ``context_sum`` context tokens summed over those iterations
    (an engine's iteration statistics; the decode-side input of the cost correction)."""

    instance: Final[InstanceId]
    steps: Final[int]
    busy_s: Final[float]
    batch_sum: Final[int]
    context_sum: Final[int]
    now_s: Final[float]

    def __init__(
        self,
        instance: InstanceId,
        steps: int,
        busy_s: float,
        batch_sum: int,
        context_sum: int,
        now_s: float,
    ) -> None:
        self.instance = instance
        self.steps = steps
        self.busy_s = busy_s
        self.batch_sum = batch_sum
        self.context_sum = context_sum
        self.now_s = now_s


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What ``instance`` reports about itself at ``now_s``: ``running`` and ``waiting``
    requests and the fraction ``kv_usage`` of its KV cache in use (vLLM's ``/metrics``)."""

    instance: InstanceId
    running: int
    waiting: int
    kv_usage: float
    now_s: float


KvEvent = BlocksStored | BlocksRemoved | AllBlocksCleared | InstanceGone
LifecycleEvent = PrefillFinished | RequestFinished | DecodeProgress
ObservedEvent = DecodeStepsObserved | EngineLoad
Event = KvEvent | LifecycleEvent | ObservedEvent
