"""Identifiers and small immutable value types shared by every layer.

Distinct ``NewType`` s keep ids and hashes apart: an engine's own block hash is *not* a
:data:`BlockHash` (ours); the gateway maps one to the other.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Final, NewType

from conductor.core.errors import InvalidInput

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


@dataclass(slots=True, init=False, unsafe_hash=True)
class Request:
    """A request as the scheduler sees it: lengths and the chained hashes of its full blocks.

    ``block_hashes`` covers the prompt's blocks in order; for Mooncake traces the last block
    may be partial (``len(block_hashes) == ceil(prompt_tokens / block_size)``).
    ``max_tokens`` is the client's cap on the output (None: up to the model's context); how
    many tokens the request will really generate is not known to the scheduler, which
    predicts it (:mod:`conductor.core.output_length`).
    """

    request_id: Final[RequestId]
    prompt_tokens: Final[int]
    block_hashes: Final[tuple[BlockHash, ...]]
    max_tokens: Final[int | None]
    arrival_s: Final[float]
    ttft_slo_s: Final[float | None]
    tbt_slo_s: Final[float | None]
    tags: Final[tuple[str, ...]]

    def __init__(
        self,
        request_id: RequestId,
        prompt_tokens: int,
        block_hashes: tuple[BlockHash, ...],
        max_tokens: int | None = None,
        arrival_s: float = 0.0,
        ttft_slo_s: float | None = None,
        tbt_slo_s: float | None = None,
        tags: tuple[str, ...] = (),
    ) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.block_hashes = block_hashes
        self.max_tokens = max_tokens
        self.arrival_s = arrival_s
        self.ttft_slo_s = ttft_slo_s
        self.tbt_slo_s = tbt_slo_s
        self.tags = tags

    def check(self, block_size_tokens: int) -> None:
        """Raise :class:`~conductor.core.errors.InvalidInput` unless the prompt is positive,
        ``max_tokens`` (if given) >= 1, and there are no more block hashes than
        ``ceil(prompt_tokens / block_size_tokens)``. (Here, not with the config validators in
        :mod:`conductor.core.checks`, so that the compiled build runs it natively.)"""
        if self.prompt_tokens <= 0:
            raise InvalidInput("prompt_tokens", self.prompt_tokens, "must be > 0")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidInput("max_tokens", self.max_tokens, "must be >= 1")
        most = math.ceil(self.prompt_tokens / block_size_tokens)
        if len(self.block_hashes) > most:
            raise InvalidInput(
                "block_hashes",
                len(self.block_hashes),
                f"more blocks than ceil({self.prompt_tokens}/{block_size_tokens}) = {most}",
            )

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
