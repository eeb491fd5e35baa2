"""Hot-spot replication in the background (FAST §4.2 and §1: "the hottest blocks should be
replicated to multiple nodes to avoid fetching congestion").

Algorithm 1 already replicates on demand: a remote fetch leaves a copy on the instance that
fetched. This module adds the proactive rule: a prefix (identified by the hash of its last
block) whose *decayed hit rate* is at least ``min_rate_per_s`` while every instance that
holds it is loaded above ``load_ratio`` x the cluster's mean queue, gets copied from its
least-loaded holder to the least-loaded instance that does not hold it — so the next
requests for it find a cheap local copy instead of queueing behind the holder.

Rates decay exponentially with ``half_life_s``: ``rate <- rate * 2^(-dt/half_life) + 1/half_life``
per hit, which makes ``rate`` an events-per-second estimate. A hot prefix is copied at most
once per ``cooldown_s`` (the KV events confirming a copy take a while to arrive; without the
pause every check would copy it again).
Checks run at most every ``check_every_s`` and look at the ``top_k`` hottest prefixes.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from conductor.core.plan import Migration
from conductor.core.prefix_index import PrefixIndex
from conductor.core.state import InstanceState
from conductor.core.types import BlockHash


@dataclass(frozen=True, slots=True)
class HotspotConfig:
    half_life_s: float = 60.0
    min_rate_per_s: float = 0.05
    load_ratio: float = 1.5
    min_queue_s: float = 1.0
    check_every_s: float = 5.0
    top_k: int = 32
    cooldown_s: float = 30.0
    max_tracked: int = 4096


@dataclass(slots=True)
class _Heat:
    rate: float
    last_s: float
    chain: tuple[BlockHash, ...]


class HotspotTracker:
    def __init__(self, config: HotspotConfig | None = None) -> None:
        self.config = config or HotspotConfig()
        self._heat: dict[BlockHash, _Heat] = {}
        self._next_check_s = 0.0
        self._recent: dict[BlockHash, float] = {}

    def rate(self, key: BlockHash, now_s: float) -> float:
        h = self._heat.get(key)
        if h is None:
            return 0.0
        return h.rate * math.exp2(-(now_s - h.last_s) / self.config.half_life_s)

    def record(self, chain: Sequence[BlockHash], now_s: float) -> None:
        """A request reused the prefix ``chain``."""
        if not chain:
            return
        key = chain[-1]
        hl = self.config.half_life_s
        h = self._heat.get(key)
        if h is None:
            if len(self._heat) >= self.config.max_tracked:
                self._evict(now_s)
            self._heat[key] = _Heat(1.0 / hl, now_s, tuple(chain))
        else:
            h.rate = h.rate * math.exp2(-(now_s - h.last_s) / hl) + 1.0 / hl
            h.last_s = now_s

    def _evict(self, now_s: float) -> None:
        coldest = sorted(self._heat, key=lambda k: self.rate(k, now_s))
        for k in coldest[: len(coldest) // 4 + 1]:
            del self._heat[k]

    def plan(
        self, now_s: float, pool: Sequence[InstanceState], index: PrefixIndex
    ) -> list[Migration]:
        """Background replications due now (empty between checks)."""
        cfg = self.config
        if now_s < self._next_check_s or len(pool) < 2:
            return []
        self._next_check_s = now_s + cfg.check_every_s
        loads = {i.spec.instance_id: i.prefill.queue_s(now_s) for i in pool}
        mean = sum(loads.values()) / len(loads)
        hot = heapq.nlargest(
            cfg.top_k, ((self.rate(k, now_s), k) for k in self._heat), key=lambda x: x[0]
        )
        out: list[Migration] = []
        for rate, key in hot:
            if rate < cfg.min_rate_per_s:
                break
            chain = self._heat[key].chain
            depth = index.match(chain).local_blocks
            holders = [i for i in loads if depth.get(i, 0) >= len(chain)]
            if not holders:
                continue
            source = min(holders, key=lambda i: (loads[i], i))
            if loads[source] <= max(cfg.min_queue_s, cfg.load_ratio * mean):
                continue
            others = [i for i in loads if depth.get(i, 0) < len(chain)]
            if not others:
                continue
            target = min(others, key=lambda i: (loads[i], i))
            if loads[target] >= mean:
                continue
            if now_s < self._recent.get(key, -math.inf):
                continue
            self._recent[key] = now_s + cfg.cooldown_s
            out.append(Migration(source, target, chain))
        return out
