"""Scheduler configuration: one frozen dataclass, built once by the shell, units in names."""

from __future__ import annotations

from dataclasses import dataclass, field

from conductor.core.errors import InvalidInput

ADMISSION_MODES = ("off", "baseline", "early", "predictive")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Knobs of :class:`conductor.core.scheduler.Scheduler`.

    ``kvcache_balancing_threshold``: Algorithm 1 fetches the best remote prefix to an
    instance when ``best_prefix / local_prefix > threshold`` (a zero local prefix counts as
    an infinite ratio). ``admission``: ``off`` never rejects; ``early`` rejects at arrival
    when predicted TTFT or TBT misses its SLO; ``baseline`` checks prefill load at arrival and
    decode load only when prefill ends; ``predictive`` predicts the decode load at the time
    the request reaches decode (``decode_time_s`` is the initial uniform t_d of arXiv §7.4,
    then learnt from observed decode durations;
    ``predictive_level="request"`` uses each request's expected output length instead).
    ``cpp_enabled``: plan chunked pipeline parallel prefill over up to ``cpp_max_nodes``
    nodes (chunks of at most ``prefill_chunk_tokens``) when the best single-node prefill (its
    transfer included, its queue not) exceeds ``cpp_trigger_fraction`` x the TTFT SLO — half
    the budget left for queueing — and CPP predicts a lower TTFT. Helpers must have at most
    ``cpp_helper_queue_fraction`` x the SLO queued (nearly idle): CPP's pipeline bubbles cost
    node-time that a busy cluster cannot spare.
    ``replication_enabled``: plan background hot-spot replicas (``conductor.core.hotspot``)
    besides Algorithm 1's copy-on-fetch.
    ``policy_params``: extra parameters passed to the policy by name.
    """

    block_size_tokens: int = 512
    ttft_slo_s: float = 30.0
    tbt_slo_s: float = 0.1
    kvcache_balancing_threshold: float = 1.0
    admission: str = "off"
    decode_time_s: float = 20.0
    predictive_level: str = "system"
    replication_enabled: bool = False
    cpp_enabled: bool = False
    prefill_chunk_tokens: int = 8192
    cpp_max_nodes: int = 4
    cpp_trigger_fraction: float = 0.5
    cpp_helper_queue_fraction: float = 0.1
    seed: int = 0
    policy_params: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.block_size_tokens <= 0:
            raise InvalidInput("block_size_tokens", self.block_size_tokens, "must be > 0")
        if self.ttft_slo_s <= 0:
            raise InvalidInput("ttft_slo_s", self.ttft_slo_s, "must be > 0")
        if self.tbt_slo_s <= 0:
            raise InvalidInput("tbt_slo_s", self.tbt_slo_s, "must be > 0")
        if self.kvcache_balancing_threshold < 1.0:
            raise InvalidInput(
                "kvcache_balancing_threshold", self.kvcache_balancing_threshold, "must be >= 1"
            )
        if self.admission not in ADMISSION_MODES:
            raise InvalidInput("admission", self.admission, f"must be one of {ADMISSION_MODES}")
        if self.predictive_level not in ("system", "request"):
            raise InvalidInput(
                "predictive_level", self.predictive_level, "must be 'system' or 'request'"
            )
        if self.prefill_chunk_tokens <= 0:
            raise InvalidInput("prefill_chunk_tokens", self.prefill_chunk_tokens, "must be > 0")
        if self.cpp_max_nodes < 2:
            raise InvalidInput("cpp_max_nodes", self.cpp_max_nodes, "must be >= 2")
        if self.decode_time_s <= 0:
            raise InvalidInput("decode_time_s", self.decode_time_s, "must be > 0")
