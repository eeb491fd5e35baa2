"""The KV event encoder writes what vLLM 0.32 writes, and the decoder reads it back."""

from __future__ import annotations

import msgpack
import pytest

from conductor.wire import vllm_events_encode as enc
from conductor.wire.events import EngineAllBlocksCleared, EngineBlockRemoved, EngineBlockStored
from conductor.wire.vllm_events import decode_frames, decode_seq
from tests.gateway import vllm_wire as w

TOKENS = list(range(100, 108))
BIG = (1 << 64) - 5  # a hash with the top bit set: msgpack uint64


def test_payload_is_byte_identical_to_vllm_msgspec_structs() -> None:
    ours = enc.encode_payload(
        [
            enc.block_stored([11, BIG], TOKENS, 4),
            enc.block_stored([13], TOKENS[:4], 4, parent_block_hash=BIG),
            enc.block_removed([11]),
            enc.all_blocks_cleared(),
        ],
        ts=1.5,
        dp_rank=0,
    )
    theirs = w.payload(
        [
            w.stored([11, BIG], TOKENS),
            w.stored([13], TOKENS[:4], parent=BIG),
            w.BlockRemoved(block_hashes=[11], medium="GPU"),
            w.AllBlocksCleared(),
        ],
        ts=1.5,
        dp_rank=0,
    )
    assert ours == theirs


def test_event_maps_have_vllm_field_order() -> None:
    stored = enc.block_stored([1, 2], TOKENS, 4)
    assert list(stored) == [
        "type",
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
    ]
    assert stored["extra_keys"] == [None, None]
    assert enc.block_removed([3]) == {"type": "BlockRemoved", "block_hashes": [3], "medium": "GPU"}
    batch = msgpack.unpackb(enc.encode_payload([stored], ts=2.0))
    assert batch[0] == 2.0 and batch[2] == 0 and batch[1][0]["type"] == "BlockStored"


def test_round_trip_through_the_decoder() -> None:
    payload = enc.encode_payload(
        [
            enc.block_stored([11, 12], TOKENS, 4, parent_block_hash=BIG),
            enc.block_removed([12, 11]),
            enc.all_blocks_cleared(),
        ],
        ts=3.25,
    )
    batch = decode_frames(enc.pub_frames(b"kv", 7, payload))
    assert (batch.topic, batch.seq, batch.ts, batch.dp_rank) == (b"kv", 7, 3.25, 0)
    stored, removed, cleared = batch.events
    assert stored == EngineBlockStored(
        engine_hashes=(11, 12),  # type: ignore[arg-type]
        parent_engine_hash=BIG,  # type: ignore[arg-type]
        token_ids=tuple(TOKENS),
        block_size=4,
        medium="GPU",
        extra_keys=(None, None),
        group_idx=0,
    )
    assert removed == EngineBlockRemoved(engine_hashes=(12, 11), medium="GPU")  # type: ignore[arg-type]
    assert cleared == EngineAllBlocksCleared()


def test_replay_frames() -> None:
    frames = enc.replay_frames(b"id", b"kv", 3, b"body")
    assert frames[:3] == [b"id", b"", b"kv"] and decode_seq(frames[3]) == 3
    end = enc.replay_end_frames(b"id")
    assert end[:3] == [b"id", b"", b""] and decode_seq(end[3]) == -1 and end[4] == b""


def test_encoder_rejects_inconsistent_input() -> None:
    with pytest.raises(ValueError, match="token_ids"):
        enc.block_stored([1, 2], TOKENS[:5], 4)
    with pytest.raises(ValueError, match="sequence"):
        enc.pub_frames(b"", -1, b"")
