"""Prometheus metrics of the gateway (one registry per gateway, so tests can run several).

Event metrics (counters, histograms) are updated where things happen; per-engine state
(load, health, index size, KV-event queue depth) is read at scrape time by a collector, so an
engine that is removed simply stops appearing. Names are listed in ``docs/gateway.md``.
With several models, the families kept per model pool (:data:`POOL_FAMILIES`, the engine
state, in-flight requests) carry a ``model`` label; each pool updates its families through
its :class:`PoolMetrics`. With one model (the shorthand) they carry none, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from conductor.gateway.metrics_state import EngineSnapshot, StateCollector

TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TBT_BUCKETS_S = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.125, 0.15,
                 0.2, 0.3, 0.5, 1.0, 2.5)  # fmt: skip
DECISION_BUCKETS_S = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)
HOLD_BUCKETS_S = (0.0, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Late binding's hold times; the 0 bucket counts the requests placed at once."""
LAG_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Family(Protocol):
    """A labelled metric family: ``labels(*values)`` is its child."""

    def labels(self, *values: str) -> Any: ...


class _Fixed:
    """A family whose first label values are fixed (the pool's model)."""

    __slots__ = ("_family", "_prefix")

    def __init__(self, family: Family, prefix: tuple[str, ...]) -> None:
        self._family = family
        self._prefix = prefix

    def labels(self, *values: str) -> Any:
        return self._family.labels(*self._prefix, *values)


POOL_FAMILIES = (
    "decisions",
    "decision_latency",
    "predicted_ttft",
    "observed_ttft",
    "observed_tbt",
    "observed_prefill",
    "cache_hit_tokens",
    "prompt_tokens",
    "rejections",
    "responses",
    "finished",
    "retries",
    "engine_failures",
    "kv_lag",
    "kv_events",
    "kv_resyncs",
    "load_polls",
    "hold_time",
)
"""The metric families kept per model pool (labelled ``model`` with several models)."""


class PoolMetrics:
    """The per-pool metric families of one model (see :data:`POOL_FAMILIES`): each one's
    ``labels(...)`` takes the family's own labels, the model's is filled in."""

    decisions: Family
    decision_latency: Family
    predicted_ttft: Family
    observed_ttft: Family
    observed_tbt: Family
    observed_prefill: Family
    cache_hit_tokens: Family
    prompt_tokens: Family
    rejections: Family
    responses: Family
    finished: Family
    retries: Family
    engine_failures: Family
    kv_lag: Family
    kv_events: Family
    kv_resyncs: Family
    load_polls: Family
    hold_time: Family

    def __init__(self, owner: GatewayMetrics, model: str) -> None:
        self.model = model
        self._owner = owner
        for name in POOL_FAMILIES:
            family: Family = getattr(owner, name)
            setattr(self, name, _Fixed(family, (model,)) if owner.labelled else family)

    def child(self, metric: Family, *values: str) -> Any:
        """``metric.labels(*values)``, remembered (see :meth:`GatewayMetrics.child`)."""
        return self._owner.child(metric, *values)

    def count_held(self, held: Callable[[], int]) -> None:
        """``held()`` is the pool's late-binding queue length (``conductor_held_requests``,
        read at scrape time)."""
        self._owner.held[self.model] = held


class GatewayMetrics:
    """The gateway's metric objects, registered in their own :class:`CollectorRegistry`."""

    def __init__(self, *, labelled: bool = False) -> None:
        self.labelled = labelled
        """Per-pool families carry a ``model`` label (several models served)."""
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._pools: dict[str, PoolMetrics] = {}
        self.held: dict[str, Callable[[], int]] = {}
        """Each pool's late-binding queue length, by model (:meth:`PoolMetrics.count_held`)."""
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        m = ["model"] if labelled else []
        self.decisions = Counter(
            "conductor_decisions",
            "Scheduling decisions by policy and outcome (accepted or rejected)",
            [*m, "policy", "outcome"],
            registry=r,
        )
        self.decision_latency = Histogram(
            "conductor_decision_latency_seconds",
            "Wall time of one Scheduler.schedule() call",
            [*m, "policy"],
            buckets=DECISION_BUCKETS_S,
            registry=r,
        )
        self.predicted_ttft = Histogram(
            "conductor_predicted_ttft_seconds",
            "TTFT the scheduler predicted for accepted requests",
            [*m, "policy"],
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self.observed_ttft = Histogram(
            "conductor_observed_ttft_seconds",
            "TTFT observed by the gateway (scheduling to first streamed token)",
            [*m, "policy", "mode"],
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self.observed_tbt = Histogram(
            "conductor_observed_tbt_seconds",
            "TBT of completed streamed answers as the gateway relayed them (FAST's: the mean "
            "of the longest 10% of the token intervals)",
            [*m, "policy"],
            buckets=TBT_BUCKETS_S,
            registry=r,
        )
        self.observed_prefill = Histogram(
            "conductor_observed_prefill_seconds",
            "Disaggregated mode: scheduling to the end of the prefill leg",
            [*m, "policy"],
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self.cache_hit_tokens = Counter(
            "conductor_cache_hit_tokens",
            "Prompt tokens the chosen engine was expected to reuse from its cache",
            [*m, "policy"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "conductor_prompt_tokens",
            "Prompt tokens of accepted requests",
            [*m, "policy"],
            registry=r,
        )
        self.rejections = Counter(
            "conductor_rejections",
            "Requests the scheduler rejected, by reason",
            [*m, "reason"],
            registry=r,
        )
        self.responses = Counter(
            "conductor_http_responses",
            "Responses of the OpenAI endpoints by endpoint and status code",
            [*m, "endpoint", "status"],
            registry=r,
        )
        self.finished = Counter(
            "conductor_requests_finished",
            "Accepted requests by how they ended (completed, upstream_error, client_disconnect, "
            "timeout, error)",
            [*m, "outcome"],
            registry=r,
        )
        self.retries = Counter(
            "conductor_retries",
            "Requests scheduled again after an engine failed to start them",
            [*m, "reason"],
            registry=r,
        )
        self.engine_failures = Counter(
            "conductor_engine_failures",
            "Engines marked unhealthy, by reason (health check, request failure)",
            [*m, "engine", "reason"],
            registry=r,
        )
        self.kv_lag = Histogram(
            "conductor_kv_event_lag_seconds",
            "Engine publication (batch ts) to the event reaching the index",
            [*m, "engine"],
            buckets=LAG_BUCKETS_S,
            registry=r,
        )
        self.kv_events = Counter(
            "conductor_kv_events",
            "KV events applied to the prefix index by engine and kind",
            [*m, "engine", "kind"],
            registry=r,
        )
        self.kv_resyncs = Counter(
            "conductor_kv_resyncs",
            "Times an engine's index entries were cleared to resynchronise, by reason",
            [*m, "engine", "reason"],
            registry=r,
        )
        self.load_polls = Counter(
            "conductor_load_polls",
            "Polls of engines' /metrics by result (ok, error)",
            [*m, "engine", "result"],
            registry=r,
        )
        self.hold_time = Histogram(
            "conductor_hold_seconds",
            "Late binding: time a request waited in the gateway's queue before it was placed, "
            "rejected (its TTFT budget gone) or withdrawn (client gone); 0 when placed at once",
            [*m, "outcome"],
            buckets=HOLD_BUCKETS_S,
            registry=r,
        )

    def child(self, metric: Family, *values: str) -> Any:
        """``metric.labels(*values)``, remembered (the request path's label lookups are a
        measurable share of its CPU; no metric child is ever removed)."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def pool(self, model: str) -> PoolMetrics:
        """The per-pool families of ``model`` ("": requests that named no model served)."""
        found = self._pools.get(model)
        if found is None:
            found = self._pools[model] = PoolMetrics(self, model)
        return found

    def attach_state(
        self,
        engines: Callable[[], Iterable[EngineSnapshot]],
        inflight: Callable[[], Iterable[tuple[str, int]]],
    ) -> None:
        """Export the engines' state and each model's in-flight requests at scrape time."""
        self._state = StateCollector(engines, inflight, self.labelled, self.held)
        self.registry.register(self._state)

    def attach_http(self, counters: Callable[[], Mapping[str, int]]) -> None:
        """Export the HTTP server's refusal counters (431, 408, connection cap...)."""
        self._state._http = counters

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


__all__ = ["EngineSnapshot", "Family", "GatewayMetrics", "PoolMetrics"]
