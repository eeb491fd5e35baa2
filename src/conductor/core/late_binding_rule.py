"""The late-binding rule a policy opts in with (:mod:`conductor.core.late_binding`): a
plain value, so that policies can name it without importing the scheduler."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LateBinding:
    """A policy's late-binding rule: see the module docstring."""

    horizon_s: float
    decode_aware: bool = True
    tbt_margin: float = 0.0
    nic_aware: bool = True

    def __post_init__(self) -> None:
        if not self.horizon_s >= 0.0:
            raise ValueError(f"horizon_s must be >= 0, got {self.horizon_s}")
