"""What ``conductor profile`` measures (frozen; built once by the CLI, whose flags derive their
defaults from these fields).

Prefill: for each length in ``prefill_lengths``, ``repeats`` prompts of fresh tokens
(nothing cached) and, for each fraction in ``cached_fractions``, ``repeats`` prompts whose
first ``fraction * length`` tokens (whole KV blocks) were sent just before (so they are
cached), each with ``max_tokens`` 1, one at a time on an idle engine; the sample is the median
time to the first token. Decode: for each batch size in ``batch_sizes`` and context in
``decode_contexts``, that many concurrent streams of ``decode_tokens`` tokens after prompts of
that length; the sample is the median gap between tokens while every stream of the batch is
decoding. ``warmup`` requests go first and are not measured. With ``handoff_url`` (a
disaggregated gateway in front of a prefill engine like the profiled one and a decode
engine), the KV hand-off too (:mod:`conductor.profiling.handoff`): for each length in
``handoff_lengths``, ``handoff_samples`` pairs of requests after one unmeasured round; its
fit sets the cost file's transfer instead of ``transfer_bytes_per_s`` / ``transfer_latency_s``.
"""

from __future__ import annotations

from dataclasses import dataclass

from conductor.core.checks import check_at_least, check_positive
from conductor.core.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class ProfileConfig:
    """One profile run (see the module docstring). ``block_size_tokens`` None: the engine's
    (``vllm:cache_config_info``), else :data:`FALLBACK_BLOCK_SIZE`; ``kv_capacity_tokens``
    None: the engine's; ``model`` None: the first model ``GET /v1/models`` lists."""

    url: str
    model: str | None = None
    prefill_lengths: tuple[int, ...] = (32, 128, 256, 512, 1024, 1536)
    cached_fractions: tuple[float, ...] = (0.5, 0.9)
    repeats: int = 3
    warmup: int = 4
    batch_sizes: tuple[int, ...] = (1, 4, 8, 16)
    decode_contexts: tuple[int, ...] = (64, 512, 1024)
    decode_tokens: int = 32
    block_size_tokens: int | None = None
    kv_capacity_tokens: int | None = None
    max_batch_size: int = 256
    kv_bytes_per_elem: int = 2
    transfer_bytes_per_s: float = 1e9
    transfer_latency_s: float = 0.001
    timeout_s: float = 120.0
    seed: int = 0
    handoff_url: str | None = None
    handoff_lengths: tuple[int, ...] = (64, 256, 512, 1024)
    handoff_samples: int = 3

    def __post_init__(self) -> None:
        if not self.url.startswith("http://"):
            raise InvalidInput("url", self.url, "must be an http:// URL")
        for name in ("prefill_lengths", "batch_sizes", "decode_contexts"):
            values = getattr(self, name)
            if not values:
                raise InvalidInput(name, values, "must not be empty")
            for v in values:
                check_at_least(name, v, 1)
        if len(set(self.prefill_lengths)) < 2:
            raise InvalidInput("prefill_lengths", self.prefill_lengths, "need 2 distinct lengths")
        for f in self.cached_fractions:
            if not 0 < f < 1:
                raise InvalidInput("cached_fractions", f, "must be in (0, 1)")
        check_at_least("repeats", self.repeats, 1)
        check_at_least("warmup", self.warmup, 0)
        check_at_least("decode_tokens", self.decode_tokens, 4)
        if len(self.batch_sizes) * len(self.decode_contexts) < 3:
            raise InvalidInput(
                "batch_sizes", self.batch_sizes, "with decode_contexts: need 3 decode points"
            )
        if self.block_size_tokens is not None:
            check_at_least("block_size_tokens", self.block_size_tokens, 1)
        if self.kv_capacity_tokens is not None:
            check_at_least("kv_capacity_tokens", self.kv_capacity_tokens, 1)
        check_at_least("max_batch_size", self.max_batch_size, 1)
        check_at_least("kv_bytes_per_elem", self.kv_bytes_per_elem, 1)
        check_positive("transfer_bytes_per_s", self.transfer_bytes_per_s)
        check_at_least("transfer_latency_s", self.transfer_latency_s, 0)
        check_positive("timeout_s", self.timeout_s)
        check_at_least("seed", self.seed, 0)
        if self.handoff_url is not None and not self.handoff_url.startswith("http://"):
            raise InvalidInput("handoff_url", self.handoff_url, "must be an http:// URL")
        for v in self.handoff_lengths:
            check_at_least("handoff_lengths", v, 1)
        if len(set(self.handoff_lengths)) < 2:
            raise InvalidInput("handoff_lengths", self.handoff_lengths, "need 2 distinct lengths")
        check_at_least("handoff_samples", self.handoff_samples, 1)


FALLBACK_BLOCK_SIZE = 16
"""The block size assumed when the engine does not publish one (vLLM's GPU default)."""
FALLBACK_KV_CAPACITY_TOKENS = 1_000_000
"""The KV capacity written when neither the engine nor ``kv_capacity_tokens`` says."""
