"""The emulated engine's KV block pool with a prefix cache (vLLM ``BlockPool`` semantics).

A block is either *private* (allocated to one request, not yet full or not yet computed, no
hash) or *cached* (full, computed, known by its engine hash, shareable). A cached block with
no request using it stays cached but is *evictable*; evictable blocks are reused least
recently freed first, and a request frees its blocks tail first, so the tail of a chain is
evicted before its head (as vLLM's free-block queue does).

Admission reserves every block a request may still need (prompt and ``max_tokens``), so an
admitted request never waits for memory and nothing is ever preempted.

Events (:class:`Stored`, :class:`Removed`, :class:`Cleared`) accumulate in order and are
taken once per step with :meth:`BlockPool.take_events` (vLLM ``BlockPool.take_events``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stored:
    """Blocks ``hashes`` (consecutive in one chain, after ``parent``) became cached."""

    hashes: tuple[int, ...]
    parent: int | None
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Removed:
    """Cached blocks evicted (vLLM publishes one event per evicted block)."""

    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Cleared:
    """Every cached block was dropped."""


CacheEvent = Stored | Removed | Cleared


class BlockPool:
    """``capacity`` blocks: private ones, cached ones (pinned or evictable) and free ones.

    Invariants (asserted by :meth:`check`):

    - ``private + len(cached) <= capacity`` (the rest are free and uncached);
    - ``evictable`` holds exactly the cached hashes whose reference count is 0, least
      recently freed first;
    - ``private + pinned + reserved <= capacity`` with ``pinned = len(cached) -
      len(evictable)``: every reservation can be honoured, by evicting if need be.
    """

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be > 0, got {capacity}")
        self.capacity = capacity
        self.private = 0
        self.reserved = 0
        self._refs: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._events: list[CacheEvent] = []

    # -- queries ---------------------------------------------------------------------------

    @property
    def cached(self) -> int:
        return len(self._refs)

    @property
    def pinned(self) -> int:
        return len(self._refs) - len(self._evictable)

    @property
    def used(self) -> int:
        """Blocks holding some running request's KV (what vLLM's usage gauge counts)."""
        return self.private + self.pinned

    @property
    def usage(self) -> float:
        return self.used / self.capacity

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._refs

    def refs(self, block_hash: int) -> int:
        return self._refs.get(block_hash, 0)

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading ``hashes`` are cached (the reusable prefix, in blocks)."""
        n = 0
        for h in hashes:
            if h not in self._refs:
                break
            n += 1
        return n

    def can_admit(self, hits: Sequence[int], new_blocks: int) -> bool:
        """Whether pinning ``hits`` and reserving ``new_blocks`` more keeps the invariants."""
        revived = sum(1 for h in hits if h in self._evictable)
        room = self.capacity - self.private - self.pinned - self.reserved - revived
        return new_blocks <= room

    # -- changes ---------------------------------------------------------------------------

    def pin(self, block_hash: int) -> None:
        """One more user of a cached block (no longer evictable)."""
        refs = self._refs[block_hash]
        if refs == 0:
            del self._evictable[block_hash]
        self._refs[block_hash] = refs + 1

    def unpin(self, block_hash: int) -> None:
        """One user fewer; at zero the block becomes the most recently freed evictable one."""
        refs = self._refs[block_hash] - 1
        self._refs[block_hash] = refs
        if refs == 0:
            self._evictable[block_hash] = None

    def reserve(self, n: int) -> None:
        self.reserved += n

    def unreserve(self, n: int) -> None:
        if n > self.reserved:
            raise ValueError(f"unreserving {n} blocks, only {self.reserved} reserved")
        self.reserved -= n

    def take(self) -> None:
        """Turn one reserved block into a private one, evicting the LRU cached block if no
        free uncached block is left."""
        if self.reserved <= 0:
            raise ValueError("take() without a reservation")
        if self.private + len(self._refs) >= self.capacity:
            victim, _ = self._evictable.popitem(last=False)
            del self._refs[victim]
            self._events.append(Removed((victim,)))
        self.reserved -= 1
        self.private += 1

    def free_private(self, n: int = 1) -> None:
        if n > self.private:
            raise ValueError(f"freeing {n} private blocks, only {self.private} allocated")
        self.private -= n

    def promote(self, block_hash: int) -> bool:
        """A private block became full and computed: cache it under ``block_hash``, pinned by
        its request. If that hash is already cached (another request computed the same
        tokens), the private block is freed and the cached one pinned instead. Returns
        whether the hash is new (and so must be published)."""
        self.free_private(1)
        if block_hash in self._refs:
            self.pin(block_hash)
            return False
        self._refs[block_hash] = 1
        return True

    def release(self, hashes: Iterable[int]) -> None:
        """Unpin a request's cached blocks, given tail first."""
        for h in hashes:
            self.unpin(h)

    def emit(self, event: CacheEvent) -> None:
        self._events.append(event)

    def clear(self) -> bool:
        """Drop every cached block if none is in use (vLLM ``reset_prefix_cache``)."""
        if self.pinned or self.private:
            return False
        self._refs.clear()
        self._evictable.clear()
        self._events.append(Cleared())
        return True

    def take_events(self) -> list[CacheEvent]:
        events, self._events = self._events, []
        return events

    def check(self) -> None:
        """Assert the invariants (tests)."""
        assert self.private >= 0
        assert self.reserved >= 0
        assert self.private + len(self._refs) <= self.capacity
        assert all(self._refs[h] == 0 for h in self._evictable)
        assert sum(1 for r in self._refs.values() if r == 0) == len(self._evictable)
        assert all(r >= 0 for r in self._refs.values())
        assert self.private + self.pinned + self.reserved <= self.capacity
