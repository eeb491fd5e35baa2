"""Scheduler configuration: one frozen dataclass, built once by the shell, units in names."""

from __future__ import annotations

from dataclasses import dataclass, field

from conductor.core.checks import check_at_least, check_choice, check_positive

ADMISSION_MODES = ("off", "baseline", "early", "predictive")
PREDICTIVE_LEVELS = ("system", "request")


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
    ``cost_correction``: learn per-instance prefill and decode-step factors online from the
    engines' reported timings and predict with the corrected model
    (:mod:`conductor.core.correction`; a no-op while the engines match the model).
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
    cost_correction: bool = True
    seed: int = 0
    policy_params: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_positive("block_size_tokens", self.block_size_tokens)
        check_positive("ttft_slo_s", self.ttft_slo_s)
        check_positive("tbt_slo_s", self.tbt_slo_s)
        check_at_least("kvcache_balancing_threshold", self.kvcache_balancing_threshold, 1)
        check_choice("admission", self.admission, ADMISSION_MODES)
        check_choice("predictive_level", self.predictive_level, PREDICTIVE_LEVELS)
        check_positive("prefill_chunk_tokens", self.prefill_chunk_tokens)
        check_at_least("cpp_max_nodes", self.cpp_max_nodes, 2)
        check_positive("decode_time_s", self.decode_time_s)
