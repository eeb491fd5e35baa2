"""Global prefix index: which holder caches which block, in which tier.

A *holder* is a prefill/decode instance or a store node of the shared KV pool. Every holder
gets a bit slot; for every block hash the index keeps one bitmask per tier (GPU, DRAM,
STORE) and a derived *local* mask (GPU | DRAM: blocks an instance can reuse without a
network fetch). Matching a request walks its block hashes once, ANDing masks, and records
where each holder drops out, so its cost is ``O(prefix length + holders)`` dictionary
lookups and integer operations, independent of how many blocks the index holds.

Invariants (asserted by the tests against a brute-force reference):

* ``bit(slot)`` is set in ``_tier[t][h]`` iff ``h in _held[slot][t]``;
* ``_local[h]`` == ``_tier[GPU][h] | _tier[DRAM][h]`` and no mask stored is 0;
* a slot is reused only after its holder was removed and all its bits cleared.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from conductor.core.errors import UnknownInstance
from conductor.core.types import BlockHash, InstanceId, Tier

_TIERS = (Tier.GPU, Tier.DRAM, Tier.STORE)


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """Result of :meth:`PrefixIndex.match`, in blocks (convert with :meth:`tokens`).

    ``local_blocks[h]``: leading blocks holder ``h`` holds in its own GPU or DRAM.
    ``gpu_blocks[h]``: leading blocks it holds in GPU memory alone.
    ``best_blocks`` / ``best_holders``: the longest prefix a single holder has in any tier
    (store nodes included) and every holder that has it, in slot order.
    ``union_blocks``: leading blocks held somewhere (possibly spread over several holders).
    Holders with a zero depth are absent from the dicts.
    """

    n_blocks: int
    local_blocks: dict[InstanceId, int]
    gpu_blocks: dict[InstanceId, int]
    best_blocks: int
    best_holders: tuple[InstanceId, ...]
    union_blocks: int

    def local(self, holder: InstanceId) -> int:
        return self.local_blocks.get(holder, 0)


def _bits(mask: int) -> Iterable[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class PrefixIndex:
    """Block hash -> holders by tier, fed by KV events; see the module docstring."""

    __slots__ = ("_free", "_held", "_local", "_names", "_slots", "_tier")

    def __init__(self) -> None:
        self._slots: dict[InstanceId, int] = {}
        self._names: list[InstanceId | None] = []
        self._free: list[int] = []
        self._tier: tuple[dict[int, int], dict[int, int], dict[int, int]] = ({}, {}, {})
        self._local: dict[int, int] = {}
        self._held: list[tuple[set[int], set[int], set[int]]] = []

    # -- holders -------------------------------------------------------------------------
    def add_holder(self, holder: InstanceId) -> None:
        """Register ``holder`` (idempotent)."""
        if holder in self._slots:
            return
        if self._free:
            slot = min(self._free)
            self._free.remove(slot)
            self._names[slot] = holder
            self._held[slot] = (set(), set(), set())
        else:
            slot = len(self._names)
            self._names.append(holder)
            self._held.append((set(), set(), set()))
        self._slots[holder] = slot

    def remove_holder(self, holder: InstanceId) -> None:
        """Forget ``holder`` and every block it held."""
        self.clear(holder)
        slot = self._slots.pop(holder)
        self._names[slot] = None
        self._free.append(slot)

    def holders(self) -> list[InstanceId]:
        return [n for n in self._names if n is not None]

    def __contains__(self, holder: object) -> bool:
        return holder in self._slots

    def _slot(self, holder: InstanceId) -> int:
        try:
            return self._slots[holder]
        except KeyError:
            raise UnknownInstance(holder) from None

    # -- events --------------------------------------------------------------------------
    def store(self, holder: InstanceId, block_hashes: Sequence[BlockHash], tier: Tier) -> None:
        """``holder`` caches ``block_hashes`` in ``tier``."""
        slot = self._slot(holder)
        bit = 1 << slot
        t = int(tier)
        d = self._tier[t]
        get = d.get
        for h in block_hashes:
            d[h] = get(h, 0) | bit
        if t != Tier.STORE:
            loc = self._local
            lget = loc.get
            for h in block_hashes:
                loc[h] = lget(h, 0) | bit
        self._held[slot][t].update(block_hashes)

    def remove(self, holder: InstanceId, block_hashes: Iterable[BlockHash], tier: Tier) -> None:
        """``holder`` evicted ``block_hashes`` from ``tier`` (unknown hashes are ignored)."""
        self._remove_slot(self._slot(holder), block_hashes, tier)

    def _remove_slot(self, slot: int, block_hashes: Iterable[int], tier: Tier) -> None:
        bit = 1 << slot
        t = int(tier)
        held = self._held[slot][t]
        d = self._tier[t]
        other = self._tier[1 - t] if t != Tier.STORE else None
        loc = self._local
        for h in block_hashes:
            if h not in held:
                continue
            held.discard(h)
            m = d[h] & ~bit
            if m:
                d[h] = m
            else:
                del d[h]
            if other is not None and not other.get(h, 0) & bit:
                lm = loc[h] & ~bit
                if lm:
                    loc[h] = lm
                else:
                    del loc[h]

    def clear(self, holder: InstanceId, tier: Tier | None = None) -> None:
        """Drop every block of ``holder`` (in ``tier``, or in all tiers)."""
        slot = self._slot(holder)
        for t in _TIERS if tier is None else (tier,):
            held = self._held[slot][t]
            if held:
                self._remove_slot(slot, list(held), t)

    # -- queries -------------------------------------------------------------------------
    def count(self, holder: InstanceId, tier: Tier | None = None) -> int:
        """How many blocks ``holder`` holds (in ``tier`` or in all tiers together)."""
        held = self._held[self._slot(holder)]
        if tier is not None:
            return len(held[tier])
        return len(held[0] | held[1] | held[2])

    def holds(self, holder: InstanceId, block_hash: BlockHash, tier: Tier) -> bool:
        return block_hash in self._held[self._slot(holder)][tier]

    def holders_of(self, block_hash: BlockHash) -> dict[InstanceId, tuple[Tier, ...]]:
        """Every holder of ``block_hash`` with its tiers (for reports and tests)."""
        out: dict[InstanceId, list[Tier]] = {}
        for t in _TIERS:
            for slot in _bits(self._tier[t].get(block_hash, 0)):
                name = self._names[slot]
                assert name is not None
                out.setdefault(name, []).append(t)
        return {k: tuple(v) for k, v in out.items()}

    def match(self, block_hashes: Sequence[BlockHash]) -> PrefixMatch:
        """Per-holder prefix depths of ``block_hashes``; see :class:`PrefixMatch`."""
        n = len(block_hashes)
        names = self._names
        local_get = self._local.get
        gpu_get = self._tier[Tier.GPU].get
        store = self._tier[Tier.STORE]
        store_get = store.get
        local_depth: dict[InstanceId, int] = {}
        gpu_depth: dict[InstanceId, int] = {}
        best = 0
        best_mask = 0
        union = -1
        if n == 0:
            return PrefixMatch(0, local_depth, gpu_depth, 0, (), 0)
        h0 = block_hashes[0]
        a_loc = local_get(h0, 0)
        a_gpu = gpu_get(h0, 0)
        a_any = a_loc | store_get(h0, 0) if store else a_loc
        if not a_any:
            return PrefixMatch(n, local_depth, gpu_depth, 0, (), 0)
        pos = 1
        while pos < n and (a_any or union < 0):
            h = block_hashes[pos]
            m_loc = local_get(h, 0)
            m_any = m_loc | store_get(h, 0) if store else m_loc
            if union < 0 and not m_any:
                union = pos
            if a_loc:
                nl = a_loc & m_loc
                if nl != a_loc:
                    for s in _bits(a_loc ^ nl):
                        local_depth[names[s]] = pos  # type: ignore[index]
                    a_loc = nl
            if a_gpu:
                ng = a_gpu & gpu_get(h, 0)
                if ng != a_gpu:
                    for s in _bits(a_gpu ^ ng):
                        gpu_depth[names[s]] = pos  # type: ignore[index]
                    a_gpu = ng
            if a_any:
                na = a_any & m_any
                if not na:
                    best, best_mask = pos, a_any
                a_any = na
            pos += 1
        if union < 0:
            union = pos
        for s in _bits(a_loc):
            local_depth[names[s]] = pos  # type: ignore[index]
        for s in _bits(a_gpu):
            gpu_depth[names[s]] = pos  # type: ignore[index]
        if a_any:
            best, best_mask = pos, a_any
        holders = tuple(names[s] for s in _bits(best_mask))
        return PrefixMatch(n, local_depth, gpu_depth, best, holders, union)  # type: ignore[arg-type]
