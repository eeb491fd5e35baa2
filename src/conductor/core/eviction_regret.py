"""How often an evicted KV block is asked for again: the value of a cached block.

A prefill stored on an instance whose prefix cache is full evicts the least recently used
blocks there; if a later request needs them and no instance holds them any more, they are
computed again. This measures, from what a gateway sees, the chance of that: every block
the engines report removed (``BlocksRemoved``) is remembered (the most recent
``limit`` of them), and a remembered block a later request asks for is counted as
*regretted* (each once; whether or not another instance still holds it: an eviction also
takes a copy that placement could have used). :attr:`rate` is ``(regretted + 1) /
(removed + 2)`` (Laplace's rule: 1/2 before any evidence). ``conductor`` prices the blocks
a placement would evict at that rate times their recompute time
(:mod:`conductor.core.policies.conductor_policy`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from conductor.core.checks import check_at_least
from conductor.core.types import BlockHash

REGRET_MEMORY_BLOCKS = 65_536
"""Removed blocks remembered (about 6 MB): a block asked for again after this many later
removals is not counted (the rate is then a lower bound)."""


class EvictionRegret:
    __slots__ = ("_recent", "limit", "regretted", "removed")

    def __init__(self, limit: int = REGRET_MEMORY_BLOCKS) -> None:
        check_at_least("limit", limit, 1)
        self.limit = limit
        self._recent: OrderedDict[BlockHash, None] = OrderedDict()
        self.removed = 0
        self.regretted = 0

    def on_removed(self, block_hashes: Iterable[BlockHash]) -> None:
        """An engine dropped ``block_hashes`` from its cache."""
        recent = self._recent
        before = len(recent)
        recent.update(dict.fromkeys(block_hashes))
        self.removed += len(recent) - before
        for _ in range(len(recent) - self.limit):
            recent.popitem(last=False)

    def on_request(self, block_hashes: Sequence[BlockHash]) -> None:
        """A request asks for ``block_hashes``: those remembered are regretted."""
        recent = self._recent
        if not recent or recent.keys().isdisjoint(block_hashes):
            return
        for h in block_hashes:
            if h in recent:
                del recent[h]
                self.regretted += 1

    @property
    def rate(self) -> float:
        """The estimated chance that an evicted block is needed again."""
        return (self.regretted + 1) / (self.removed + 2)
