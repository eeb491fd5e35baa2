"""Encode KV-cache events exactly as vLLM 0.32 publishes them (the emulator's side of the wire).

The inverse of :mod:`conductor.wire.vllm_events`; byte-for-byte what vLLM's msgspec
structs produce (``EventBatch`` is ``array_like``, events are tagged maps with
``omit_defaults``)::

    PUB frames    = [topic, seq (8-byte big-endian, from 0), payload]
    payload       = msgpack([ts, [event, ...], data_parallel_rank])
    BlockStored   = {"type": "BlockStored", "block_hashes": [int, ...],
                     "parent_block_hash": int | None, "token_ids": [int, ...],
                     "block_size": int, "lora_id": None, "medium": "GPU", "lora_name": None,
                     "extra_keys": [None, ...], "group_idx": 0,
                     "kv_cache_spec_kind": "full_attention"}
    BlockRemoved  = {"type": "BlockRemoved", "block_hashes": [int, ...], "medium": "GPU"}
    AllBlocksCleared = {"type": "AllBlocksCleared"}

Replay (ROUTER socket): a request ``[identity, b"", start seq (8 bytes)]`` is answered with
``[identity, b"", topic, seq, payload]`` for every buffered batch with ``seq >= start``, then
``[identity, b"", b"", -1 (8 bytes, signed), b""]``.

Fields whose value equals vLLM's default (``group_idx`` of a removal, the sliding window) are
omitted, as ``omit_defaults`` does; fields without a default (``lora_id``, ``medium``,
``lora_name``) are always present, ``None`` included. Hashes are the engine's 64-bit ints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from conductor.wire.vllm_events import END_OF_REPLAY_SEQ, encode_seq

DEFAULT_MEDIUM = "GPU"
FULL_ATTENTION = "full_attention"
_U64_MASK = (1 << 64) - 1

EventMap = dict[str, Any]
"""One event as vLLM's msgspec encoder would write it (a tagged map)."""


def block_stored(
    block_hashes: Sequence[int],
    token_ids: Sequence[int],
    block_size: int,
    *,
    parent_block_hash: int | None = None,
    medium: str | None = DEFAULT_MEDIUM,
    lora_name: str | None = None,
    extra_keys: Sequence[tuple[object, ...] | None] | None = None,
    group_idx: int | None = 0,
    kv_cache_spec_kind: str | None = FULL_ATTENTION,
) -> EventMap:
    """A ``BlockStored`` event; ``token_ids`` holds ``block_size`` tokens per block."""
    if len(token_ids) != len(block_hashes) * block_size:
        raise ValueError(
            f"token_ids has {len(token_ids)} tokens, expected "
            f"{len(block_hashes)} blocks x {block_size}"
        )
    event: EventMap = {
        "type": "BlockStored",
        "block_hashes": [int(h) & _U64_MASK for h in block_hashes],
        "parent_block_hash": None if parent_block_hash is None else parent_block_hash & _U64_MASK,
        "token_ids": list(token_ids),
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": lora_name,
        "extra_keys": (
            [None] * len(block_hashes)
            if extra_keys is None
            else [None if e is None else list(e) for e in extra_keys]
        ),
    }
    if group_idx is not None:
        event["group_idx"] = group_idx
    if kv_cache_spec_kind is not None:
        event["kv_cache_spec_kind"] = kv_cache_spec_kind
    return event


def block_removed(
    block_hashes: Sequence[int],
    *,
    medium: str | None = DEFAULT_MEDIUM,
    group_idx: int | None = None,
) -> EventMap:
    """A ``BlockRemoved`` event (vLLM leaves ``group_idx`` at its default, omitted)."""
    event: EventMap = {
        "type": "BlockRemoved",
        "block_hashes": [int(h) & _U64_MASK for h in block_hashes],
        "medium": medium,
    }
    if group_idx is not None:
        event["group_idx"] = group_idx
    return event


def all_blocks_cleared() -> EventMap:
    return {"type": "AllBlocksCleared"}


def encode_payload(events: Sequence[EventMap], ts: float, dp_rank: int | None = 0) -> bytes:
    """msgpack of the positional ``EventBatch`` ``[ts, events, data_parallel_rank]``."""
    batch: list[Any] = [float(ts), list(events)]
    if dp_rank is not None:
        batch.append(dp_rank)
    out = msgpack.packb(batch, use_bin_type=True)
    assert isinstance(out, bytes)
    return out


def pub_frames(topic: bytes, seq: int, payload: bytes) -> list[bytes]:
    """The multipart message on the PUB socket."""
    if seq < 0:
        raise ValueError(f"sequence numbers start at 0, got {seq}")
    return [topic, encode_seq(seq), payload]


def replay_frames(identity: bytes, topic: bytes, seq: int, payload: bytes) -> list[bytes]:
    """One replayed batch on the ROUTER socket (to the client ``identity``)."""
    return [identity, b"", topic, encode_seq(seq), payload]


def replay_end_frames(identity: bytes) -> list[bytes]:
    """The end-of-replay marker: sequence -1 and an empty payload."""
    return [identity, b"", b"", encode_seq(END_OF_REPLAY_SEQ), b""]
