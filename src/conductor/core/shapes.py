"""Model and hardware shapes, and the exact prefill FLOP count the roofline uses.

Prefill FLOPs of a prompt of ``N`` tokens of which a prefix of ``p`` is cached (``m = N - p``
new tokens), for a decoder with ``L`` layers, hidden size ``d``, ``n_q`` query heads and
``n_kv`` KV heads of width ``h`` (GQA), a SwiGLU MLP of width ``f`` and vocabulary ``V``:

* linear layers: ``2 P m`` with ``P = L (2 d n_q h + 2 d n_kv h + 3 d f)`` the non-embedding
  weights (Q and O projections, the GQA-narrow K and V projections, gate/up/down);
  LLaMA3-70B: ``P = 68.45e9`` (80 x 855.6e6);
* causal attention: token ``i`` (0-based) attends to ``i + 1`` keys, ``QK^T`` and ``AV`` cost
  ``2 n_q h`` FLOPs per key each, so the new tokens cost
  ``4 L n_q h sum_{i=p}^{N-1} (i + 1) = 2 L n_q h (N (N + 1) - p (p + 1))`` — the causal
  triangle, not the square;
* the LM head once (only the last token's logits are computed): ``2 d V``.

Mooncake's Eq. (1) (FAST'25), ``flops(n) = l (a n^2 d + b n d^2)`` with ``a = 4, b = 22`` for
LLaMA3-70B, counts the full ``n x n`` attention square (2x the causal count) and
``22 d^2 = 1.48e9`` linear FLOPs per token per layer where the shape gives
``2 * 855.6e6 = 1.71e9`` (16% more: the 28,672-wide MLP is 3.5x ``d``, not the 2.67x of
``b = 22``). :func:`mooncake_eq1_flops` keeps it for comparison.

Shapes are the HF ``config.json`` values quoted in
``shared/reference/simulation-and-cost-models.md`` §2.2; hardware peaks are dense BF16 and HBM
bandwidths from its §2.1 (BLIS ``hardware_config.json``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Transformer shape: ``layers`` (L), ``hidden`` (d), heads, ``ffn`` (SwiGLU width),
    ``vocab``; ``params_b`` all weights in billions (embeddings included, for the bytes a
    decode step reads)."""

    name: str
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    params_b: float
    ffn: int
    vocab: int
    bytes_per_elem: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_elem

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.bytes_per_elem

    @property
    def linear_params(self) -> int:
        """Non-embedding weights ``P`` (each does one multiply-add per token)."""
        d = self.hidden
        attn = 2 * d * self.q_heads * self.head_dim + 2 * d * self.kv_heads * self.head_dim
        return self.layers * (attn + 3 * d * self.ffn)

    def prefill_flop_factors(self) -> tuple[float, float, float]:
        """The factors of :meth:`prefill_flops`: FLOPs per new token in the linear layers,
        the LM head of the last token, and the attention's FLOPs per (query, key) pair
        counted as ``n (n + 1) - p (p + 1)``. A caller that prices many prompts keeps them
        (:func:`prefill_flops_of`)."""
        return (
            2.0 * self.linear_params,
            2.0 * self.hidden * self.vocab,
            2.0 * self.layers * self.q_heads * self.head_dim,
        )

    def linear_flops(self, new_tokens: int) -> float:
        """Linear-layer FLOPs of ``new_tokens`` tokens plus the LM head of the last one."""
        per_token, lm_head, _ = self.prefill_flop_factors()
        return per_token * new_tokens + lm_head

    def attention_flops(self, prompt_tokens: int, cached_tokens: int) -> float:
        """Causal ``QK^T + AV`` FLOPs of tokens ``cached_tokens .. prompt_tokens - 1``."""
        n, p = prompt_tokens, cached_tokens
        return self.prefill_flop_factors()[2] * (n * (n + 1) - p * (p + 1))

    def prefill_flops(self, prompt_tokens: int, cached_tokens: int) -> float:
        return prefill_flops_of(self.prefill_flop_factors(), prompt_tokens, cached_tokens)


def prefill_flops_of(
    factors: tuple[float, float, float], prompt_tokens: int, cached_tokens: int
) -> float:
    """:meth:`ModelSpec.prefill_flops` from its :meth:`~ModelSpec.prefill_flop_factors`."""
    per_token, lm_head, per_pair = factors
    n, p = prompt_tokens, cached_tokens
    return per_token * (n - p) + lm_head + per_pair * (n * (n + 1) - p * (p + 1))


def mooncake_eq1_flops(model: ModelSpec, n: float, a: float = 4.0, b: float = 22.0) -> float:
    """FAST'25 Eq. (1), ``l (a n^2 d + b n d^2)`` (non-causal; for comparison only)."""
    d = model.hidden
    return model.layers * (a * n * n * d + b * n * d * d)


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One instance (node or TP group): peak dense BF16 FLOP/s, HBM bandwidth, NIC."""

    name: str
    gpus: int
    flops_per_gpu: float
    hbm_bytes_per_s_per_gpu: float
    hbm_bytes_per_gpu: float
    nic_bytes_per_s: float

    @property
    def peak_flops(self) -> float:
        return self.gpus * self.flops_per_gpu

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.gpus * self.hbm_bytes_per_s_per_gpu


LLAMA3_8B = ModelSpec("llama3-8b", 32, 4096, 32, 8, 128, 8.03, ffn=14336, vocab=128256)
LLAMA3_70B = ModelSpec("llama3-70b", 80, 8192, 64, 8, 128, 70.55, ffn=28672, vocab=128256)
# Llama-2-70B (Splitwise's profiled model) has LLaMA3-70B's layers exactly (80 x 8192, 64/8
# heads, 28,672 MLP) and a 32k vocabulary: the same prefill FLOPs but for the LM head.
LLAMA2_70B = ModelSpec("llama2-70b", 80, 8192, 64, 8, 128, 68.98, ffn=28672, vocab=32000)
# The 2-layer random-weight Llama the gateway's integration tests serve on vLLM's CPU backend
# (tests/engines/make_tiny_model.py).
TINY_LLAMA = ModelSpec("tiny-llama-2l-256h", 2, 256, 4, 2, 64, 0.0011, ffn=512, vocab=1024)

# A800 is the A100 die with NVLink cut to 400 GB/s: same 312 TFLOP/s dense BF16 and 2.039 TB/s.
A100X8 = HardwareSpec("8xA100-80G", 8, 312e12, 2.039e12, 80e9, 87e9)
A800X8 = HardwareSpec("8xA800-80G", 8, 312e12, 2.039e12, 80e9, 87e9)
H100X1 = HardwareSpec("1xH100-SXM", 1, 989.5e12, 3.35e12, 80e9, 50e9)
H100X8 = HardwareSpec("8xH100-SXM", 8, 989.5e12, 3.35e12, 80e9, 190e9)
H200X1 = HardwareSpec("1xH200-SXM", 1, 989.5e12, 4.8e12, 141e9, 50e9)
H200X8 = HardwareSpec("8xH200-SXM", 8, 989.5e12, 4.8e12, 141e9, 190e9)
CPU_2CORE = HardwareSpec("cpu-2core", 1, 5e10, 1e10, 1 << 30, 1e9)
