"""Recalibrating a cost preset (:data:`conductor.core.costmodel.PRESETS`) for the engines a
gateway serves, from rates measured on them (``conductor serve --prefill-tokens-per-s`` and
``--decode-step-ms``):

* ``prefill_tokens_per_s``: replaces the prefill model by ``T = c0 + new_tokens / rate``
  (``c0`` = the preset's fixed overhead);
* ``decode_step_ms``: replaces the decode model by a constant step time plus a small
  per-request term.
"""

from __future__ import annotations

from conductor.core.checks import check_positive
from conductor.core.costmodel import CostModel, LinearDecode, PolynomialPrefill, RooflinePrefill


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
        check_positive("prefill_tokens_per_s", prefill_tokens_per_s)
        changes["prefill"] = PolynomialPrefill(
            _overhead_s(cost), 1.0 / prefill_tokens_per_s, 0.0, 0.0
        )
    if decode_step_ms is not None:
        check_positive("decode_step_ms", decode_step_ms)
        changes["decode"] = LinearDecode(decode_step_ms / 1e3, 1e-4, 0.0)
    if not changes:
        return cost
    return cost.with_(name=f"{cost.name}+calibrated", **changes)
