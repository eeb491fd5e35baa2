"""Scheduler configuration: one frozen dataclass, built once by the shell, units in names."""

from __future__ import annotations

from dataclasses import dataclass, field

from conductor.core.checks import check_at_least, check_choice, check_positive
from conductor.core.errors import InvalidInput

ADMISSION_MODES = ("off", "baseline", "early", "reserve", "predictive")
HANDOFFS = ("stream", "serial", "load")
"""How a P->D hand-off's KV reaches the decode engine (:attr:`SchedulerConfig.handoff`)."""
FIRST_TOKEN_SOURCES = ("prefill", "decode")
"""Which engine gives a disaggregated request's client its first token
(:attr:`SchedulerConfig.first_token`)."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Knobs of :class:`conductor.core.scheduler.Scheduler`.

    ``kvcache_balancing_threshold``: Algorithm 1 fetches the best remote prefix to an
    instance when ``best_prefix / local_prefix > threshold`` (a zero local prefix counts as
    an infinite ratio). ``admission`` (arXiv §7, docs/policies.md): ``off`` never rejects;
    every other mode rejects at arrival when the predicted TTFT misses its SLO, and then
    ``early`` (the paper's Early Rejection) when the decode instance's *current* load (the
    requests decoding there now) plus this one misses the TBT SLO or KV room; ``reserve``
    when its load with every request already assigned to it (also those still in prefill)
    does; ``baseline`` checks decode only when prefill ends; ``predictive`` forecasts the
    decode instance over this request's whole decode window (arXiv §7.4,
    :mod:`conductor.core.admission`).
    ``context_tokens``: the model's context; a request without ``max_tokens`` may generate
    up to ``context_tokens - prompt``. ``output_prior_tokens`` / ``output_prior_weight``:
    the output-length predictor's prior (that many pseudo-requests of that length);
    ``output_window``: the weight at which it halves its history; ``output_high_quantile``:
    the quantile of the predicted output a new request needs as KV room
    (:mod:`conductor.core.output_length`).
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
    ``first_token``: the serving stack's P/D protocol as the scheduler predicts it —
    ``prefill`` (Mooncake: the prefill engine's token is the client's first, so the KV
    hand-off's tail and the wait for the decode engine's next step are the first token
    interval, which TBT counts) or ``decode`` (vLLM's P/D proxy and ``conductor serve``: the
    decode engine makes the first token once the KV is there, so the hand-off is in TTFT and
    every interval is a decode step); ``conductor``'s decode choice reads it
    (:mod:`conductor.core.policies.first_interval`).
    ``handoff``: how the KV reaches a decode engine, as the scheduler predicts it —
    ``stream`` (during the prefill, Mooncake; NIXL pushing per layer) or ``serial`` (after
    it, over the NICs) cost the decode engine's other requests nothing; ``load``: the decode
    engine reads it inside the step that admits the request (vLLM's ExampleConnector,
    ``conductor emulate``), which stalls every request decoding there, so ``conductor``'s
    decode choice prices the stalls of the requests joining an instance while this one
    decodes (:mod:`conductor.core.policies.join_stalls`).
    ``policy_params``: extra parameters passed to the policy by name.
    """

    block_size_tokens: int = 512
    ttft_slo_s: float = 30.0
    tbt_slo_s: float = 0.1
    kvcache_balancing_threshold: float = 1.0
    admission: str = "off"
    context_tokens: int = 131_072
    output_prior_tokens: int = 256
    output_prior_weight: float = 4.0
    output_window: float = 2048.0
    output_high_quantile: float = 0.9
    replication_enabled: bool = False
    cpp_enabled: bool = False
    prefill_chunk_tokens: int = 8192
    cpp_max_nodes: int = 4
    cpp_trigger_fraction: float = 0.5
    cpp_helper_queue_fraction: float = 0.1
    cost_correction: bool = True
    seed: int = 0
    first_token: str = "prefill"
    handoff: str = "stream"
    policy_params: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_positive("block_size_tokens", self.block_size_tokens)
        check_positive("ttft_slo_s", self.ttft_slo_s)
        check_positive("tbt_slo_s", self.tbt_slo_s)
        check_at_least("kvcache_balancing_threshold", self.kvcache_balancing_threshold, 1)
        check_choice("admission", self.admission, ADMISSION_MODES)
        check_choice("first_token", self.first_token, FIRST_TOKEN_SOURCES)
        check_choice("handoff", self.handoff, HANDOFFS)
        check_positive("prefill_chunk_tokens", self.prefill_chunk_tokens)
        check_at_least("cpp_max_nodes", self.cpp_max_nodes, 2)
        check_at_least("context_tokens", self.context_tokens, 2)
        check_positive("output_prior_tokens", self.output_prior_tokens)
        check_positive("output_prior_weight", self.output_prior_weight)
        check_at_least("output_window", self.output_window, 2 * self.output_prior_weight)
        check_positive("output_high_quantile", self.output_high_quantile)
        if self.output_high_quantile > 1:
            raise InvalidInput("output_high_quantile", self.output_high_quantile, "must be <= 1")
