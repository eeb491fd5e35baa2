"""What :meth:`Scheduler.schedule` returns: a :class:`Plan` or a :class:`Rejection`."""

from __future__ import annotations

from dataclasses import dataclass

from conductor.core.chunked_pipeline import PipelinePlan
from conductor.core.types import BlockHash, InstanceId, RequestId


@dataclass(frozen=True, slots=True)
class Fetch:
    """Blocks to pull over the network from ``source`` before (layer-wise: while) prefilling."""

    source: InstanceId
    tokens: int
    block_hashes: tuple[BlockHash, ...]


@dataclass(frozen=True, slots=True)
class Migration:
    """Hot-spot migration (Algorithm 1 lines 20-21): copy blocks to ``target``, making a
    replica there."""

    source: InstanceId
    target: InstanceId
    block_hashes: tuple[BlockHash, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    request_id: RequestId
    prefill: InstanceId
    decode: InstanceId
    policy: str
    local_tokens: int
    fetch: Fetch | None
    predicted_ttft_s: float
    queue_s: float
    transfer_s: float
    prefill_s: float
    predicted_tbt_s: float
    migrations: tuple[Migration, ...] = ()
    cpp: PipelinePlan | None = None
    """Chunked pipeline parallel prefill over ``cpp.nodes`` (``prefill`` is the lead)."""

    @property
    def cached_tokens(self) -> int:
        return self.local_tokens + (self.fetch.tokens if self.fetch else 0)


@dataclass(frozen=True, slots=True)
class Rejection:
    """``code``: ``ttft_slo``, ``tbt_slo``, ``kv_capacity`` or ``no_instance``."""

    request_id: RequestId
    code: str
    reason: str
    predicted_ttft_s: float | None = None
    predicted_tbt_s: float | None = None


Decision = Plan | Rejection
