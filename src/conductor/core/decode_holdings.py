"""What each decode-only instance holds in its own prefix cache, from its KV events.

A decode engine keeps finished requests' blocks cached in its free KV blocks (vLLM's prefix
caching), so a hand-off to it need carry only the prompt's blocks it lacks. The scheduler
keeps these apart from the :class:`~conductor.core.prefix_index.PrefixIndex` that prefill
placement reads (no prefill instance fetches from a decode engine), in one set of block
hashes per instance: a KV event is one C-level set update, and a match looks at the
instances that hold the prompt's first block only, counting each one's leading blocks in C.
Tiers are not told apart (a decode engine reuses only its own GPU blocks).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import takewhile

from conductor.core.types import BlockHash, InstanceId, Tier


class DecodeHoldings:
    __slots__ = ("_held", "_nonempty")

    def __init__(self) -> None:
        self._held: dict[InstanceId, set[BlockHash]] = {}
        self._nonempty: dict[InstanceId, set[BlockHash]] = {}
        """The holders that hold anything (what a match looks at), in registration order."""

    def add_holder(self, holder: InstanceId) -> None:
        self._held.setdefault(holder, set())

    def remove_holder(self, holder: InstanceId) -> None:
        self._held.pop(holder, None)
        self._nonempty.pop(holder, None)

    def __contains__(self, holder: object) -> bool:
        return holder in self._held

    def store(self, holder: InstanceId, block_hashes: Iterable[BlockHash], tier: Tier) -> None:
        held = self._held[holder]
        held.update(block_hashes)
        if held and holder not in self._nonempty:
            self._nonempty = {h: s for h, s in self._held.items() if s}

    def remove(self, holder: InstanceId, block_hashes: Iterable[BlockHash], tier: Tier) -> None:
        held = self._held[holder]
        held.difference_update(block_hashes)
        if not held:
            self._nonempty.pop(holder, None)

    def clear(self, holder: InstanceId, tier: Tier | None = None) -> None:
        self._held[holder].clear()
        self._nonempty.pop(holder, None)

    def count(self, holder: InstanceId) -> int:
        return len(self._held[holder])

    def held_blocks(self, block_hashes: Sequence[BlockHash]) -> dict[InstanceId, int]:
        """Leading ``block_hashes`` each instance holds (instances holding none are absent)."""
        out: dict[InstanceId, int] = {}
        if not block_hashes or not self._nonempty:
            return out
        first = block_hashes[0]
        for holder, held in self._nonempty.items():
            if first in held:
                out[holder] = len(list(takewhile(held.__contains__, block_hashes)))
        return out
