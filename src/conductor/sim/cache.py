"""An instance's KV block cache: LRU over block hashes with a capacity in blocks.

``insert`` refreshes a request's chain and stores its new blocks; it never evicts blocks of
the chain it is inserting (FAST §3.2.1: LRU "except blocks currently being accessed"), and
returns what it stored and evicted so the simulator can publish KV events.

A prefill that runs takes room for the blocks it will store from the moment it starts
(:meth:`reserve`, as an engine allocates KV for the chunks it computes; vLLM evicts free
cached blocks to do so), and gives it back as it stores them: each computed chunk's blocks
(:meth:`store_held`), the rest when the prompt ends (:meth:`release`, then :meth:`insert`).
Its hits are refreshed when it starts (:meth:`touch`), so the room it takes never evicts its
own prefix.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from itertools import islice

from conductor.core.types import BlockHash


class LruBlockCache:
    __slots__ = ("_lru", "capacity_blocks", "reserved")

    def __init__(self, capacity_blocks: int | None) -> None:
        self.capacity_blocks = capacity_blocks
        self._lru: OrderedDict[BlockHash, None] = OrderedDict()
        self.reserved = 0
        """Blocks held for running prefills (counted against the capacity)."""

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
        keep = self.kept(len(hashes))
        if keep < len(hashes):
            hashes = hashes[:keep]
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
        # the chain now sits at the recent end, so victims are never its own blocks (room
        # held for other prefills may leave the chain over the capacity for now)
        return stored, self.trim(len(hashes))

    def store_held(self, hashes: Sequence[BlockHash], held: int) -> tuple[list[BlockHash], int]:
        """Store the new ``hashes`` of a running prefill (the blocks its latest chunk
        computed, most recent last) in the room it holds: up to ``held`` blocks of
        :meth:`reserve`'s room are given back for them (nothing is evicted for those).
        Returns (newly stored, room given back); blocks already cached are refreshed."""
        lru = self._lru
        if any(map(lru.__contains__, hashes)):
            for h in hashes:
                if h in lru:
                    lru.move_to_end(h)
            new = [h for h in hashes if h not in lru]
        else:
            new = list(hashes)
        give = min(held, len(new))
        self.reserved -= give
        lru.update(dict.fromkeys(new))
        return new, give

    def trim(self, keep_recent: int) -> list[BlockHash]:
        """Evict the least recently used blocks beyond the capacity (room held counted),
        never the ``keep_recent`` most recent; returns them."""
        cap = self.capacity_blocks
        if cap is None:
            return []
        lru = self._lru
        return self._evict_oldest(min(len(lru) + self.reserved - cap, len(lru) - keep_recent))

    def kept(self, n: int) -> int:
        """How many blocks of an ``n``-block chain the cache keeps (a chain longer than
        the cache keeps its head)."""
        cap = self.capacity_blocks
        return n if cap is None or n <= cap else cap

    def touch(self, hashes: Sequence[BlockHash]) -> None:
        """Make the cached ``hashes`` the most recently used (a prefill that reuses them
        started); blocks not cached are ignored."""
        lru = self._lru
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)

    def reserve(self, n: int) -> list[BlockHash]:
        """Hold room for ``n`` blocks a running prefill will store, evicting the least
        recently used blocks beyond the capacity; returns them."""
        self.reserved += n
        cap = self.capacity_blocks
        return [] if cap is None else self._evict_oldest(len(self._lru) + self.reserved - cap)

    def release(self, n: int) -> None:
        """Give back room held by :meth:`reserve` (before the prefill's :meth:`insert`)."""
        self.reserved = max(0, self.reserved - n)

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
        return self._evict_oldest(len(self._lru) + self.reserved - capacity_blocks)

    def remove(self, hashes: Sequence[BlockHash]) -> None:
        for h in hashes:
            self._lru.pop(h, None)
