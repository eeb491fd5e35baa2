"""Decoding vLLM KV-event frames: both encodings, hash forms, and malformed input."""

from __future__ import annotations

import msgpack
import pytest

from conductor.core.errors import ConductorError
from conductor.wire import vllm_events_encode as enc
from conductor.wire.events import (
    EngineAllBlocksCleared,
    EngineBlockHash,
    EngineBlockRemoved,
    EngineBlockStored,
    EngineEventBatch,
    EngineUnknownEvent,
    WireError,
)
from conductor.wire.vllm_events import (
    _TYPED,
    _decode_payload_generic,
    decode_event,
    decode_frames,
    decode_hash,
    decode_payload,
    decode_seq,
    encode_seq,
)
from tests.gateway import vllm_wire as w

H = EngineBlockHash

# One real event as vLLM 0.32.0 (CPU) published it for a 111-token prompt (3 full blocks).
REAL_STORED = {
    "type": "BlockStored",
    "block_hashes": [7633232885285892704, 15500639318242201945, 10247513653201384741],
    "parent_block_hash": None,
    "token_ids": list(range(96)),
    "block_size": 32,
    "lora_id": None,
    "medium": "GPU",
    "lora_name": None,
    "extra_keys": [None, None, None],
    "group_idx": 0,
    "kv_cache_spec_kind": "full_attention",
}


def test_vllm_032_array_batch_with_map_events() -> None:
    body = msgpack.packb([1795993076.7084494, [REAL_STORED], 0])
    batch = decode_frames([b"kv", (7).to_bytes(8, "big"), body])
    assert batch == EngineEventBatch(
        topic=b"kv",
        seq=7,
        ts=1795993076.7084494,
        events=(
            EngineBlockStored(
                engine_hashes=(
                    H(7633232885285892704),
                    H(15500639318242201945),
                    H(10247513653201384741),
                ),
                parent_engine_hash=None,
                token_ids=tuple(range(96)),
                block_size=32,
                medium="GPU",
                lora_name=None,
                extra_keys=(None, None, None),
                group_idx=0,
            ),
        ),
        dp_rank=0,
    )


def test_all_three_event_types_encoded_by_msgspec_like_vllm() -> None:
    body = w.payload(
        [
            w.stored([11, 12], list(range(8)), parent=10, extra_keys=[("lora-a",), None]),
            w.BlockRemoved(block_hashes=[12], medium="CPU", group_idx=0),
            w.AllBlocksCleared(),
        ],
        ts=2.5,
        dp_rank=1,
    )
    ts, events, dp_rank = decode_payload(body)
    assert (ts, dp_rank) == (2.5, 1)
    assert events == (
        EngineBlockStored(
            engine_hashes=(H(11), H(12)),
            parent_engine_hash=H(10),
            token_ids=tuple(range(8)),
            block_size=4,
            medium="GPU",
            extra_keys=(("lora-a",), None),
            group_idx=0,
        ),
        EngineBlockRemoved(engine_hashes=(H(12),), medium="CPU", group_idx=0),
        EngineAllBlocksCleared(),
    )


def test_map_batch_with_positional_events_older_vllm() -> None:
    body = w.map_payload(
        [
            w.BlockStoredArray([5, 6], 4, [1, 2, 3, 4], 2, None, "GPU", "my-lora"),
            w.BlockRemovedArray([5], None),
            w.AllBlocksClearedArray(),
        ],
        ts=3.0,
        dp_rank=None,
    )
    ts, events, dp_rank = decode_payload(body)
    assert (ts, dp_rank) == (3.0, None)
    assert events == (
        EngineBlockStored(
            engine_hashes=(H(5), H(6)),
            parent_engine_hash=H(4),
            token_ids=(1, 2, 3, 4),
            block_size=2,
            medium="GPU",
            lora_name="my-lora",
        ),
        EngineBlockRemoved(engine_hashes=(H(5),), medium=None),
        EngineAllBlocksCleared(),
    )


def test_positional_event_with_extra_trailing_fields_and_short_forms() -> None:
    long_form = [
        "BlockStored",
        [1],
        None,
        [9, 9],
        2,
        None,
        "CPU",
        None,
        [[["mm", 3]]],
        1,
        "sliding_window",
        128,
        "LOCAL",
        "future-field",
    ]
    assert decode_event(long_form) == EngineBlockStored(
        engine_hashes=(H(1),),
        parent_engine_hash=None,
        token_ids=(9, 9),
        block_size=2,
        medium="CPU",
        extra_keys=((("mm", 3),),),
        group_idx=1,
    )
    # The oldest form stops after block_size: medium and the rest default.
    assert decode_event(["BlockStored", [1], None, [9, 9], 2]) == EngineBlockStored(
        engine_hashes=(H(1),), parent_engine_hash=None, token_ids=(9, 9), block_size=2
    )
    assert decode_event(["BlockRemoved", [1]]) == EngineBlockRemoved(engine_hashes=(H(1),))


def test_map_event_ignores_unknown_keys_and_missing_optionals() -> None:
    event = {
        "type": "BlockRemoved",
        "block_hashes": [2**64 - 1],
        "medium": "GPU",
        "locality": "LOCAL",
        "brand_new": {"x": 1},
    }
    assert decode_event(event) == EngineBlockRemoved(engine_hashes=(H(2**64 - 1),), medium="GPU")


def test_unknown_event_types_decode_to_a_placeholder() -> None:
    body = msgpack.packb([1.0, [{"type": "BlockReused", "block_hashes": [1]}, ["Future", 1]], 0])
    assert decode_payload(body)[1] == (
        EngineUnknownEvent("BlockReused"),
        EngineUnknownEvent("Future"),
    )


def test_bytes_hashes_become_low_64_bits_big_endian() -> None:
    digest = bytes(range(32))  # 00 01 .. 1f: low 8 bytes are 18 19 1a 1b 1c 1d 1e 1f
    assert decode_hash(digest) == 0x18191A1B1C1D1E1F
    assert decode_hash(b"\x01\x02") == 0x0102
    body = w.payload([w.stored([digest], [1, 2, 3, 4], parent=b"\xff" * 9)])
    (event,) = decode_payload(body)[1]
    assert isinstance(event, EngineBlockStored)
    assert event.engine_hashes == (H(0x18191A1B1C1D1E1F),)
    assert event.parent_engine_hash == H(2**64 - 1)


def test_int_hashes_are_masked_to_64_bits() -> None:
    assert decode_hash(-1) == 2**64 - 1
    assert decode_hash(2**64 + 5) == 5
    assert decode_hash(0) == 0


def test_seq_is_8_byte_big_endian_signed() -> None:
    assert decode_seq(b"\x00" * 7 + b"\x2a") == 42
    assert decode_seq(b"\xff" * 8) == -1
    assert encode_seq(258) == b"\x00\x00\x00\x00\x00\x00\x01\x02"
    assert encode_seq(-1) == b"\xff" * 8


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        ([b"kv", b"\x00" * 8], "expected 3 frames [topic, seq, payload], got 2"),
        ([b"kv", b"\x00" * 4, msgpack.packb([1.0, [], 0])], "sequence frame must be 8 bytes"),
        ([b"kv", b"\xff" * 8, msgpack.packb([1.0, [], 0])], "negative sequence number -1"),
        ([b"kv", b"\x00" * 8, b"\xc1"], "payload is not valid msgpack"),
        ([b"kv", b"\x00" * 8, msgpack.packb("hello")], "event batch must be a map or an array"),
        ([b"kv", b"\x00" * 8, msgpack.packb([1.0])], "event batch lacks ts or events"),
        ([b"kv", b"\x00" * 8, msgpack.packb(["x", [], 0])], "event batch ts must be a number"),
        ([b"kv", b"\x00" * 8, msgpack.packb([1.0, {}, 0])], "events must be an array"),
        ([b"kv", b"\x00" * 8, msgpack.packb([1.0, [], "r"])], "data_parallel_rank must be"),
        ([b"kv", b"\x00" * 8, msgpack.packb([1.0, [7], 0])], "event 0 is neither a map"),
        (
            [b"kv", b"\x00" * 8, msgpack.packb([1.0, [{"kind": "BlockStored"}], 0])],
            "event 0 has no valid type tag",
        ),
        ([b"kv", b"\x00" * 8, msgpack.packb([1.0, [[3, 4]], 0])], "event 0 has no valid type tag"),
    ],
)
def test_malformed_frames_raise_wire_error_naming_the_problem(
    frames: list[bytes], message: str
) -> None:
    with pytest.raises(WireError, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode_frames(frames)


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ({**REAL_STORED, "block_hashes": 5}, r"BlockStored\)\.block_hashes must be an array"),
        ({**REAL_STORED, "block_hashes": [1.5]}, r"block_hashes\[0\] must be an int or bytes"),
        ({**REAL_STORED, "block_hashes": [True]}, r"block_hashes\[0\] must be an int or bytes"),
        ({**REAL_STORED, "block_hashes": [b""]}, r"block_hashes\[0\] is empty bytes"),
        ({**REAL_STORED, "parent_block_hash": "p"}, "parent_block_hash must be an int or bytes"),
        ({**REAL_STORED, "token_ids": [1, "2"]}, "token_ids must be an array of ints"),
        ({**REAL_STORED, "block_size": 0}, "block_size must be a positive int"),
        ({**REAL_STORED, "medium": 3}, "medium must be a string or nil"),
        ({**REAL_STORED, "extra_keys": 3}, "extra_keys must be an array"),
        ({"type": "BlockRemoved"}, r"BlockRemoved\)\.block_hashes must be an array"),
        ({1: 2, "type": "BlockRemoved"}, "has non-string keys"),
    ],
)
def test_malformed_events(event: object, message: str) -> None:
    with pytest.raises(WireError, match=message):
        decode_frames([b"", b"\x00" * 8, msgpack.packb([0.0, [event], 0])])


def test_wire_error_is_a_conductor_error() -> None:
    assert issubclass(WireError, ConductorError)


def test_typed_and_generic_decoding_agree() -> None:
    events = [
        enc.block_stored([1, 2], list(range(8)), 4, parent_block_hash=7),
        enc.block_stored([3], [9, 9, 9, 9], 4, extra_keys=[("salt",)], medium="CPU"),
        enc.block_stored([5], [1, 2, 3, 4], 4, group_idx=None, kv_cache_spec_kind=None),
        enc.block_removed([1, 2]),
        enc.block_removed([3], medium="CPU", group_idx=1),
        enc.all_blocks_cleared(),
    ]
    bytes_hashes = enc.block_stored([0], [1, 2, 3, 4], 4)
    bytes_hashes["block_hashes"] = [b"\x01" * 32]
    bytes_hashes["parent_block_hash"] = b"\x02" * 32
    for batch in ([*events, bytes_hashes], []):
        for dp_rank in (0, None):
            payload = enc.encode_payload(batch, 12.5, dp_rank)
            _TYPED.decode(payload)  # vLLM's own form takes the typed path
            assert decode_payload(payload) == _decode_payload_generic(payload)
    typed = decode_payload(enc.encode_payload([bytes_hashes], 1.0))[1][0]
    assert isinstance(typed, EngineBlockStored)
    assert typed.engine_hashes == (int.from_bytes(b"\x01" * 8, "big"),)
