"""What :meth:`Scheduler.schedule` returns: a :class:`Plan` or a :class:`Rejection`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from conductor.core.chunked_pipeline import PipelinePlan
from conductor.core.types import BlockHash, InstanceId, RequestId

if TYPE_CHECKING:
    from conductor.core.policies.base import DecodeChoice, PrefillChoice, SchedulingContext


@dataclass(slots=True, init=False, unsafe_hash=True)
class Fetch:
    """Blocks to pull over the network from ``source`` before (layer-wise: while) prefilling."""

    source: Final[InstanceId]
    tokens: Final[int]
    block_hashes: Final[tuple[BlockHash, ...]]

    def __init__(
        self, source: InstanceId, tokens: int, block_hashes: tuple[BlockHash, ...]
    ) -> None:
        self.source = source
        self.tokens = tokens
        self.block_hashes = block_hashes


@dataclass(slots=True, init=False, unsafe_hash=True)
class Migration:
    """Hot-spot migration (Algorithm 1 lines 20-21): copy blocks to ``target``, making a
    replica there."""

    source: Final[InstanceId]
    target: Final[InstanceId]
    block_hashes: Final[tuple[BlockHash, ...]]

    def __init__(
        self, source: InstanceId, target: InstanceId, block_hashes: tuple[BlockHash, ...]
    ) -> None:
        self.source = source
        self.target = target
        self.block_hashes = block_hashes


@dataclass(slots=True, init=False, unsafe_hash=True)
class Plan:
    request_id: Final[RequestId]
    prefill: Final[InstanceId]
    decode: Final[InstanceId]
    policy: Final[str]
    local_tokens: Final[int]
    fetch: Final[Fetch | None]
    predicted_ttft_s: Final[float]
    queue_s: Final[float]
    transfer_s: Final[float]
    prefill_s: Final[float]
    predicted_tbt_s: Final[float]
    migrations: Final[tuple[Migration, ...]]
    cpp: Final[PipelinePlan | None]
    """Chunked pipeline parallel prefill over ``cpp.nodes`` (``prefill`` is the lead)."""

    def __init__(
        self,
        request_id: RequestId,
        prefill: InstanceId,
        decode: InstanceId,
        policy: str,
        local_tokens: int,
        fetch: Fetch | None,
        predicted_ttft_s: float,
        queue_s: float,
        transfer_s: float,
        prefill_s: float,
        predicted_tbt_s: float,
        migrations: tuple[Migration, ...] = (),
        cpp: PipelinePlan | None = None,
    ) -> None:
        self.request_id = request_id
        self.prefill = prefill
        self.decode = decode
        self.policy = policy
        self.local_tokens = local_tokens
        self.fetch = fetch
        self.predicted_ttft_s = predicted_ttft_s
        self.queue_s = queue_s
        self.transfer_s = transfer_s
        self.prefill_s = prefill_s
        self.predicted_tbt_s = predicted_tbt_s
        self.migrations = migrations
        self.cpp = cpp

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


@dataclass(slots=True, init=False, unsafe_hash=True)
class Prepared:
    """A placement :meth:`Scheduler.prepare` made, not yet admitted nor committed."""

    ctx: Final[SchedulingContext]
    pre: Final[PrefillChoice]
    dec: Final[DecodeChoice]
    cpp: Final[PipelinePlan | None]

    def __init__(
        self,
        ctx: SchedulingContext,
        pre: PrefillChoice,
        dec: DecodeChoice,
        cpp: PipelinePlan | None,
    ) -> None:
        self.ctx = ctx
        self.pre = pre
        self.dec = dec
        self.cpp = cpp
