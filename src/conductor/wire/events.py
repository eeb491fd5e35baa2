"""Engine-level KV-cache events: what an engine says about its own blocks, decoded.

The typed values every engine wire decoder produces (vLLM's today,
:mod:`conductor.wire.vllm_events`) and the gateway's ingest consumes
(:mod:`conductor.gateway.kv_ingest`). An engine's block hash is *not* our
:class:`~conductor.core.types.BlockHash`; the gateway maps one to the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType

from conductor.core.errors import ConductorError

EngineBlockHash = NewType("EngineBlockHash", int)
"""An engine's own 64-bit block hash, as published in its KV events."""


class WireError(ConductorError, ValueError):
    """A frame or payload from an engine does not have the shape the wire format promises."""


@dataclass(frozen=True, slots=True)
class EngineBlockStored:
    """The engine stored ``len(engine_hashes)`` full blocks chained after ``parent_engine_hash``.

    ``token_ids`` holds ``block_size`` tokens per block, in order. ``extra_keys`` has one entry
    per block (``None`` or a tuple of the block's extra hash inputs: LoRA name, multimodal
    ``(id, offset)`` pairs, cache salt), or is empty when the engine did not send any.
    """

    engine_hashes: tuple[EngineBlockHash, ...]
    parent_engine_hash: EngineBlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: tuple[tuple[object, ...] | None, ...] = ()
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class EngineBlockRemoved:
    """The engine evicted ``engine_hashes`` from ``medium``."""

    engine_hashes: tuple[EngineBlockHash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class EngineAllBlocksCleared:
    """The engine dropped its whole prefix cache."""


@dataclass(frozen=True, slots=True)
class EngineUnknownEvent:
    """An event type this decoder does not know (a newer engine); consumers skip it."""

    type_name: str


EngineEvent = EngineBlockStored | EngineBlockRemoved | EngineAllBlocksCleared | EngineUnknownEvent


@dataclass(frozen=True, slots=True)
class EngineEventBatch:
    """One published batch: the publisher's ``seq``, its wall-clock ``ts`` and its events."""

    topic: bytes
    seq: int
    ts: float
    events: tuple[EngineEvent, ...]
    dp_rank: int | None = None
