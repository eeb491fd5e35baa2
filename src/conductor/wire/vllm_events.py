"""Decode vLLM's KV-cache event stream (ZMQ multipart frames) into typed engine-level events.

Wire format (``vllm/distributed/kv_events.py``)::

    frames  = [topic bytes, seq (8-byte big-endian, from 0 per publisher), msgpack(EventBatch)]
    batch   = [ts, [event, ...], data_parallel_rank]       (array form; vLLM 0.32 sends this)
            | {"ts": .., "events": [..], "data_parallel_rank": ..}   (map form)
    event   = {"type": "BlockStored", "block_hashes": [..], ...}    (map form; vLLM 0.32)
            | ["BlockStored", block_hashes, parent_block_hash, ...] (positional, older versions)

Positional field orders (the tag first, then):

- ``BlockStored``: block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
  lora_name, extra_keys, group_idx, kv_cache_spec_kind, ... (later fields ignored)
- ``BlockRemoved``: block_hashes, medium, group_idx, ...
- ``AllBlocksCleared``: nothing

vLLM 0.32's form (an array batch of tagged-map events) decodes through typed msgspec structs
(about a sixth of the generic path's cost); anything else, or anything those structs reject,
takes the generic path, which also words the errors. Decoding is defensive: fields are read
by name where present, missing optional fields take
their defaults, unknown extra fields are ignored, and events of an unknown type decode to
:class:`EngineUnknownEvent` (skipped downstream) rather than failing the batch. Block hashes
arrive as ints (the low 64 bits of vLLM's digest, the default) or raw bytes
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``); both become an :data:`EngineBlockHash` (bytes:
low 64 bits, big-endian). Anything structurally wrong raises :class:`WireError` naming the
offending field.

The decoded values are :mod:`conductor.wire.events`; an engine's block hash is *not* our
:class:`~conductor.core.types.BlockHash` (the gateway maps one to the other).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import msgspec

from conductor.wire.events import (
    EngineAllBlocksCleared,
    EngineBlockHash,
    EngineBlockRemoved,
    EngineBlockStored,
    EngineEvent,
    EngineEventBatch,
    EngineUnknownEvent,
    WireError,
)

_U64_MASK = (1 << 64) - 1
SEQ_BYTES = 8
END_OF_REPLAY_SEQ = -1
"""The sequence number vLLM's replay socket sends after the last buffered batch."""


# Positional field names after the tag, per event type (older vLLM, ``array_like=True``).
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
_BATCH_FIELDS = ("ts", "events", "data_parallel_rank")


def decode_seq(raw: bytes) -> int:
    """An 8-byte big-endian sequence number (signed, so the replay end marker reads -1)."""
    if not isinstance(raw, bytes | bytearray | memoryview) or len(raw) != SEQ_BYTES:
        raise WireError(f"sequence frame must be {SEQ_BYTES} bytes, got {_describe(raw)}")
    return int.from_bytes(raw, "big", signed=True)


def encode_seq(seq: int) -> bytes:
    """The 8-byte big-endian form of ``seq`` (as vLLM's replay request expects)."""
    return seq.to_bytes(SEQ_BYTES, "big", signed=True)


def decode_frames(frames: Sequence[bytes]) -> EngineEventBatch:
    """Decode one multipart message ``[topic, seq, payload]`` from the PUB socket."""
    if len(frames) != 3:
        raise WireError(f"expected 3 frames [topic, seq, payload], got {len(frames)}")
    topic, raw_seq, payload = frames
    seq = decode_seq(raw_seq)
    if seq < 0:
        raise WireError(f"negative sequence number {seq} on the event stream")
    ts, events, dp_rank = decode_payload(payload)
    return EngineEventBatch(topic=bytes(topic), seq=seq, ts=ts, events=events, dp_rank=dp_rank)


def decode_replay(frames: Sequence[bytes], topic: bytes) -> EngineEventBatch | None:
    """Decode one reply of the replay socket: ``[b"", topic, seq, payload]`` (vLLM 0.32) or
    ``[b"", seq, payload]`` (then ``topic`` is the subscription's); None at the end marker."""
    body = list(frames[1:]) if frames and frames[0] == b"" else list(frames)
    if len(body) == 3:
        topic, raw_seq, payload = body
    elif len(body) == 2:
        raw_seq, payload = body
    else:
        raise WireError(f"replay reply must have 2 or 3 frames, got {len(body)}")
    seq = decode_seq(raw_seq)
    if seq == END_OF_REPLAY_SEQ:
        return None
    if seq < 0:
        raise WireError(f"negative sequence number {seq} in replay")
    ts, events, dp_rank = decode_payload(payload)
    return EngineEventBatch(topic=bytes(topic), seq=seq, ts=ts, events=events, dp_rank=dp_rank)


class _Stored(msgspec.Struct, tag="BlockStored", tag_field="type", kw_only=True):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None = None
    token_ids: list[int]
    block_size: int
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[list[Any] | None] | None = None
    group_idx: int | None = None


class _Removed(msgspec.Struct, tag="BlockRemoved", tag_field="type", kw_only=True):
    block_hashes: list[int | bytes]
    medium: str | None = None
    group_idx: int | None = None


class _Cleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type"):
    pass


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_Stored | _Removed | _Cleared]
    data_parallel_rank: int | None = None


_TYPED = msgspec.msgpack.Decoder(_Batch)


def decode_payload(payload: bytes) -> tuple[float, tuple[EngineEvent, ...], int | None]:
    """Decode a msgpack ``EventBatch`` into ``(ts, events, data_parallel_rank)``."""
    try:
        batch = _TYPED.decode(payload)
        events = tuple([_from_typed(e) for e in batch.events])
    except (msgspec.DecodeError, msgspec.ValidationError, WireError):
        return _decode_payload_generic(payload)
    return batch.ts, events, batch.data_parallel_rank


def _from_typed(event: _Stored | _Removed | _Cleared) -> EngineEvent:
    """One typed event as an engine event (``WireError`` sends the batch the generic way)."""
    if isinstance(event, _Stored):
        if event.block_size <= 0:
            raise WireError("block_size must be positive")
        extra: tuple[tuple[object, ...] | None, ...] = ()
        if event.extra_keys is not None:
            extra = tuple([None if e is None else _freeze_seq(e) for e in event.extra_keys])
        parent = event.parent_block_hash
        return EngineBlockStored(
            engine_hashes=_hashes(event.block_hashes, "block_hashes"),
            parent_engine_hash=None if parent is None else decode_hash(parent),
            token_ids=tuple(event.token_ids),
            block_size=event.block_size,
            medium=event.medium,
            lora_name=event.lora_name,
            extra_keys=extra,
            group_idx=event.group_idx,
        )
    if isinstance(event, _Removed):
        return EngineBlockRemoved(
            engine_hashes=_hashes(event.block_hashes, "block_hashes"),
            medium=event.medium,
            group_idx=event.group_idx,
        )
    return EngineAllBlocksCleared()


def _decode_payload_generic(payload: bytes) -> tuple[float, tuple[EngineEvent, ...], int | None]:
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise WireError(f"payload is not valid msgpack: {exc}") from exc
    fields = _fields(obj, _BATCH_FIELDS, "event batch")
    if "ts" not in fields or "events" not in fields:
        raise WireError(f"event batch lacks ts or events: {_describe(obj)}")
    ts = fields["ts"]
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise WireError(f"event batch ts must be a number, got {_describe(ts)}")
    raw_events = fields["events"]
    if not isinstance(raw_events, list):
        raise WireError(f"event batch events must be an array, got {_describe(raw_events)}")
    events = tuple(decode_event(e, index=i) for i, e in enumerate(raw_events))
    dp_rank = _opt_int(fields.get("data_parallel_rank"), "data_parallel_rank")
    return float(ts), events, dp_rank


def decode_event(obj: object, *, index: int = 0) -> EngineEvent:
    """Decode one event, map form (``type`` key) or positional form (tag first)."""
    tag: object
    if isinstance(obj, Mapping):
        tag = obj.get("type")
    elif isinstance(obj, list) and obj:
        tag = obj[0]
    else:
        raise WireError(f"event {index} is neither a map nor a tagged array: {_describe(obj)}")
    where = f"event {index} ({tag})"
    if tag == "BlockStored":
        return _stored(_fields(obj, _STORED_FIELDS, where, tagged=True), where)
    if tag == "BlockRemoved":
        body = _fields(obj, _REMOVED_FIELDS, where, tagged=True)
        return EngineBlockRemoved(
            engine_hashes=_hashes(body.get("block_hashes"), f"{where}.block_hashes"),
            medium=_opt_str(body.get("medium"), f"{where}.medium"),
            group_idx=_opt_int(body.get("group_idx"), f"{where}.group_idx"),
        )
    if tag == "AllBlocksCleared":
        return EngineAllBlocksCleared()
    if isinstance(tag, str) and tag:
        return EngineUnknownEvent(tag)
    raise WireError(f"event {index} has no valid type tag: {_describe(obj)}")


def decode_hash(value: object, where: str = "block hash") -> EngineBlockHash:
    """An int hash (masked to 64 bits) or a bytes digest (its low 64 bits, big-endian)."""
    if isinstance(value, bool):
        raise WireError(f"{where} must be an int or bytes, got {_describe(value)}")
    if isinstance(value, int):
        return EngineBlockHash(value & _U64_MASK)
    if isinstance(value, bytes | bytearray):
        if not value:
            raise WireError(f"{where} is empty bytes")
        return EngineBlockHash(int.from_bytes(value, "big") & _U64_MASK)
    raise WireError(f"{where} must be an int or bytes, got {_describe(value)}")


def _stored(body: Mapping[str, object], where: str) -> EngineBlockStored:
    hashes = _hashes(body.get("block_hashes"), f"{where}.block_hashes")
    parent_raw = body.get("parent_block_hash")
    parent = None if parent_raw is None else decode_hash(parent_raw, f"{where}.parent_block_hash")
    token_ids = body.get("token_ids")
    if not isinstance(token_ids, list) or not set(map(type, token_ids)) <= _INT_ONLY:
        raise WireError(f"{where}.token_ids must be an array of ints, got {_describe(token_ids)}")
    block_size = body.get("block_size")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise WireError(f"{where}.block_size must be a positive int, got {_describe(block_size)}")
    extra_raw = body.get("extra_keys")
    extra: tuple[tuple[object, ...] | None, ...] = ()
    if extra_raw is not None:
        if not isinstance(extra_raw, list):
            raise WireError(f"{where}.extra_keys must be an array, got {_describe(extra_raw)}")
        extra = tuple(None if e is None else _freeze_seq(e) for e in extra_raw)
    return EngineBlockStored(
        engine_hashes=hashes,
        parent_engine_hash=parent,
        token_ids=tuple(token_ids),
        block_size=block_size,
        medium=_opt_str(body.get("medium"), f"{where}.medium"),
        lora_name=_opt_str(body.get("lora_name"), f"{where}.lora_name"),
        extra_keys=extra,
        group_idx=_opt_int(body.get("group_idx"), f"{where}.group_idx"),
    )


def _fields(
    obj: object, names: Sequence[str], where: str, *, tagged: bool = False
) -> Mapping[str, object]:
    """A name -> value view of a map, or of a positional array (skipping the tag if any)."""
    if isinstance(obj, Mapping):
        if not all(isinstance(k, str) for k in obj):
            raise WireError(f"{where} has non-string keys")
        return obj
    if isinstance(obj, list):
        values = obj[1:] if tagged else obj
        return dict(zip(names, values, strict=False))
    raise WireError(f"{where} must be a map or an array, got {_describe(obj)}")


def _hashes(value: object, where: str) -> tuple[EngineBlockHash, ...]:
    if not isinstance(value, list):
        raise WireError(f"{where} must be an array, got {_describe(value)}")
    kinds = set(map(type, value))
    if kinds <= _INT_ONLY:  # the common cases first, without a per-hash call
        return tuple([EngineBlockHash(v & _U64_MASK) for v in value])
    if kinds <= _BYTES_ONLY and all(value):
        return tuple([EngineBlockHash(int.from_bytes(v, "big") & _U64_MASK) for v in value])
    return tuple(decode_hash(v, f"{where}[{i}]") for i, v in enumerate(value))


_INT_ONLY = frozenset({int})
_BYTES_ONLY = frozenset({bytes})


def _opt_str(value: object, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise WireError(f"{where} must be a string or nil, got {_describe(value)}")


def _opt_int(value: object, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise WireError(f"{where} must be an int or nil, got {_describe(value)}")


def _freeze_seq(value: object) -> tuple[object, ...]:
    """msgpack gives lists; make them (nested) tuples so extra keys can be hashed."""
    if isinstance(value, list | tuple):
        return tuple(_freeze_seq(v) if isinstance(v, list | tuple) else v for v in value)
    return (value,)


def _describe(value: object) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"
