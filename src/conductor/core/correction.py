"""Online correction of the cost model from what the engines report (pure, deterministic).

The scheduler predicts with a nominal :class:`~conductor.core.costmodel.CostModel`; real
engines are slower or faster than it, and noisy. :class:`CostCorrection` learns, per
instance, one multiplicative factor for prefill time and one for the decode step time:

* **observations** — a prefill's measured duration against the nominal
  ``prefill_s(prompt, cached)`` of the tokens it really reused (``PrefillFinished`` with
  ``duration_s`` and ``cached_tokens``); a decode instance's iteration statistics
  (``DecodeStepsObserved``: ``steps`` iterations in ``busy_s``, with their batch sizes and
  contexts summed) against ``steps x decode_step_s(mean batch, mean context)`` — exact for the
  linear step model;
* **update** — exponentially weighted sums of observed and nominal seconds,
  ``S_obs <- S_obs + w (obs - S_obs)``, ``S_nom <- S_nom + w (nom - S_nom)`` (the first sample
  sets both), factor ``S_obs / S_nom``: the time-weighted mean ratio of the recent jobs (long
  jobs, which dominate queues, count most). Each observation is first clamped to
  ``[nom / 4, 4 nom]`` and the factor to ``[1/4, 4]``, so no single report moves it far;
* **application** — the factors are rounded to ``1%`` steps; the scheduler then predicts with
  the nominal model scaled by the geometric mean of its instances' factors (prefill over
  instances that prefill, decode over those that decode) — policies price every candidate with
  one model (a per-instance factor beyond the pool's is kept, not yet applied: the simulated
  engines deviate alike). With engines that match the model every factor is exactly 1 and
  nothing changes.

``EngineLoad`` (what the gateway polls from each engine: running and waiting requests, KV use)
corrects the load estimate directly: see :func:`apply_engine_load`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from conductor.core.cost_forms import DecodeModel, PrefillModel
from conductor.core.costmodel import CostModel
from conductor.core.events import DecodeStepsObserved, EngineLoad, Event, PrefillFinished
from conductor.core.state import InstanceState
from conductor.core.types import InstanceId, Request, RequestId

CORRECTION_WEIGHT = 0.05
"""EWMA weight of one observation (memory of about 20 observations)."""
FACTOR_BOUNDS = (0.25, 4.0)
"""The factor, and each observation's ratio, are clamped to this range."""
FACTOR_STEP = 0.01
"""Factors are applied rounded to this step (no churn from noise below 1%)."""


@dataclass(frozen=True, slots=True)
class ScaledPrefill:
    base: PrefillModel
    factor: float

    def time_s(self, prompt_tokens: int, cached_tokens: int) -> float:
        return self.base.time_s(prompt_tokens, cached_tokens) * self.factor


@dataclass(frozen=True, slots=True)
class ScaledDecode:
    base: DecodeModel
    factor: float

    def step_s(self, batch_size: float, context_tokens: float) -> float:
        return self.base.step_s(batch_size, context_tokens) * self.factor


class _Ratio:
    """EWMA sums of observed and nominal seconds; ``factor`` their clamped, rounded ratio
    (kept up to date by :meth:`update`)."""

    __slots__ = ("factor", "nominal", "observed", "samples")

    def __init__(self) -> None:
        self.observed = 0.0
        self.nominal = 0.0
        self.samples = 0
        self.factor = 1.0

    def update(self, observed_s: float, nominal_s: float, weight: float) -> bool:
        """Fold one observation in; True when the rounded factor changed."""
        lo, hi = FACTOR_BOUNDS
        observed_s = min(max(observed_s, nominal_s * lo), nominal_s * hi)
        if self.samples == 0:
            self.observed, self.nominal = observed_s, nominal_s
        else:
            self.observed += weight * (observed_s - self.observed)
            self.nominal += weight * (nominal_s - self.nominal)
        self.samples += 1
        f = min(max(self.observed / self.nominal, lo), hi) if self.nominal > 0 else 1.0
        f = round(f / FACTOR_STEP) * FACTOR_STEP
        changed = f != self.factor or self.samples == 1  # a new member of the pool mean
        self.factor = f
        return changed


class Placed(Protocol):
    """What the correction reads of an in-flight request: its prompt and CPP group."""

    @property
    def request(self) -> Request: ...
    @property
    def cpp_nodes(self) -> tuple[InstanceId, ...]: ...


class CostCorrection:
    """Per-instance prefill and decode factors, and the corrected model they give (see the
    module docstring). ``cost`` is what the scheduler should predict with now; with
    ``enabled`` False it stays the nominal model (engine load reports still apply)."""

    def __init__(
        self, nominal: CostModel, *, enabled: bool = True, weight: float = CORRECTION_WEIGHT
    ) -> None:
        self.nominal = nominal
        self.enabled = enabled
        self.weight = weight
        self.prefill: dict[InstanceId, _Ratio] = {}
        self.decode: dict[InstanceId, _Ratio] = {}
        self.cost = nominal
        self._pool = (1.0, 1.0)
        self._instances = 0

    def observe(
        self,
        event: Event,
        instances: Mapping[InstanceId, InstanceState],
        placed: Callable[[RequestId], Placed | None],
    ) -> bool:
        """Learn from ``event``; True when it was an engine report the scheduler need not
        see (:class:`DecodeStepsObserved`, :class:`EngineLoad`)."""
        if len(instances) != self._instances:  # one came or went: drop the gone ones' factors
            self._instances = len(instances)
            self._prune(instances)
        if isinstance(event, PrefillFinished):
            if self.enabled and event.duration_s is not None and event.cached_tokens is not None:
                f = placed(event.request_id)
                if f is not None and not f.cpp_nodes:  # a pipelined prefill spans nodes
                    p = f.request.prompt_tokens
                    self.observe_prefill(event.instance, p, event.cached_tokens, event.duration_s)
            return False
        if isinstance(event, DecodeStepsObserved):
            if self.enabled and event.instance in instances:
                self.observe_decode(event)
            return True
        if isinstance(event, EngineLoad):
            state = instances.get(event.instance)
            if state is not None:
                apply_engine_load(state, event, self.cost)
            return True
        return False

    def prefill_factor(self, instance: InstanceId) -> float:
        r = self.prefill.get(instance)
        return r.factor if r is not None else self._pool[0]

    def decode_factor(self, instance: InstanceId) -> float:
        r = self.decode.get(instance)
        return r.factor if r is not None else self._pool[1]

    def observe_prefill(
        self, instance: InstanceId, prompt_tokens: int, cached_tokens: int, duration_s: float
    ) -> None:
        nominal = self.nominal.prefill_s(prompt_tokens, cached_tokens)
        if duration_s > 0 and nominal > 0:
            ratio = self.prefill.setdefault(instance, _Ratio())
            if ratio.update(duration_s, nominal, self.weight):
                self._refresh()

    def observe_decode(self, obs: DecodeStepsObserved) -> None:
        if obs.steps <= 0 or obs.busy_s <= 0:
            return
        n = obs.steps
        nominal = n * self.nominal.decode.step_s(obs.batch_sum / n, obs.context_sum / n)
        if nominal > 0:
            ratio = self.decode.setdefault(obs.instance, _Ratio())
            if ratio.update(obs.busy_s, nominal, self.weight):
                self._refresh()

    def _prune(self, instances: Mapping[InstanceId, InstanceState]) -> None:
        """Drop the factors of instances that are gone (they leave the pool's mean)."""
        for table in (self.prefill, self.decode):
            for iid in [i for i in table if i not in instances]:
                del table[iid]
        self._refresh()

    def _refresh(self) -> None:
        pool = (_geomean(self.prefill.values()), _geomean(self.decode.values()))
        if pool == self._pool:
            return
        self._pool = pool
        p, d = pool
        n = self.nominal
        self.cost = replace(
            n,
            prefill=n.prefill if p == 1.0 else ScaledPrefill(n.prefill, p),
            decode=n.decode if d == 1.0 else ScaledDecode(n.decode, d),
        )


def _geomean(ratios: Iterable[_Ratio]) -> float:
    factors = [r.factor for r in ratios if r.samples > 0]
    if not factors:
        return 1.0
    g = math.exp(sum(math.log(f) for f in factors) / len(factors))
    return round(g / FACTOR_STEP) * FACTOR_STEP


def apply_engine_load(state: InstanceState, load: EngineLoad, cost: CostModel) -> None:
    """Fold an engine's reported load into the scheduler's estimate of ``state``.

    Prefill: the engine's ``running + waiting`` requests (``waiting`` only, on an engine that
    also decodes) are what it still has to prefill.
    If it reports none while the estimate still has time queued but no request (predictions
    ran long), the queue is re-anchored at ``now``; if it reports more requests than the
    scheduler placed there (traffic from elsewhere, or a stale estimate), the queue is at least
    ``reported x`` the predicted prefill of the mean queued request's new tokens (2,048 when
    none are queued) — idempotent, so polling often does not pile it up. Decode-only instances are
    left to the scheduler's own KV and batch accounting (the gateway exports their reported
    KV use in ``/metrics``)."""
    if not state.spec.role.prefills:
        return
    p = state.prefill
    now = load.now_s
    # an engine that also decodes counts its decoding requests as running: only its waiting
    # ones are then known to be prefill work
    reported = load.waiting + (0 if state.spec.role.decodes else load.running)
    known = p.queued_requests
    if reported == 0 and known == 0:
        if p.busy_until_s > now:
            p.busy_until_s = now
        return
    if reported > known:
        tokens = p.queued_tokens // known if known and p.queued_tokens > 0 else 2048
        p.busy_until_s = max(p.busy_until_s, now + reported * cost.prefill_s(tokens, 0))
