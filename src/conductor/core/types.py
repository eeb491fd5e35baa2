"""Identifiers and small frozen value types shared by every layer.

Distinct ``NewType`` s keep ids and hashes apart: an engine's own block hash is *not* a
:data:`BlockHash` (ours); the gateway maps one to the other.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NewType

InstanceId = NewType("InstanceId", str)
RequestId = NewType("RequestId", str)
BlockHash = NewType("BlockHash", int)
"""Our chained 64-bit block hash (or a trace's pre-chained ``hash_ids`` value)."""


class Role(enum.Enum):
    """What an engine instance does in a P/D-disaggregated cluster."""

    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"

    @property
    def prefills(self) -> bool:
        return self in (Role.PREFILL, Role.BOTH)

    @property
    def decodes(self) -> bool:
        return self in (Role.DECODE, Role.BOTH)


class Tier(enum.IntEnum):
    """Where a cached KV block lives.

    ``GPU`` and ``DRAM`` are an instance's own memory (local reuse); ``STORE`` is a block
    in the shared pool (Mooncake Store) held on some node, fetchable by any instance at a
    transfer cost.
    """

    GPU = 0
    DRAM = 1
    STORE = 2


@dataclass(frozen=True, slots=True)
class Request:
    """A request as the scheduler sees it: lengths and the chained hashes of its full blocks.

    ``block_hashes`` covers the prompt's blocks in order; for Mooncake traces the last block
    may be partial (``len(block_hashes) == ceil(prompt_tokens / block_size)``).
    ``max_tokens`` is the client's cap on the output (None: up to the model's context); how
    many tokens the request will really generate is not known to the scheduler, which
    predicts it (:mod:`conductor.core.output_length`).
    """

    request_id: RequestId
    prompt_tokens: int
    block_hashes: tuple[BlockHash, ...]
    max_tokens: int | None = None
    arrival_s: float = 0.0
    ttft_slo_s: float | None = None
    tbt_slo_s: float | None = None
    tags: tuple[str, ...] = field(default=())

    def with_ttft_slo(self, ttft_slo_s: float) -> Request:
        """This request with another TTFT SLO (the hold queue passes what is left of it;
        ``dataclasses.replace`` is several times slower on this path)."""
        return Request(
            self.request_id,
            self.prompt_tokens,
            self.block_hashes,
            self.max_tokens,
            self.arrival_s,
            ttft_slo_s,
            self.tbt_slo_s,
            self.tags,
        )
