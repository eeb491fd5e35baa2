"""Simulator configuration (frozen; built once by the CLI)."""

from __future__ import annotations

from dataclasses import dataclass, field

from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import DEFAULT_PRESET, CostModel, preset
from conductor.core.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class SimConfig:
    """A simulated cluster.

    ``cache_capacity_tokens``: each prefill instance's DRAM KV cache (LRU), 3M tokens as in
    FAST §5.3.2; ``None`` means unbounded. ``kv_event_delay_s``: how late the scheduler sees
    KV events (stale state). ``prefill_noise``: relative std-dev of a seeded log-normal error
    between the cost model's prediction and the simulated execution (0 = exact).
    ``load_sample_every_s``: sample prefill/decode load this often (0 = never).
    ``replica_sample_every_s``: sample how many prefill caches hold the blocks ranked
    ``replica_ranks`` by use in the whole trace (FAST Fig. 11; 0 = never).
    """

    policy: str = "mooncake"
    n_prefill: int = 8
    n_decode: int = 8
    cost: CostModel = field(default_factory=lambda: preset(DEFAULT_PRESET))
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache_capacity_tokens: int | None = 3_000_000
    kv_event_delay_s: float = 0.0
    prefill_noise: float = 0.0
    seed: int = 0
    load_sample_every_s: float = 0.0
    replica_sample_every_s: float = 0.0
    replica_ranks: tuple[int, ...] = (10, 100, 1000)

    def __post_init__(self) -> None:
        if self.n_prefill <= 0:
            raise InvalidInput("prefill", self.n_prefill, "must be >= 1")
        if self.n_decode <= 0:
            raise InvalidInput("decode", self.n_decode, "must be >= 1")
        if self.cache_capacity_tokens is not None and self.cache_capacity_tokens < 0:
            raise InvalidInput("cache_capacity_tokens", self.cache_capacity_tokens, "must be >= 0")
        if self.kv_event_delay_s < 0:
            raise InvalidInput("kv_event_delay_s", self.kv_event_delay_s, "must be >= 0")
        if self.prefill_noise < 0:
            raise InvalidInput("prefill_noise", self.prefill_noise, "must be >= 0")

    @property
    def cache_capacity_blocks(self) -> int | None:
        if self.cache_capacity_tokens is None:
            return None
        return self.cache_capacity_tokens // self.scheduler.block_size_tokens
