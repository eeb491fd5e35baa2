"""An instance's KV block cache: LRU over block hashes with a capacity in blocks.

``insert`` refreshes a request's chain and stores its new blocks; it never evicts blocks of
the chain it is inserting (FAST §3.2.1: LRU "except blocks currently being accessed"), and
returns what it stored and evicted so the simulator can publish KV events.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from itertools import islice

from conductor.core.types import BlockHash


class LruBlockCache:
    __slots__ = ("_lru", "capacity_blocks")

    def __init__(self, capacity_blocks: int | None) -> None:
        self.capacity_blocks = capacity_blocks
        self._lru: OrderedDict[BlockHash, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, h: object) -> bool:
        return h in self._lru

    def prefix_blocks(self, hashes: Sequence[BlockHash]) -> int:
        """How many leading ``hashes`` are cached."""
        lru = self._lru
        n = 0
        for h in hashes:
            if h not in lru:
                break
            n += 1
        return n

    def insert(self, hashes: Sequence[BlockHash]) -> tuple[list[BlockHash], list[BlockHash]]:
        """Insert/refresh ``hashes`` (most recent last); returns (newly stored, evicted).

        Blocks of this call are never evicted by it: a chain longer than the capacity keeps
        its head (the reusable part) and drops the tail.
        """
        lru = self._lru
        cap = self.capacity_blocks
        if cap is not None and len(hashes) > cap:
            hashes = hashes[:cap]
        stored: list[BlockHash]
        if not any(map(lru.__contains__, hashes)):  # all new: appended in order, in C
            lru.update(dict.fromkeys(hashes))
            stored = list(hashes)
        else:
            stored = []
            for h in hashes:
                if h in lru:
                    lru.move_to_end(h)
                else:
                    lru[h] = None
                    stored.append(h)
        evicted: list[BlockHash] = []
        if cap is not None:
            # the chain now sits at the recent end, so victims are never its own blocks
            evicted = self._evict_oldest(len(lru) - cap)
        return stored, evicted

    def _evict_oldest(self, n: int) -> list[BlockHash]:
        """Drop the ``n`` least recently used blocks (none if ``n <= 0``); returns them."""
        if n <= 0:
            return []
        lru = self._lru
        victims = list(islice(lru, n))  # oldest first
        deque(map(lru.__delitem__, victims), maxlen=0)
        return victims

    def shrink(self, capacity_blocks: int) -> list[BlockHash]:
        """Set the capacity and evict the least recently used blocks beyond it."""
        self.capacity_blocks = capacity_blocks
        return self._evict_oldest(len(self._lru) - capacity_blocks)

    def remove(self, hashes: Sequence[BlockHash]) -> None:
        for h in hashes:
            self._lru.pop(h, None)
