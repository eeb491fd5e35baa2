"""The late-binding rule a policy opts in with (:mod:`conductor.core.late_binding`): a
plain value, so that policies can name it without importing the scheduler."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the scheduler imports the policies, which name this module
    from conductor.core.scheduler import Scheduler


@dataclass(frozen=True, slots=True)
class LateBinding:
    """A policy's late-binding rule: see the module docstring."""

    horizon_s: float
    decode_aware: bool = True
    tbt_margin: float = 0.0
    nic_aware: bool = True
    age_weight: float = math.inf
    """How the queue orders what it holds: by ``prefill_s + age_weight * deadline_s`` (a
    request's prefill time with the longest cached prefix at arrival, and its deadline);
    ``inf``: deadline order."""
    reject_ahead: bool = False
    """With an order by key and an admission mode other than ``off``: reject a request at
    arrival when its TTFT, predicted with the requests held ahead of it list-scheduled on
    the prefill instances first, already misses its SLO (it would wait out its budget and
    be rejected then)."""
    headroom_margin: float = 1.0
    """The decode condition's limit is the larger of ``(1 - tbt_margin) x SLO`` and
    ``idle + (1 - headroom_margin) x (SLO - idle)``, ``idle`` the request's TBT alone on an
    idle instance: where the SLO sits close to the model's smallest step, a margin of the
    SLO would leave no room for load at all (:mod:`conductor.core.hold_decode`); 1 keeps
    the first alone."""

    def __post_init__(self) -> None:
        if not self.horizon_s >= 0.0:
            raise ValueError(f"horizon_s must be >= 0, got {self.horizon_s}")
        if not self.age_weight >= 0.0:
            raise ValueError(f"age_weight must be >= 0, got {self.age_weight}")
        if not 0.0 <= self.headroom_margin <= 1.0:
            raise ValueError(f"headroom_margin must be in [0, 1], got {self.headroom_margin}")


HOLD_HEADROOM_MARGIN = 0.3
"""``conductor``'s :attr:`LateBinding.headroom_margin`: chosen on generated workloads
(``conductor trace synth``, seeds 42 and 7, TBT SLO 50 ms, where the default cost model's
smallest step is 44 ms; docs/policies.md) among 0.1, 0.2, 0.3, 0.5 and 0.7. With a TBT SLO
above 1.5x the smallest TBT (the default 100 ms) it changes nothing."""

HOLD_AGE_WEIGHT = 0.2
"""``conductor``'s hold-queue order (:attr:`LateBinding.age_weight`): shortest prefill first
(cached prefix counted), a second of waiting worth 0.2 s of prefill. Chosen on generated
workloads (``conductor trace synth``, seed 7; docs/policies.md), not on the traces the
results are reported on."""

CLAIM_LAG_FLOOR_S = 0.010
"""The least stagger between replicas claiming a freed prefill instance (see
:func:`claim_lag_s`)."""


def claim_lag_s(sync_delay_s: float) -> float:
    """How long after an instance's owner the next replica counts a freed prefill instance
    as free (:class:`~conductor.core.late_binding.HoldQueue`'s ``claim``): twice the lag of
    the replicas' views of each other (a claim reaches the others one lag later; the second
    covers its jitter), and at least :data:`CLAIM_LAG_FLOOR_S`. Chosen on generated
    workloads (docs/cluster.md), not on the trace the herding results are reported on."""
    return max(2.0 * sync_delay_s, CLAIM_LAG_FLOOR_S)


def late_binding_of(scheduler: Scheduler) -> LateBinding | None:
    """The scheduler's policy's late-binding rule, unless the run switches it off
    (``policy_params["late_binding"] == 0``); ``policy_params["late_binding_<field>"]``
    overrides each of its fields (``horizon_s``, ``decode_aware``, ``tbt_margin``,
    ``nic_aware``, ``age_weight``, ``reject_ahead``, ``headroom_margin``)."""
    rule = getattr(scheduler.policy, "late_binding", None)
    if not isinstance(rule, LateBinding):
        return None
    params = scheduler.config.policy_params
    if params.get("late_binding", 1.0) == 0.0:
        return None
    return LateBinding(
        params.get("late_binding_horizon_s", rule.horizon_s),
        bool(params.get("late_binding_decode_aware", float(rule.decode_aware))),
        params.get("late_binding_tbt_margin", rule.tbt_margin),
        bool(params.get("late_binding_nic_aware", float(rule.nic_aware))),
        params.get("late_binding_age_weight", rule.age_weight),
        bool(params.get("late_binding_reject_ahead", float(rule.reject_ahead))),
        params.get("late_binding_headroom_margin", rule.headroom_margin),
    )
