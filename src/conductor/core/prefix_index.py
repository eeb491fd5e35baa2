"""Global prefix index: which holder caches which block, in which tier.

A *holder* is a prefill/decode instance or a store node of the shared KV pool. Every holder
gets a bit slot. For every block hash the index keeps one packed integer with three masks
of ``W`` bits each (``W``, the field width, is a power of two above the highest slot):

* bits ``[0, W)``: *local* (GPU or DRAM: an instance reuses it without a network fetch);
* bits ``[W, 2W)``: *any* tier (GPU, DRAM or STORE: the holder can serve the block);
* bits ``[2W, 3W)``: *GPU* alone.

Matching a request looks each block up once and ANDs the packed masks (the three fields
stay independent under ``&``); a holder's depth in a field is where its bit first drops out.
The per-block work runs in C (``map`` of ``dict.get``, ``accumulate`` of ``&``). The running
AND only ever loses bits, so each field of it is a non-increasing sequence of integers and
the end of each run is found by ``bisect`` (with a C-level key); Python code runs once per
run, i.e. per point where holders drop out. The cost is ``O(prefix length + holders)``
dictionary lookups and integer operations, independent of how many blocks the index holds.

Invariants (asserted by the tests against a brute-force reference):

* ``_held[slot][t]`` is the set of blocks ``slot`` holds in tier ``t``;
* bit ``slot`` of the local / any / GPU field of ``_masks[h]`` is set iff ``h`` is in
  ``_held[slot][t]`` for ``t`` in (GPU, DRAM) / for some ``t`` / for ``t`` = GPU;
* no mask stored is 0, so a GPU bit implies the local bit, and a local bit the any bit;
* a slot is reused only after its holder was removed and all its bits cleared;
* ``_mask_names[m]`` is the holders of the bits of ``m`` in slot order, and
  ``_runs[(m, d)]`` maps each of them to ``d`` (memos, emptied whenever a slot changes
  hands: the same holder sets recur, e.g. everyone holding a shared system prompt).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate, islice, repeat
from operator import and_
from typing import Final

from conductor.core.errors import UnknownInstance
from conductor.core.types import BlockHash, InstanceId, Tier

_TIERS = (Tier.GPU, Tier.DRAM, Tier.STORE)
_MIN_WIDTH = 64
_MASK_MEMO_SIZE = 4096  # entries: holder-name tuples, mostly short
_RUN_MEMO_SIZE = 256  # entries: dicts of at least _RUN_MEMO_MIN_HOLDERS holders
_RUN_MEMO_MIN_HOLDERS = 8  # runs of fewer holders are built directly


@dataclass(slots=True, init=False, unsafe_hash=True)
class PrefixMatch:
    """Result of :meth:`PrefixIndex.match`, in blocks (convert with :meth:`tokens`).

    ``local_blocks[h]``: leading blocks holder ``h`` holds in its own GPU or DRAM.
    ``gpu_blocks[h]``: leading blocks it holds in GPU memory alone.
    ``best_blocks`` / ``best_holders``: the longest prefix a single holder has in any tier
    (store nodes included) and every holder that has it, in slot order.
    ``union_blocks``: leading blocks held somewhere (possibly spread over several holders).
    Holders with a zero depth are absent from the dicts.
    """

    n_blocks: Final[int]
    local_blocks: Final[dict[InstanceId, int]]
    gpu_blocks: Final[dict[InstanceId, int]]
    best_blocks: Final[int]
    best_holders: Final[tuple[InstanceId, ...]]
    union_blocks: Final[int]

    def __init__(
        self,
        n_blocks: int,
        local_blocks: dict[InstanceId, int],
        gpu_blocks: dict[InstanceId, int],
        best_blocks: int,
        best_holders: tuple[InstanceId, ...],
        union_blocks: int,
    ) -> None:
        self.n_blocks = n_blocks
        self.local_blocks = local_blocks
        self.gpu_blocks = gpu_blocks
        self.best_blocks = best_blocks
        self.best_holders = best_holders
        self.union_blocks = union_blocks

    def local(self, holder: InstanceId) -> int:
        return self.local_blocks.get(holder, 0)


def _bits(mask: int) -> Iterable[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class PrefixIndex:
    """Block hash -> holders by tier, fed by KV events; see the module docstring."""

    __slots__ = (
        "_free",
        "_held",
        "_mask_names",
        "_masks",
        "_names",
        "_remove_bits",
        "_runs",
        "_slots",
        "_width",
    )

    def __init__(self) -> None:
        self._slots: dict[InstanceId, int] = {}
        self._names: list[InstanceId | None] = []
        self._free: list[int] = []
        self._width = _MIN_WIDTH
        self._masks: dict[int, int] = {}
        self._held: list[tuple[set[int], set[int], set[int]]] = []
        self._mask_names: dict[int, tuple[InstanceId, ...]] = {}
        self._runs: dict[tuple[int, int], dict[InstanceId, int]] = {}
        self._remove_bits: dict[tuple[int, int, int], tuple[int, dict[tuple[bool, bool], int]]] = {}

    # -- holders -------------------------------------------------------------------------
    def add_holder(self, holder: InstanceId) -> None:
        """Register ``holder`` (idempotent)."""
        if holder in self._slots:
            return
        self._forget_names()
        if self._free:
            slot = min(self._free)
            self._free.remove(slot)
            self._names[slot] = holder
            self._held[slot] = (set(), set(), set())
        else:
            slot = len(self._names)
            self._names.append(holder)
            self._held.append((set(), set(), set()))
            if slot >= self._width:
                self._widen(2 * self._width)
        self._slots[holder] = slot

    def remove_holder(self, holder: InstanceId) -> None:
        """Forget ``holder`` and every block it held."""
        self.clear(holder)
        slot = self._slots.pop(holder)
        self._forget_names()
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

    def _widen(self, width: int) -> None:
        """Repack every mask with fields of ``width`` bits (once per doubling of holders)."""
        old = self._width
        field = (1 << old) - 1
        masks = self._masks
        for h, m in masks.items():
            masks[h] = (m & field) | ((m >> old) & field) << width | (m >> 2 * old) << 2 * width
        # (fields keep their order: local, any, GPU)
        self._width = width

    def _bits_for(self, slot: int, tiers: Iterable[int]) -> int:
        """The packed bits of ``slot`` holding a block in ``tiers``."""
        bit = 1 << slot
        w = self._width
        out = 0
        for t in tiers:
            out |= bit << w  # any tier
            if t != Tier.STORE:
                out |= bit  # local
                if t == Tier.GPU:
                    out |= bit << 2 * w
        return out

    # -- events --------------------------------------------------------------------------
    def store(self, holder: InstanceId, block_hashes: Sequence[BlockHash], tier: Tier) -> None:
        """``holder`` caches ``block_hashes`` in ``tier``."""
        slot = self._slot(holder)
        bits = self._bits_for(slot, (tier,))
        masks = self._masks
        get = masks.get
        for h in block_hashes:
            masks[h] = get(h, 0) | bits
        self._held[slot][tier].update(block_hashes)

    def remove(self, holder: InstanceId, block_hashes: Iterable[BlockHash], tier: Tier) -> None:
        """``holder`` evicted ``block_hashes`` from ``tier`` (unknown hashes are ignored)."""
        self._remove_slot(self._slot(holder), block_hashes, tier)

    def _remove_slot(self, slot: int, block_hashes: Iterable[int], tier: Tier) -> None:
        held = self._held[slot]
        mine = held[tier]
        a, b = (t for t in _TIERS if t != tier)
        held_a, held_b = held[a], held[b]
        key = (slot, tier, self._width)  # the bits depend on nothing else
        bits = self._remove_bits.get(key)
        if bits is None:
            # the slot's bits a block keeps, by whether the slot still holds it in tier a / b
            keep = {
                (in_a, in_b): self._bits_for(slot, [t for t, k in ((a, in_a), (b, in_b)) if k])
                for in_a in (False, True)
                for in_b in (False, True)
            }
            bits = self._remove_bits[key] = (~self._bits_for(slot, _TIERS), keep)
        drop, keep = bits
        masks = self._masks
        for h in block_hashes:
            if h not in mine:
                continue
            mine.discard(h)
            m = (masks[h] & drop) | keep[h in held_a, h in held_b]
            if m:
                masks[h] = m
            else:
                del masks[h]

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

    def local_count(self, holder: InstanceId) -> int:
        """Blocks ``holder`` holds in its GPU and DRAM tiers (a block in both counts twice;
        store nodes' tier not counted): what fills its own cache."""
        held = self._held[self._slot(holder)]
        return len(held[Tier.GPU]) + len(held[Tier.DRAM])

    def holds(self, holder: InstanceId, block_hash: BlockHash, tier: Tier) -> bool:
        return block_hash in self._held[self._slot(holder)][tier]

    def holders_of(self, block_hash: BlockHash) -> dict[InstanceId, tuple[Tier, ...]]:
        """Every holder of ``block_hash`` with its tiers (for reports and tests)."""
        w = self._width
        anyone = (self._masks.get(block_hash, 0) >> w) & ((1 << w) - 1)
        out: dict[InstanceId, list[Tier]] = {}
        for t in _TIERS:
            for slot in _bits(anyone):
                name = self._names[slot]
                if name is not None and block_hash in self._held[slot][t]:
                    out.setdefault(name, []).append(t)
        return {k: tuple(v) for k, v in out.items()}

    def match(self, block_hashes: Sequence[BlockHash]) -> PrefixMatch:
        """Per-holder prefix depths of ``block_hashes``; see :class:`PrefixMatch`."""
        n = len(block_hashes)
        masks = list(map(self._masks.get, block_hashes, repeat(0)))
        # union: leading blocks held by someone (a packed mask is 0 iff its any field is)
        union = masks.index(0) if 0 in masks else n
        if not union:
            return PrefixMatch(n, {}, {}, 0, (), 0)
        # acc[k]: per field, the holders of blocks 0..k; it only ever loses bits
        acc = list(accumulate(islice(masks, union), and_))
        # the any field empties with the whole mask (GPU bits imply local bits imply any)
        best = acc.index(0) if not acc[-1] else union
        w = self._width
        field = (1 << w) - 1
        best_holders = self._holders_in((acc[best - 1] >> w) & field)
        acc.reverse()  # each field ascends now
        return PrefixMatch(
            n,
            self._depths(acc, field.__and__),
            self._depths(acc, (2 * w).__rrshift__),
            best,
            best_holders,
            union,
        )

    def _depths(self, ascending: list[int], key: Callable[[int], int]) -> dict[InstanceId, int]:
        """Per-holder depths from a running AND of packed masks, given in reverse (so its
        ``key`` field ascends) with ``key`` extracting the field: holder ``s`` holds blocks
        ``0..k`` iff its bit is set in the field of ``acc[k]``. Holders come in order of
        depth, then slot.

        A field only loses bits along ``acc``, so its values never increase; the run of
        the current value ``cur`` ends at ``end - bisect_left(ascending, cur, key=key)``.
        """
        out: dict[InstanceId, int] = {}
        end = len(ascending)
        cur = key(ascending[-1])  # the field of acc[0]
        while cur:
            stop = end - bisect_left(ascending, cur, key=key)  # first acc index without cur
            nxt = key(ascending[end - 1 - stop]) if stop < end else 0
            gone = cur ^ nxt
            if gone.bit_count() < _RUN_MEMO_MIN_HOLDERS:
                run = dict.fromkeys(self._holders_in(gone), stop)
            else:  # e.g. all but a few holders of a shared first block: copy, then remove
                run = self._run(cur, stop)
                for h in self._holders_in(nxt):  # these go deeper: listed with a later run
                    del run[h]
            if out:
                out.update(run)
            else:
                out = run
            cur = nxt
        return out

    def _run(self, mask: int, depth: int) -> dict[InstanceId, int]:
        """A new dict mapping the holders of ``mask`` to ``depth``, in slot order (copied
        from a memo: the same large holder sets recur, and a copy is cheaper than a build)."""
        memo = self._runs
        run = memo.get((mask, depth))
        if run is None:
            if len(memo) >= _RUN_MEMO_SIZE:
                memo.clear()
            run = memo[(mask, depth)] = dict.fromkeys(self._holders_in(mask), depth)
        return run.copy()

    def _forget_names(self) -> None:
        self._mask_names.clear()
        self._runs.clear()

    def _holders_in(self, mask: int) -> tuple[InstanceId, ...]:
        """The holders of the bits of ``mask``, in slot order (memoised: masks repeat)."""
        memo = self._mask_names
        holders = memo.get(mask)
        if holders is None:
            if len(memo) >= _MASK_MEMO_SIZE:
                memo.clear()
            names = self._names
            holders = tuple(h for s in _bits(mask) if (h := names[s]) is not None)
            memo[mask] = holders
        return holders
