"""Chained block hashing of token ids (vLLM ``hash_block_tokens`` style, xxh3-64).

``hash(block_i) = xxh3_64(parent_le64 || tokens_le32... || extra, seed)`` where ``parent`` is
the previous block's hash (or :data:`ROOT_PARENT` for the first block). Only full blocks are
hashed. ``extra_keys`` (LoRA id, cache salt, multimodal ids) are folded in so that the same
tokens under another adapter or salt never match.

Inputs that already carry chained block ids (Mooncake traces' ``hash_ids``) skip this
module: their ids enter the index as they are.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import xxhash

from conductor.core.errors import InvalidInput
from conductor.core.types import BlockHash

DEFAULT_SEED = 0x636F6E64  # "cond"
ROOT_PARENT = 0
_U64 = (1 << 64) - 1


def _extra_bytes(extra_keys: Sequence[object]) -> bytes:
    if not extra_keys:
        return b""
    return b"\x00" + repr(tuple(extra_keys)).encode()


def hash_block(
    parent: BlockHash | None,
    tokens: Sequence[int],
    extra_keys: Sequence[object] = (),
    *,
    seed: int = DEFAULT_SEED,
) -> BlockHash:
    """The chained hash of one block of ``tokens`` under ``parent`` (None for the first)."""
    parent_int = ROOT_PARENT if parent is None else int(parent) & _U64
    data = parent_int.to_bytes(8, "little") + array("I", tokens).tobytes()
    return BlockHash(xxhash.xxh3_64_intdigest(data + _extra_bytes(extra_keys), seed))


def hash_blocks(
    token_ids: Sequence[int],
    block_size_tokens: int,
    extra_keys: Sequence[object] = (),
    *,
    parent: BlockHash | None = None,
    seed: int = DEFAULT_SEED,
) -> list[BlockHash]:
    """Chained hashes of every *full* block of ``token_ids`` (a trailing partial block is
    not hashed: engines cache only full blocks)."""
    if block_size_tokens <= 0:
        raise InvalidInput("block_size_tokens", block_size_tokens, "must be > 0")
    n_full = len(token_ids) // block_size_tokens
    out: list[BlockHash] = []
    extra = _extra_bytes(extra_keys)
    buf = array("I", token_ids[: n_full * block_size_tokens]).tobytes()
    step = 4 * block_size_tokens
    parent_int = ROOT_PARENT if parent is None else int(parent) & _U64
    digest = xxhash.xxh3_64_intdigest
    for i in range(n_full):
        h = digest(parent_int.to_bytes(8, "little") + buf[i * step : (i + 1) * step] + extra, seed)
        out.append(BlockHash(h))
        parent_int = h
    return out
