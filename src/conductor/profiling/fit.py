"""From a profile's samples to a cost model: the forms of :class:`PolynomialPrefill` and
:class:`LinearDecode` fitted by least squares on relative error with coefficients >= 0
(:func:`nonnegative_lstsq`), each sample's residual, and the
``[measured]`` table of the cost file (what was measured, when, and how well it fits)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from conductor.core.cost_file import UNKNOWN_HARDWARE
from conductor.core.costmodel import CostModel, LinearDecode, ModelSpec, PolynomialPrefill
from conductor.profiling.measure import DecodeSample, Measurements, PrefillSample, ProfileError


@dataclass(frozen=True, slots=True)
class Residual:
    """One sample against the fit: ``what`` (``new 512``, ``cached 512 (256)``, ``decode
    B=4 C=2176``), measured and fitted seconds."""

    what: str
    measured_s: float
    fitted_s: float

    @property
    def error(self) -> float:
        """(fitted - measured) / measured."""
        return (self.fitted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True, slots=True)
class Fit:
    prefill: PolynomialPrefill
    decode: LinearDecode
    prefill_residuals: tuple[Residual, ...]
    decode_residuals: tuple[Residual, ...]


def rms(residuals: Sequence[Residual]) -> float:
    """Root mean square of the relative errors."""
    if not residuals:
        return 0.0
    return math.sqrt(sum(r.error**2 for r in residuals) / len(residuals))


def _prefill_label(s: PrefillSample) -> str:
    if s.kind == "new":
        return f"prefill {s.prompt_tokens} new"
    return f"prefill {s.prompt_tokens}, {s.cached_tokens} cached"


def nonnegative_lstsq(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Coefficients >= 0 minimising the squared *relative* error of ``rows @ c`` against
    ``ys``: the best of the least-squares fits on every subset of the terms that keeps the
    first (the fixed overhead, > 0: every step and prefill pays one) and whose
    coefficients all come out >= 0 (a handful of terms: exhaustive is exact and cheap).
    Noisy timings otherwise give negative terms that predict nonsense outside the samples."""
    x = np.asarray(rows, dtype=float)
    y = np.asarray(ys, dtype=float)
    if not (y > 0).all():
        raise ProfileError(f"timings must be > 0 s to fit, got {sorted(ys)[:3]}")
    w = 1.0 / y
    xw, yw = x * w[:, None], y * w
    n = x.shape[1]
    best: tuple[float, list[float]] | None = None
    for subset in itertools.chain.from_iterable(
        itertools.combinations(range(1, n), k) for k in range(n)
    ):
        cols = [0, *subset]
        part = xw[:, cols]
        scale = np.abs(part).max(axis=0)
        scale[scale == 0] = 1.0
        coef, *_ = np.linalg.lstsq(part / scale, yw, rcond=None)
        coef = coef / scale
        if (coef < 0).any() or coef[0] <= 0:
            continue
        full = [0.0] * n
        for c, v in zip(cols, coef, strict=True):
            full[c] = float(v)
        err = float(np.sum((xw @ np.asarray(full) - yw) ** 2))
        if best is None or err < best[0]:
            best = (err, full)
    assert best is not None  # the overhead alone fits positive ys with c0 > 0
    return best[1]


def fit_prefill(samples: Sequence[PrefillSample]) -> PolynomialPrefill:
    """:class:`PolynomialPrefill` by :func:`nonnegative_lstsq`."""
    rows = []
    for s in samples:
        m = s.prompt_tokens - min(s.cached_tokens, s.prompt_tokens - 1)
        rows.append((1.0, float(m), float(s.prompt_tokens), float(m) * s.prompt_tokens))
    c = nonnegative_lstsq(rows, [s.seconds for s in samples])
    return PolynomialPrefill(c[0], c[1], c[2], c[3])


def fit_decode(samples: Sequence[DecodeSample]) -> LinearDecode:
    """:class:`LinearDecode` by :func:`nonnegative_lstsq`."""
    rows = [(1.0, float(s.batch_size), float(s.context_tokens)) for s in samples]
    c = nonnegative_lstsq(rows, [s.seconds for s in samples])
    return LinearDecode(c[0], c[1], c[2])


def fit(m: Measurements) -> Fit:
    """Both fits; :class:`ProfileError` when too few samples came back to fit them."""
    if len(m.prefill) < 4 or len(m.decode) < 3:
        raise ProfileError(
            f"{len(m.prefill)} prefill and {len(m.decode)} decode samples; need 4 and 3"
        )
    prefill = fit_prefill(m.prefill)
    decode = fit_decode(m.decode)
    pre = tuple(
        Residual(_prefill_label(s), s.seconds, prefill.time_s(s.prompt_tokens, s.cached_tokens))
        for s in m.prefill
    )
    dec = tuple(
        Residual(
            f"decode B={s.batch_size}, {s.prompt_tokens}-token prompts",
            s.seconds,
            decode.step_s(s.batch_size, s.context_tokens),
        )
        for s in m.decode
    )
    return Fit(prefill, decode, pre, dec)


def cost_model(
    name: str,
    model: ModelSpec,
    f: Fit,
    *,
    kv_capacity_tokens: int,
    max_batch_size: int,
    transfer_bytes_per_s: float,
    transfer_latency_s: float,
    source: str,
) -> CostModel:
    return CostModel(
        name=name,
        model=model,
        hardware=UNKNOWN_HARDWARE,
        prefill=f.prefill,
        decode=f.decode,
        transfer_bytes_per_s=transfer_bytes_per_s,
        transfer_latency_s=transfer_latency_s,
        kv_capacity_tokens=kv_capacity_tokens,
        max_batch_size=max_batch_size,
        source=source,
    )


def measured_table(
    m: Measurements, f: Fit, *, at: str, url: str, served_model: str, extra: dict[str, Any]
) -> dict[str, Any]:
    """The ``[measured]`` table: provenance, every sample and the fit's residuals."""

    def r6(x: float) -> float:
        return round(x, 6)

    return {
        "at": at,
        "url": url,
        "served_model": served_model,
        **extra,
        "requests": m.requests,
        "cached_tokens_from": "engine usage" if m.engine_reported_cached else "prefix sent",
        "prefill_samples": [[s.prompt_tokens, s.cached_tokens, r6(s.seconds)] for s in m.prefill],
        "prefill_samples_columns": "prompt_tokens, cached_tokens, median seconds to first token",
        "decode_samples": [[s.batch_size, s.context_tokens, r6(s.seconds)] for s in m.decode],
        "decode_samples_columns": "batch_size, context_tokens, median seconds per token",
        "prefill_rms_error": r6(rms(f.prefill_residuals)),
        "prefill_max_error": r6(max(abs(r.error) for r in f.prefill_residuals)),
        "decode_rms_error": r6(rms(f.decode_residuals)),
        "decode_max_error": r6(max(abs(r.error) for r in f.decode_residuals)),
    }
