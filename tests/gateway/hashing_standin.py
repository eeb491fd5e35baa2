"""A stand-in for ``conductor.core.hashing.hash_block`` until that module lands on this branch.

Same signature: ``hash_block(parent, block_token_ids, extra_keys) -> BlockHash``; xxh3-64 with
an explicit seed over the parent hash, the token ids and the extra keys. The code under test
only depends on the callable, so the real function can replace this one unchanged.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import xxhash

from conductor.core.types import BlockHash

SEED = 0x5EED


def hash_block(
    parent: BlockHash | None, tokens: Sequence[int], extra: tuple[object, ...]
) -> BlockHash:
    h = xxhash.xxh3_64(seed=SEED)
    h.update(b"\x00" * 9 if parent is None else b"\x01" + struct.pack("<Q", parent))
    h.update(struct.pack(f"<I{len(tokens)}I", len(tokens), *tokens))
    h.update(repr(extra).encode())
    return BlockHash(h.intdigest())


def chain(
    tokens: Sequence[int],
    block_size: int,
    parent: BlockHash | None = None,
    extras: Sequence[tuple[object, ...]] = (),
) -> list[BlockHash]:
    """Our hashes of ``tokens``' full blocks, chained from ``parent``."""
    out: list[BlockHash] = []
    for i in range(len(tokens) // block_size):
        extra = extras[i] if i < len(extras) else ()
        parent = hash_block(parent, tokens[i * block_size : (i + 1) * block_size], extra)
        out.append(parent)
    return out
