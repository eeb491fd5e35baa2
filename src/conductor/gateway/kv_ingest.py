"""Turn one engine's decoded KV events into canonical core events (pure: no sockets, no clock).

:class:`EngineHashMapper` (one per engine) maps the engine's block hashes to *our* chained
block hashes, recomputed from the token ids the engine publishes, and translates
:mod:`conductor.wire.events` into :mod:`conductor.core.events` with ``holder`` = the engine's
instance id. The order of the engine's batches (gaps, replays, restarts) is
:mod:`conductor.gateway.kv_feed`'s business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from conductor.core.events import AllBlocksCleared, BlocksRemoved, BlocksStored, KvEvent
from conductor.core.types import BlockHash, InstanceId, Tier
from conductor.wire.events import (
    EngineAllBlocksCleared,
    EngineBlockHash,
    EngineBlockRemoved,
    EngineBlockStored,
    EngineEvent,
    EngineUnknownEvent,
)

HashFn = Callable[[BlockHash | None, Sequence[int], tuple[object, ...]], BlockHash]
"""``hash_fn(parent, block_token_ids, extra_keys) -> our hash`` (``core.hashing.hash_block``)."""

DEFAULT_MEDIUM_TIERS: Mapping[str, Tier] = {
    "GPU": Tier.GPU,
    "CUDA": Tier.GPU,
    "XPU": Tier.GPU,
    "HPU": Tier.GPU,
    "CPU": Tier.DRAM,
    "CPU_TIER": Tier.DRAM,
    "DRAM": Tier.DRAM,
    "STORE": Tier.STORE,
}
"""Engine ``medium`` (upper-cased) -> our tier. ``None`` (unspecified) means GPU."""


@dataclass(slots=True)
class MapperStats:
    """What the mapper had to skip, by reason (each counts events, not blocks)."""

    missing_parent: int = 0
    """BlockStored whose parent engine hash we never saw (or already forgot): skipped."""
    bad_length: int = 0
    """BlockStored whose token count is not ``len(block_hashes) * block_size``: skipped."""
    unknown_medium: int = 0
    """Events on a medium with no tier mapping: skipped."""
    other_group: int = 0
    """Events of a KV-cache group other than the tracked one (hybrid models): skipped."""
    unknown_removed: int = 0
    """Block hashes in BlockRemoved that were not mapped (counts hashes)."""
    unknown_type: int = 0
    """Events of a type the decoder does not know (newer engines): skipped."""
    over_capacity: int = 0
    """BlockStored that would make the engine claim more than ``max_blocks``: skipped."""

    def by_reason(self) -> dict[str, int]:
        return {
            "missing_parent": self.missing_parent,
            "bad_length": self.bad_length,
            "unknown_medium": self.unknown_medium,
            "other_group": self.other_group,
            "unknown_type": self.unknown_type,
            "over_capacity": self.over_capacity,
        }


class EngineHashMapper:
    """Maps one engine's block hashes to ours and translates its events into core events.

    Our hash of a stored block is ``hash_fn(parent, tokens, extra)``, chained from the parent
    block's *our* hash, so two engines that cache the same tokens report the same hashes to
    the index even if their own hashes differ (vLLM seeds its hashes per process).

    Invariants:

    - every engine hash in the map was reported stored in at least one tier and not removed
      from all of them since; ``len(self)`` is the number of such hashes;
    - ``self.ours(e)`` is the chained hash of the tokens the engine stored under ``e``;
    - a BlockStored is translated whole or not at all (a skipped event changes nothing);
    - ``len(self) <= max_blocks`` (when given): what one engine may claim is bounded by its
      KV capacity, whatever reaches its event port.
    """

    def __init__(
        self,
        holder: InstanceId,
        hash_fn: HashFn,
        *,
        group_idx: int = 0,
        medium_tiers: Mapping[str, Tier] = DEFAULT_MEDIUM_TIERS,
        max_blocks: int | None = None,
    ) -> None:
        self.holder = holder
        self.max_blocks = max_blocks
        self._hash_fn = hash_fn
        self._group_idx = group_idx
        self._medium_tiers = {k.upper(): v for k, v in medium_tiers.items()}
        self._ours: dict[EngineBlockHash, BlockHash] = {}
        self._tiers: dict[EngineBlockHash, set[Tier]] = {}
        self.stats = MapperStats()

    def __len__(self) -> int:
        return len(self._ours)

    def ours(self, engine_hash: EngineBlockHash) -> BlockHash | None:
        """Our hash for ``engine_hash``, or None if it is not (or no longer) mapped."""
        return self._ours.get(engine_hash)

    def clear(self) -> None:
        """Forget every mapping (the engine cleared its cache or restarted)."""
        self._ours.clear()
        self._tiers.clear()

    def translate(self, event: EngineEvent, seq: int | None = None) -> KvEvent | None:
        """The core event for ``event`` (``seq`` attached), or None if it is skipped or empty."""
        if isinstance(event, EngineBlockStored):
            return self._stored(event, seq)
        if isinstance(event, EngineBlockRemoved):
            return self._removed(event, seq)
        if isinstance(event, EngineAllBlocksCleared):
            self.clear()
            return AllBlocksCleared(holder=self.holder, tier=None, seq=seq)
        if isinstance(event, EngineUnknownEvent):
            self.stats.unknown_type += 1
            return None
        raise TypeError(f"not an engine event: {event!r}")

    def translate_all(self, events: Sequence[EngineEvent], seq: int | None = None) -> list[KvEvent]:
        """Translate a batch in order, dropping skipped events."""
        out: list[KvEvent] = []
        for event in events:
            translated = self.translate(event, seq)
            if translated is not None:
                out.append(translated)
        return out

    def tier_of(self, medium: str | None) -> Tier | None:
        """Our tier for an engine medium (None for GPU), or None if unmapped."""
        if medium is None:
            return Tier.GPU
        return self._medium_tiers.get(medium.upper())

    def _tracked_group(self, group_idx: int | None) -> bool:
        if group_idx is None or group_idx == self._group_idx:
            return True
        self.stats.other_group += 1
        return False

    def _stored(self, event: EngineBlockStored, seq: int | None) -> BlocksStored | None:
        if not self._tracked_group(event.group_idx):
            return None
        tier = self.tier_of(event.medium)
        if tier is None:
            self.stats.unknown_medium += 1
            return None
        n, size = len(event.engine_hashes), event.block_size
        if n == 0 or len(event.token_ids) != n * size:
            self.stats.bad_length += 1
            return None
        if self.max_blocks is not None and len(self._ours) + n > self.max_blocks:
            new = sum(1 for h in event.engine_hashes if h not in self._ours)
            if len(self._ours) + new > self.max_blocks:
                self.stats.over_capacity += 1
                return None
        parent: BlockHash | None = None
        if event.parent_engine_hash is not None:
            parent = self._ours.get(event.parent_engine_hash)
            if parent is None:
                self.stats.missing_parent += 1
                return None
        extras = event.extra_keys
        ours: list[BlockHash] = []
        for i, engine_hash in enumerate(event.engine_hashes):
            extra = extras[i] if i < len(extras) else None
            parent = self._hash_fn(parent, event.token_ids[i * size : (i + 1) * size], extra or ())
            ours.append(parent)
            self._ours[engine_hash] = parent
            self._tiers.setdefault(engine_hash, set()).add(tier)
        return BlocksStored(holder=self.holder, block_hashes=tuple(ours), tier=tier, seq=seq)

    def _removed(self, event: EngineBlockRemoved, seq: int | None) -> BlocksRemoved | None:
        if not self._tracked_group(event.group_idx):
            return None
        tier = self.tier_of(event.medium)
        if tier is None:
            self.stats.unknown_medium += 1
            return None
        ours: list[BlockHash] = []
        for engine_hash in event.engine_hashes:
            tiers = self._tiers.get(engine_hash)
            if tiers is None or tier not in tiers:
                self.stats.unknown_removed += 1
                continue
            ours.append(self._ours[engine_hash])
            tiers.discard(tier)
            if not tiers:
                del self._tiers[engine_hash]
                del self._ours[engine_hash]
        if not ours:
            return None
        return BlocksRemoved(holder=self.holder, block_hashes=tuple(ours), tier=tier, seq=seq)
