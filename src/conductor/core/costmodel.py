"""Cost model: prefill time, decode step time and KV transfer time.

Two prefill forms behind one protocol:

* :class:`RooflinePrefill` — ``T(N, p) = overhead + F(N, p) / (G * MFU)`` with ``F`` the
  exact causal prefill FLOPs of the model's shape (:mod:`conductor.core.shapes`: linear layers
  from the GQA/SwiGLU weights, the causal attention triangle, the LM head) and ``G`` the
  node's peak; :meth:`RooflinePrefill.fit` fits ``overhead`` and ``MFU`` to measured prompts.
* :class:`PolynomialPrefill` — ``T = c0 + c1 m + c2 N + c3 m N`` (m new tokens, N prompt
  length; Preble's form), with :meth:`PolynomialPrefill.fit` for offline samples — the
  "polynomial regression model fitted with offline data" of FAST §4.1.

Decode step (memory-bound, DistServe form): ``T = c0 + c1 B + c2 sum_ctx``; ``c2`` is the
roofline KV read, ``kv_bytes_per_token / (BW eta)``; ``c0`` (weights read + step overhead)
and ``c1`` are fitted to measured steps where a profile exists.

KV transfer: ``T = latency + bytes / bandwidth``; the bandwidth of a path is the caller's
business (the simulator's network model or the gateway's config).

Where the LLaMA3-70B A800/A100 numbers come from (all quoted in
``shared/reference/simulation-and-cost-models.md`` §2.3, Splitwise ``data/perf_model.csv``,
Llama2-70B TP8 on A100, batch 1 — Llama2-70B has LLaMA3-70B's layers, so the same FLOPs):

* prefill of 512 / 1,024 / 2,048 / 4,096 / 8,192 tokens: 93 / 154 / 274 / 661 / 1,550 ms
  (:data:`SPLITWISE_A100_TP8_PREFILL`). A least-squares fit on relative error of the exact-FLOP
  roofline gives overhead 11.1 ms and MFU 0.375 (residuals -7%, +5%, +16%, -4%, -16%: the
  profile grows faster than the FLOPs between 2k and 8k). A separate attention efficiency
  would fit all five within 6%, but at 4.8% of peak, which extrapolated to the trace's
  64k-128k prompts would make attention 80% of prefill time; we do not extrapolate that
  and use one MFU for all FLOPs.
* decode steps at context ~512 and batch 1 / 16 / 32 / 64: 45.0 / 50.4 / 53.0 / 71.6 ms
  (:data:`SPLITWISE_A100_TP8_DECODE`); with the KV read at 60% of HBM bandwidth (the one
  calibration, the low end of the 60-80% rule of thumb of §2.3 — the profile's contexts are
  too short to identify it), the fit is ``c0`` 43.2 ms, ``c1`` 0.40 ms per request
  (residuals -3% .. +7%).
* KV capacity: HBM less the weights at 90% usable; NIC: Transfer Engine's measured 87 GB/s on
  4x200 Gbps (FAST §5.4).

No number here was fitted to the conversation trace or to FAST Fig. 5; the Fig. 5 table's
sensitivity to the MFU is published by ``bench/fig5_mfu.py`` (``docs/results/fig5_mfu_*``).
Presets (see :data:`PRESETS`, the one table every shell reads) carry their sources in
``source``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from conductor.core.cost_forms import (
    DecodeModel,
    LinearDecode,
    PolynomialPrefill,
    PrefillModel,
    RooflinePrefill,
)
from conductor.core.errors import InvalidInput
from conductor.core.shapes import (
    A100X8,
    A800X8,
    H100X1,
    H100X8,
    H200X1,
    H200X8,
    LLAMA2_70B,
    LLAMA3_8B,
    LLAMA3_70B,
    HardwareSpec,
    ModelSpec,
)

__all__ = [
    "LLAMA3_8B",
    "LLAMA3_70B",
    "CostModel",
    "DecodeModel",
    "HardwareSpec",
    "LinearDecode",
    "ModelSpec",
    "PolynomialPrefill",
    "PrefillModel",
    "RooflinePrefill",
    "preset",
]


@dataclass(frozen=True, slots=True)
class CostModel:
    """Everything the scheduler predicts with. ``transfer_bytes_per_s`` is one node's NIC
    bandwidth as seen by a KV fetch; ``kv_capacity_tokens`` a decode instance's KV room."""

    name: str
    model: ModelSpec
    hardware: HardwareSpec
    prefill: PrefillModel
    decode: DecodeModel
    transfer_bytes_per_s: float
    transfer_latency_s: float = 0.001
    kv_capacity_tokens: int = 1_000_000
    max_batch_size: int = 256
    source: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token

    def prefill_s(self, prompt_tokens: int, cached_tokens: int) -> float:
        return self.prefill.time_s(prompt_tokens, cached_tokens)

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        return self.decode.step_s(batch_size, context_tokens)

    def transfer_s(self, tokens: int, bytes_per_s: float | None = None) -> float:
        """Time to move the KV of ``tokens`` tokens over a path of ``bytes_per_s``."""
        if tokens <= 0:
            return 0.0
        bw = self.transfer_bytes_per_s if bytes_per_s is None else bytes_per_s
        return self.transfer_latency_s + tokens * self.kv_bytes_per_token / bw

    def with_(self, **changes: object) -> CostModel:
        return replace(self, **changes)  # type: ignore[arg-type]

    def with_prefill_mfu(self, mfu: float) -> CostModel:
        """This model with its roofline prefill at ``mfu`` (a sensitivity knob)."""
        if not isinstance(self.prefill, RooflinePrefill):
            raise InvalidInput("prefill_mfu", mfu, f"preset {self.name} has no roofline prefill")
        if not 0 < mfu <= 1:
            raise InvalidInput("prefill_mfu", mfu, "must be in (0, 1]")
        return replace(self, name=f"{self.name}@mfu{mfu:g}", prefill=replace(self.prefill, mfu=mfu))


# -- measured profiles -------------------------------------------------------------------

SPLITWISE_A100_TP8_PREFILL: tuple[tuple[int, float], ...] = (
    (512, 0.093),
    (1024, 0.154),
    (2048, 0.274),
    (4096, 0.661),
    (8192, 1.550),
)
"""Splitwise ``data/perf_model.csv``: Llama2-70B TP8 on A100, batch 1, (prompt tokens, s)."""
SPLITWISE_A100_TP8_DECODE: tuple[tuple[int, int, float], ...] = (
    (1, 512, 0.0450),
    (16, 16 * 512, 0.0504),
    (32, 32 * 512, 0.0530),
    (64, 64 * 512, 0.0716),
)
"""Splitwise ``data/perf_model.csv``: Llama2-70B TP8 on A100 decode steps at context ~512,
as (batch size, context tokens summed over the batch, s)."""
KV_READ_BANDWIDTH_EFFICIENCY = 0.6
"""Calibration: the fraction of HBM bandwidth a decode step's KV read gets (the low end of the
reference's 60-80%; not identifiable from Splitwise's short-context steps)."""


def _kv_capacity(model: ModelSpec, hw: HardwareSpec, usable: float = 0.9) -> int:
    free = hw.gpus * hw.hbm_bytes_per_gpu * usable - model.weight_bytes
    return max(0, math.floor(free / model.kv_bytes_per_token))


def _preset(
    name: str,
    model: ModelSpec,
    hw: HardwareSpec,
    *,
    prefill: PrefillModel,
    decode: LinearDecode,
    source: str,
) -> CostModel:
    return CostModel(
        name=name,
        model=model,
        hardware=hw,
        prefill=prefill,
        decode=decode,
        transfer_bytes_per_s=hw.nic_bytes_per_s,
        kv_capacity_tokens=_kv_capacity(model, hw),
        source=source,
    )


def _a100_class(name: str, hw: HardwareSpec) -> CostModel:
    """LLaMA3-70B on one 8-GPU A100-class node, fitted to Splitwise's A100 TP8 profile."""
    fitted = RooflinePrefill.fit(LLAMA2_70B, hw, SPLITWISE_A100_TP8_PREFILL)
    c2 = LinearDecode.kv_read_s_per_token(LLAMA3_70B, hw, KV_READ_BANDWIDTH_EFFICIENCY)
    return _preset(
        name,
        LLAMA3_70B,
        hw,
        prefill=RooflinePrefill(LLAMA3_70B, hw, mfu=fitted.mfu, overhead_s=fitted.overhead_s),
        decode=LinearDecode.fit_with_kv(SPLITWISE_A100_TP8_DECODE, c2),
        source=(
            "exact causal FLOPs; prefill overhead+MFU and decode c0/c1 least-squares fitted to "
            "Splitwise perf_model.csv, Llama2-70B TP8 A100: prefill 512/1k/2k/4k/8k tokens = "
            "93/154/274/661/1550 ms, decode B=1/16/32/64 at ctx 512 = 45.0/50.4/53.0/71.6 ms; "
            "KV read at 60% HBM BW (calibration); NIC 87 GB/s (FAST §5.4)"
        ),
    )


def _blis_roofline(
    name: str, model: ModelSpec, hw: HardwareSpec, overheads: tuple[float, float], bw: str
) -> CostModel:
    prefill_overhead_s, step_overhead_s = overheads
    return _preset(
        name,
        model,
        hw,
        prefill=RooflinePrefill(model, hw, mfu=0.45, overhead_s=prefill_overhead_s),
        decode=LinearDecode.roofline(model, hw, step_overhead_s=step_overhead_s),
        source=f"exact causal FLOPs at BLIS mfuPrefill 0.45 (H100 calibration); decode roofline "
        f"with {bw} at 60% and BLIS step/layer overheads",
    )


PRESETS: dict[str, CostModel] = {
    # The paper's setup: dummy LLaMA3-70B, one instance per 8xA800 node, 4x200 Gbps NICs
    # (FAST Table 1, §5). A800 = A100 compute and HBM, so the A100 profile applies (its
    # 400 GB/s NVLink, vs 600, would only slow TP all-reduces: not modelled).
    "llama3-70b-a800x8": _a100_class("llama3-70b-a800x8", A800X8),
    "llama3-70b-a100x8": _a100_class("llama3-70b-a100x8", A100X8),
    # Splitwise's H100 TP8 profile (2023 software) implies MFU 0.23 with the same fit; we keep
    # BLIS's calibrated 0.45 for current H100 stacks.
    "llama3-70b-h100x8": _blis_roofline(
        "llama3-70b-h100x8", LLAMA3_70B, H100X8, (0.015, 0.0055), "HBM 3.35 TB/s"
    ),
    "llama3-70b-h200x8": _blis_roofline(
        "llama3-70b-h200x8", LLAMA3_70B, H200X8, (0.015, 0.0055), "H200 HBM 4.8 TB/s"
    ),
    "llama3-8b-h100": _blis_roofline(
        "llama3-8b-h100", LLAMA3_8B, H100X1, (0.008, 0.0023), "HBM 3.35 TB/s"
    ),
    "llama3-8b-h200": _blis_roofline(
        "llama3-8b-h200", LLAMA3_8B, H200X1, (0.008, 0.0023), "H200 HBM 4.8 TB/s"
    ),
}
"""The one table of cost-model presets: the simulator, the gateway and the emulator read it.
A measured engine is not a preset: ``conductor profile`` writes its cost file and every shell
reads it with ``--cost-file`` (:mod:`conductor.core.cost_file`)."""
DEFAULT_PRESET = "llama3-70b-a800x8"
"""The simulator's (and ``conductor serve``'s) preset: the paper's setup."""


def preset(name: str) -> CostModel:
    try:
        return PRESETS[name]
    except KeyError:
        raise InvalidInput(
            "preset", name, f"unknown; known: {', '.join(sorted(PRESETS))}"
        ) from None
