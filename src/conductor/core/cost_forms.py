"""The cost model's forms: prefill models, the decode step model, and their fits.

* :class:`RooflinePrefill` — ``T(N, p) = overhead + F(N, p) / (G * MFU)`` with ``F`` the
  exact causal prefill FLOPs of the model's shape (:mod:`conductor.core.shapes`) and ``G`` the
  node's peak; :meth:`RooflinePrefill.fit` fits ``overhead`` and ``MFU`` to measured prompts.
* :class:`PolynomialPrefill` — ``T = c0 + c1 m + c2 N + c3 m N`` (m new tokens, N prompt
  length; Preble's form), with :meth:`PolynomialPrefill.fit` for offline samples — the
  "polynomial regression model fitted with offline data" of FAST §4.1.
* :class:`LinearDecode` — ``T = c0 + c1 B + c2 sum_ctx`` (DistServe's memory-bound form).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from conductor.core.errors import InvalidInput
from conductor.core.shapes import HardwareSpec, ModelSpec, prefill_flops_of


class PrefillModel(Protocol):
    def time_s(self, prompt_tokens: int, cached_tokens: int) -> float:
        """Predicted prefill time of a prompt of which ``cached_tokens`` are reused."""
        ...


class DecodeModel(Protocol):
    def step_s(self, batch_size: float, context_tokens: float) -> float:
        """Predicted time of one decode iteration of ``batch_size`` requests (fractional
        values: the mean iteration of several)."""
        ...


def _check_lengths(prompt_tokens: int, cached_tokens: int) -> int:
    if prompt_tokens <= 0:
        raise InvalidInput("prompt_tokens", prompt_tokens, "must be > 0")
    if cached_tokens < 0:
        raise InvalidInput("cached_tokens", cached_tokens, "must be >= 0")
    # At least the last token is always computed (it yields the first output token).
    return min(cached_tokens, prompt_tokens - 1)


def _lstsq(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Least squares with columns scaled to 1 (the terms differ by orders of magnitude)."""
    x = np.asarray(rows, dtype=float)
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    coef, *_ = np.linalg.lstsq(x / scale, np.asarray(ys, dtype=float), rcond=None)
    return [float(c) for c in coef / scale]


@dataclass(frozen=True, slots=True)
class RooflinePrefill:
    """``T = overhead_s + model.prefill_flops(N, p) / (hardware.peak_flops * mfu)``."""

    model: ModelSpec
    hardware: HardwareSpec
    mfu: float = 0.375
    overhead_s: float = 0.011
    _flop_factors: tuple[float, float, float] = field(
        init=False, repr=False, compare=False, default=(0.0, 0.0, 0.0)
    )
    """``model.prefill_flop_factors()``, kept: every prediction needs them."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_flop_factors", self.model.prefill_flop_factors())

    def time_s(self, prompt_tokens: int, cached_tokens: int) -> float:
        p = _check_lengths(prompt_tokens, cached_tokens)
        f = prefill_flops_of(self._flop_factors, prompt_tokens, p)
        return self.overhead_s + f / (self.hardware.peak_flops * self.mfu)

    @classmethod
    def fit(
        cls, model: ModelSpec, hardware: HardwareSpec, samples: Sequence[tuple[int, float]]
    ) -> RooflinePrefill:
        """``overhead_s`` and ``mfu`` from ``(prompt_tokens, seconds)`` uncached prefills, by
        least squares on the relative error (each sample weighs the same)."""
        if len(samples) < 2:
            raise InvalidInput("samples", len(samples), "need at least 2 samples to fit 2 terms")
        g = hardware.peak_flops
        rows = [(1.0 / t, model.prefill_flops(n, 0) / g / t) for n, t in samples]
        overhead, inv_mfu = _lstsq(rows, [1.0] * len(samples))
        if inv_mfu <= 0 or overhead < 0:
            raise InvalidInput("samples", len(samples), "do not fit a positive MFU and overhead")
        return cls(model, hardware, mfu=1.0 / inv_mfu, overhead_s=overhead)


@dataclass(frozen=True, slots=True)
class PolynomialPrefill:
    """``T = c0 + c1 m + c2 N + c3 m N`` seconds; m = new tokens, N = prompt tokens."""

    c0: float
    c1: float
    c2: float
    c3: float

    def time_s(self, prompt_tokens: int, cached_tokens: int) -> float:
        p = _check_lengths(prompt_tokens, cached_tokens)
        m = prompt_tokens - p
        n = prompt_tokens
        return self.c0 + self.c1 * m + self.c2 * n + self.c3 * m * n

    @classmethod
    def fit(cls, samples: Sequence[tuple[int, int, float]]) -> PolynomialPrefill:
        """Least-squares fit to ``(prompt_tokens, cached_tokens, seconds)`` samples."""
        if len(samples) < 4:
            raise InvalidInput("samples", len(samples), "need at least 4 samples to fit 4 terms")
        rows = []
        for n, p, _ in samples:
            m = n - _check_lengths(n, p)
            rows.append((1.0, float(m), float(n), float(m) * n))
        c0, c1, c2, c3 = _lstsq(rows, [t for *_, t in samples])
        return cls(c0, c1, c2, c3)


@dataclass(frozen=True, slots=True)
class LinearDecode:
    """``T = c0 + c1 B + c2 sum_ctx`` seconds per decode iteration."""

    c0: float
    c1: float
    c2: float

    def step_s(self, batch_size: float, context_tokens: float) -> float:
        if batch_size <= 0:
            return 0.0
        return self.c0 + self.c1 * batch_size + self.c2 * context_tokens

    @staticmethod
    def kv_read_s_per_token(
        model: ModelSpec, hardware: HardwareSpec, bandwidth_efficiency: float = 0.6
    ) -> float:
        """The roofline ``c2``: one context token's KV read at ``bandwidth_efficiency``."""
        return model.kv_bytes_per_token / (hardware.hbm_bytes_per_s * bandwidth_efficiency)

    @classmethod
    def roofline(
        cls,
        model: ModelSpec,
        hardware: HardwareSpec,
        *,
        bandwidth_efficiency: float = 0.6,
        step_overhead_s: float = 0.003,
        per_request_s: float = 5e-6,
    ) -> LinearDecode:
        bw = hardware.hbm_bytes_per_s * bandwidth_efficiency
        return cls(
            step_overhead_s + model.weight_bytes / bw,
            per_request_s,
            cls.kv_read_s_per_token(model, hardware, bandwidth_efficiency),
        )

    @classmethod
    def fit(cls, samples: Sequence[tuple[int, int, float]]) -> LinearDecode:
        """Least-squares fit to ``(batch_size, context_tokens, seconds)`` samples."""
        if len(samples) < 3:
            raise InvalidInput("samples", len(samples), "need at least 3 samples to fit 3 terms")
        rows = [(1.0, float(b), float(c)) for b, c, _ in samples]
        c0, c1, c2 = _lstsq(rows, [t for *_, t in samples])
        return cls(c0, c1, c2)

    @classmethod
    def fit_with_kv(cls, samples: Sequence[tuple[int, int, float]], c2: float) -> LinearDecode:
        """``c0`` and ``c1`` fitted to ``(batch_size, context_tokens, seconds)`` samples with
        the KV-read term ``c2`` given (profiles at one context length cannot separate the
        per-request and per-context-token terms)."""
        if len(samples) < 2:
            raise InvalidInput("samples", len(samples), "need at least 2 samples to fit 2 terms")
        rows = [(1.0, float(b)) for b, _, _ in samples]
        c0, c1 = _lstsq(rows, [t - c2 * c for _, c, t in samples])
        return cls(c0, c1, c2)
