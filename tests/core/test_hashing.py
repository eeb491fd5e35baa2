from __future__ import annotations

import pytest
import xxhash

from conductor.core.errors import InvalidInput
from conductor.core.hashing import DEFAULT_SEED, hash_block, hash_blocks


def test_chain_matches_single_block_hashes() -> None:
    toks = list(range(70))
    chain = hash_blocks(toks, 32)
    assert len(chain) == 2  # the partial third block is not hashed
    h0 = hash_block(None, toks[:32])
    h1 = hash_block(h0, toks[32:64])
    assert chain == [h0, h1]


def test_reference_vector() -> None:
    # xxh3-64(parent_le64 || tokens as little-endian u32, seed)
    data = (0).to_bytes(8, "little") + b"".join(t.to_bytes(4, "little") for t in (1, 2, 3, 4))
    assert hash_block(None, [1, 2, 3, 4]) == xxhash.xxh3_64_intdigest(data, DEFAULT_SEED)


def test_extra_keys_and_seed_separate_chains() -> None:
    toks = [5] * 16
    base = hash_blocks(toks, 16)
    assert hash_blocks(toks, 16, ("lora-a",)) != base
    assert hash_blocks(toks, 16, ("salt",)) != hash_blocks(toks, 16, ("lora-a",))
    assert hash_blocks(toks, 16, seed=1) != base
    # a different parent changes every following hash
    assert hash_blocks(toks, 16, parent=hash_block(None, [9] * 16)) != base


def test_bad_block_size() -> None:
    with pytest.raises(InvalidInput, match="block_size_tokens=0"):
        hash_blocks([1, 2], 0)
