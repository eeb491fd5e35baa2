"""Simulator configuration (frozen; built once by the CLI)."""

from __future__ import annotations

from dataclasses import dataclass, field

from conductor.core.checks import check_at_least, check_choice
from conductor.core.config import FIRST_TOKEN_SOURCES, HANDOFFS, SchedulerConfig
from conductor.core.costmodel import DEFAULT_PRESET, CostModel, preset
from conductor.core.errors import InvalidInput
from conductor.core.policies import DEFAULT_POLICY, check_policy
from conductor.core.state import CACHE_CAPACITY_TOKENS, SERIAL_PREFILL_LANES


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How every simulated engine schedules its iterations (vLLM v1's scheduler knobs).

    ``max_num_batched_tokens``: the token budget of one step (prefill chunk tokens plus one
    per decoding request). ``max_num_seqs``: the most requests running at once (``None``:
    the cost model's ``max_batch_size``). ``block_size_tokens``: the KV allocation unit
    (vLLM's paged block, 16 tokens on CUDA). ``long_prefill_token_threshold``: the most
    tokens one prefill may take in a step (0 = no cap, vLLM's default when partial prefills
    are off; the default cap leaves half the budget for the prompts behind a long one).
    ``kv_capacity_tokens``: each engine's GPU KV room (``None``: the cost model's).
    """

    max_num_batched_tokens: int = 8192
    max_num_seqs: int | None = None
    block_size_tokens: int = 16
    long_prefill_token_threshold: int = 4096
    kv_capacity_tokens: int | None = None

    def __post_init__(self) -> None:
        check_at_least("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        if self.max_num_seqs is not None:
            check_at_least("max_num_seqs", self.max_num_seqs, 1)
        check_at_least("block_size_tokens", self.block_size_tokens, 1)
        check_at_least("long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        if self.kv_capacity_tokens is not None:
            check_at_least("kv_capacity_tokens", self.kv_capacity_tokens, 1)

    def lanes(self) -> int:
        """How many prompts it prefills side by side: its token budget over the most tokens
        one prompt takes per step (1 without that cap)."""
        cap = self.long_prefill_token_threshold
        if cap <= 0:
            return 1
        return max(1, self.max_num_batched_tokens // cap)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """A simulated cluster (every field checked at construction; the defaults are those of
    ``conductor simulate``).

    ``policy``: a registered prefill policy name. ``cache_capacity_tokens``: each prefill
    instance's DRAM KV cache (LRU), 3M tokens as in FAST §5.3.2; ``None`` means unbounded.
    ``kv_event_delay_s``: how late the scheduler sees KV events (stale state).
    ``dispatch_latency_s`` and ``report_latency_s``: a gateway's two legs — a placed request
    reaches its prefill engine ``dispatch_latency_s`` after the decision, and the scheduler
    (so the hold queue) and the client see a prefill's first token ``report_latency_s``
    after the engine made it (the record's TTFT counts both; the first token interval of
    TBT is the engine's). 0: the scheduler is in the engine's process.
    ``prefill_noise``: relative std-dev of a seeded log-normal error between the cost model's
    prediction and the simulated execution (0 = exact).
    ``oracle_lengths``: the ablation that hands the scheduler every request's true output
    length (default: it predicts them, :mod:`conductor.core.output_length`).
    ``cost_error`` (sigma) and ``cost_bias`` (B): the engines deviate from the scheduler's cost
    model, each job by a mean-preserving lognormal factor and all by ``1 + B``
    (:mod:`conductor.sim.perturb`; ``cost_bias = 0.3`` = engines 30% slower).
    ``load_sample_every_s``: sample prefill/decode load this often (0 = never).
    ``replica_sample_every_s``: sample how many prefill caches hold the blocks ranked
    ``replica_ranks`` by use in the whole trace (FAST Fig. 11; 0 = never).
    ``n_both``: instances that prefill and decode (``role=both``), after the others.
    ``engine``: the engines' iteration scheduler (:class:`EngineConfig`).
    ``replicas``: scheduler replicas the arrivals are spread over (round-robin), each seeing
    the others' reservations ``sync_delay_s`` late (:mod:`conductor.sim.replicas`);
    ``replica_stagger``: each replica breaks exact ties in its own instance order.
    ``handoff`` and ``first_token``: the serving stack's P/D protocol. ``handoff="stream"``:
    the KV streams to the decode engine layer by layer during the prefill (Mooncake;
    NIXL pushing per layer); ``"serial"``: it starts once the prefill has ended (a decode
    engine that pulls over its NIC after the prefill leg answered); ``"load"``: the
    decode engine reads the KV itself inside the step that admits the request, which that
    long stalls every request decoding there, and no NIC is held (vLLM's ExampleConnector
    loading its files before the forward pass).
    ``first_token="prefill"``: the prefill engine streams the first token, so TTFT ends
    with the prefill and the hand-off's tail is the first token interval (Mooncake);
    ``"decode"``: the client's first token is the decode engine's, made in its first step
    once the KV is there (vLLM's disaggregated proxy and ``conductor serve``: the prefill
    leg's own token is dropped), so TTFT holds the hand-off and that step. Requests that
    decode where they were prefilled (``role=both``) are not affected. The scheduler
    predicts with its own ``SchedulerConfig.first_token`` (the CLI sets both alike).
    ``decode_cache``: decode engines keep finished requests' prompt blocks cached in their
    free KV blocks and publish them as KV events (vLLM's prefix caching on a decode
    engine), so a hand-off to an engine that holds the start of a prompt carries only the
    rest (:mod:`conductor.sim.decode_cache`). Off: every hand-off carries the whole prompt.
    ``kv_fetch``: prefill instances can pull a prefix cached on another instance over the NIC
    (Mooncake Store; Algorithm 1's remote fetch). Off: no store between engines, as behind
    ``conductor serve``, whose instances are registered with ``pulls_kv = False``: plans
    reuse each instance's own cache only.
    ``prefill_lanes``: what the scheduler is told of how many prompts each prefill-capable
    engine prefills side by side (``InstanceSpec.prefill_lanes``): 1, one after another (its
    queue model: first come, first served); ``engine.max_num_batched_tokens //
    engine.long_prefill_token_threshold`` (:meth:`EngineConfig.lanes`) is what they do.
    The scheduler is told the engines' ``long_prefill_token_threshold`` as their
    ``InstanceSpec.prefill_chunk_tokens`` (read only with more than one lane).
    """

    policy: str = DEFAULT_POLICY
    n_prefill: int = 8
    n_decode: int = 8
    n_both: int = 0
    cost: CostModel = field(default_factory=lambda: preset(DEFAULT_PRESET))
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache_capacity_tokens: int | None = CACHE_CAPACITY_TOKENS
    kv_event_delay_s: float = 0.0
    dispatch_latency_s: float = 0.0
    report_latency_s: float = 0.0
    prefill_noise: float = 0.0
    cost_error: float = 0.0
    cost_bias: float = 0.0
    seed: int = 0
    oracle_lengths: bool = False
    load_sample_every_s: float = 0.0
    replica_sample_every_s: float = 0.0
    replica_ranks: tuple[int, ...] = (10, 100, 1000)
    engine: EngineConfig = field(default_factory=EngineConfig)
    replicas: int = 1
    sync_delay_s: float = 0.0
    replica_stagger: bool = True
    handoff: str = "stream"
    first_token: str = "prefill"
    decode_cache: bool = True
    kv_fetch: bool = True
    prefill_lanes: int = SERIAL_PREFILL_LANES

    def __post_init__(self) -> None:
        check_policy(self.policy)
        check_at_least("n_both", self.n_both, 0)
        least = 0 if self.n_both > 0 else 1  # both-role instances prefill and decode
        check_at_least("n_prefill", self.n_prefill, least)
        check_at_least("n_decode", self.n_decode, least)
        if self.cache_capacity_tokens is not None:
            check_at_least("cache_capacity_tokens", self.cache_capacity_tokens, 0)
        check_at_least("kv_event_delay_s", self.kv_event_delay_s, 0)
        check_at_least("dispatch_latency_s", self.dispatch_latency_s, 0)
        check_at_least("report_latency_s", self.report_latency_s, 0)
        check_at_least("prefill_noise", self.prefill_noise, 0)
        check_at_least("cost_error", self.cost_error, 0)
        if not self.cost_bias > -1:
            raise InvalidInput("cost_bias", self.cost_bias, "must be > -1 (engines 1 + B times)")
        check_at_least("replicas", self.replicas, 1)
        check_at_least("sync_delay_s", self.sync_delay_s, 0)
        check_choice("handoff", self.handoff, HANDOFFS)
        check_choice("first_token", self.first_token, FIRST_TOKEN_SOURCES)
        check_at_least("prefill_lanes", self.prefill_lanes, 1)

    @property
    def cache_capacity_blocks(self) -> int | None:
        if self.cache_capacity_tokens is None:
            return None
        return self.cache_capacity_tokens // self.scheduler.block_size_tokens
