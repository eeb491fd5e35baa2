"""Cost models for the gateway: the core presets plus a calibrated one for the tiny CPU model.

``tiny-cpu`` describes the 2-layer random-weight Llama the integration tests serve on vLLM's CPU
backend (``tests/engines/make_tiny_model.py``). Its numbers were measured on a 2-core machine
(see ``docs/gateway.md``): prefill ``T = overhead + new_tokens / rate`` and a decode step of a
few milliseconds. Any preset can be recalibrated with :func:`with_overrides`:

* ``prefill_tokens_per_s``: replaces the prefill model by ``T = c0 + new_tokens / rate``
  (``c0`` = the preset's fixed overhead);
* ``decode_step_ms``: replaces the decode model by a constant step time plus a small
  per-request term.
"""

from __future__ import annotations

from conductor.core.costmodel import (
    PRESETS,
    CostModel,
    HardwareSpec,
    LinearDecode,
    ModelSpec,
    PolynomialPrefill,
    RooflinePrefill,
)
from conductor.core.errors import InvalidInput

TINY_LLAMA = ModelSpec(
    "tiny-llama-2l-256h", layers=2, hidden=256, q_heads=4, kv_heads=2, head_dim=64, params_b=0.0011
)
CPU_2CORE = HardwareSpec(
    "cpu-2core",
    gpus=1,
    flops_per_gpu=5e10,
    hbm_bytes_per_s_per_gpu=1e10,
    hbm_bytes_per_gpu=1 << 30,  # VLLM_CPU_KVCACHE_SPACE=1 (GiB)
    nic_bytes_per_s=1e9,
)

# Measured with vLLM 0.32 (CPU) on 2 cores, random prompts, max_tokens 1 / 65, ignore_eos:
# prefill 16 tok ~11 ms, 512 tok ~18 ms, 1024 tok ~40 ms, 1900 tok ~51 ms; decode step
# ~2.4 ms at 16 context tokens, ~3.8 ms at 1024.
TINY_CPU_PREFILL_TOKENS_PER_S = 30_000.0
TINY_CPU_PREFILL_OVERHEAD_S = 0.010
TINY_CPU_DECODE_STEP_MS = 2.4
TINY_CPU_DECODE_S_PER_CONTEXT_TOKEN = 1.3e-6


def _tiny_cpu() -> CostModel:
    return CostModel(
        name="tiny-cpu",
        model=TINY_LLAMA,
        hardware=CPU_2CORE,
        prefill=PolynomialPrefill(
            TINY_CPU_PREFILL_OVERHEAD_S, 1.0 / TINY_CPU_PREFILL_TOKENS_PER_S, 0.0, 0.0
        ),
        decode=LinearDecode(
            TINY_CPU_DECODE_STEP_MS / 1e3, 1e-4, TINY_CPU_DECODE_S_PER_CONTEXT_TOKEN
        ),
        transfer_bytes_per_s=CPU_2CORE.nic_bytes_per_s,
        kv_capacity_tokens=int(CPU_2CORE.hbm_bytes_per_gpu) // TINY_LLAMA.kv_bytes_per_token,
        max_batch_size=256,
        source="measured: vLLM 0.32 CPU backend, tiny model, 2 cores (docs/gateway.md)",
    )


GATEWAY_PRESETS: dict[str, CostModel] = {"tiny-cpu": _tiny_cpu()}


def preset_names() -> list[str]:
    return sorted({*PRESETS, *GATEWAY_PRESETS})


def gateway_preset(name: str) -> CostModel:
    """A core preset or a gateway one; :class:`InvalidInput` naming ``preset`` otherwise."""
    if name in GATEWAY_PRESETS:
        return GATEWAY_PRESETS[name]
    if name in PRESETS:
        return PRESETS[name]
    raise InvalidInput("preset", name, f"unknown; known: {', '.join(preset_names())}")


def _overhead_s(cost: CostModel) -> float:
    model = cost.prefill
    if isinstance(model, PolynomialPrefill):
        return model.c0
    if isinstance(model, RooflinePrefill):
        return model.overhead_s
    return 0.0


def with_overrides(
    cost: CostModel,
    *,
    prefill_tokens_per_s: float | None = None,
    decode_step_ms: float | None = None,
) -> CostModel:
    """``cost`` recalibrated by measured rates (see the module docstring)."""
    changes: dict[str, object] = {}
    if prefill_tokens_per_s is not None:
        if not prefill_tokens_per_s > 0:
            raise InvalidInput("prefill_tokens_per_s", prefill_tokens_per_s, "must be > 0")
        changes["prefill"] = PolynomialPrefill(
            _overhead_s(cost), 1.0 / prefill_tokens_per_s, 0.0, 0.0
        )
    if decode_step_ms is not None:
        if not decode_step_ms > 0:
            raise InvalidInput("decode_step_ms", decode_step_ms, "must be > 0")
        changes["decode"] = LinearDecode(decode_step_ms / 1e3, 1e-4, 0.0)
    if not changes:
        return cost
    return cost.with_(name=f"{cost.name}+calibrated", **changes)
