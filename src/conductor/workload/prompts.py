"""Token-id prompts whose shared prefixes are exact: block id ``h`` always becomes the same
``block_size_tokens`` token ids, so two prompts that share their first ``k`` block ids share
their first ``k * block_size_tokens`` tokens and hit an engine's prefix cache exactly as the
trace says (``conductor replay``), and a prompt made of fresh ids shares nothing
(``conductor profile``).

A block's ids are drawn from ``pool`` (token ids that are ordinary text tokens of the model:
see :func:`word_pool`) by a generator seeded with ``(seed, h)`` only, so any process
reproduces them. Sending ids (``"prompt": [ids]``) instead of text keeps the lengths exact
whatever the tokenizer merges.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from conductor.core.errors import InvalidInput

DEFAULT_POOL = tuple(range(16, 256))
"""Token ids used when no tokenizer is given: below 256, so in any byte-level vocabulary and
the emulator's byte tokenizer, and above the usual special ids (pad, BOS, EOS)."""


def word_pool(encode: Callable[[str], Sequence[int]], words: Sequence[str]) -> tuple[int, ...]:
    """The distinct ids of ``words`` encoded by a tokenizer (``encode(text)`` without special
    tokens): ordinary text tokens of that model."""
    ids = sorted({t for w in words for t in encode(" " + w)})
    if len(ids) < 2:
        raise InvalidInput("pool", ids, "the tokenizer gave fewer than 2 distinct ids")
    return tuple(ids)


class BlockPrompts:
    """Token ids of trace blocks (see the module docstring)."""

    def __init__(
        self, block_size_tokens: int, pool: Sequence[int] = DEFAULT_POOL, seed: int = 0
    ) -> None:
        if block_size_tokens < 1:
            raise InvalidInput("block_size_tokens", block_size_tokens, "must be >= 1")
        if len(pool) < 2:
            raise InvalidInput("pool", list(pool), "needs at least 2 token ids")
        self.block_size_tokens = block_size_tokens
        self.pool = tuple(pool)
        self.seed = seed
        self._blocks: dict[int, list[int]] = {}

    def block(self, block_id: int) -> list[int]:
        """The ``block_size_tokens`` ids of block ``block_id``."""
        ids = self._blocks.get(block_id)
        if ids is None:
            rng = random.Random(f"{self.seed}:{block_id}")
            ids = rng.choices(self.pool, k=self.block_size_tokens)
            self._blocks[block_id] = ids
        return ids

    def prompt(self, block_ids: Sequence[int], length: int) -> list[int]:
        """The first ``length`` ids of the blocks ``block_ids`` in order."""
        if length < 1:
            raise InvalidInput("length", length, "must be >= 1")
        if len(block_ids) * self.block_size_tokens < length:
            raise InvalidInput(
                "block_ids",
                len(block_ids),
                f"{len(block_ids)} blocks of {self.block_size_tokens} cannot make {length} tokens",
            )
        out: list[int] = []
        for block_id in block_ids:
            if len(out) >= length:
                break
            out.extend(self.block(block_id))
        return out[:length]

    def forget(self) -> None:
        """Drop the memoised blocks (a long replay keeps memory bounded)."""
        self._blocks.clear()


class FreshBlocks:
    """Block ids never used before in this run: ``start``, ``start + 1``, ... (a profile's
    uncached prompts and suffixes)."""

    def __init__(self, start: int = 1 << 40) -> None:
        self._next = start

    def take(self, n: int) -> list[int]:
        ids = list(range(self._next, self._next + n))
        self._next += n
        return ids
