"""Prometheus metrics of the gateway (one registry per gateway, so tests can run several).

Event metrics (counters, histograms) are updated where things happen; per-engine state
(load, health, index size, KV-event queue depth) is read at scrape time by a collector, so an
engine that is removed simply stops appearing. Names are listed in ``docs/gateway.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DECISION_BUCKETS_S = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)
LAG_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """One engine's state at scrape time."""

    engine_id: str
    role: str
    healthy: bool
    draining: bool
    queued_requests: int
    queued_prefill_tokens: int
    running_requests: int
    kv_reserved_tokens: int
    reported_waiting: int
    reported_running: int
    reported_kv_usage: float
    indexed_blocks: int
    kv_queue_depth: int
    kv_events_dropped: int
    kv_needs_resync: bool
    kv_dropped_by_reason: Mapping[str, int] = field(default_factory=dict)
    """KV messages (undecodable) and events (queue full, over capacity, ...) dropped."""
    kv_silent: bool = False


class _StateCollector(Collector):
    def __init__(
        self, engines: Callable[[], Iterable[EngineSnapshot]], inflight: Callable[[], int]
    ) -> None:
        self._engines = engines
        self._inflight = inflight
        self._http: Callable[[], Mapping[str, int]] | None = None

    def collect(self) -> Iterator[Metric]:
        snaps = list(self._engines())

        def gauge(name: str, doc: str, value: Callable[[EngineSnapshot], float]) -> Metric:
            fam = GaugeMetricFamily(name, doc, labels=["engine", "role"])
            for s in snaps:
                fam.add_metric([s.engine_id, s.role], value(s))
            return fam

        yield gauge(
            "conductor_engine_queued_requests",
            "Requests whose prefill the scheduler has queued on the engine (our bookkeeping)",
            lambda s: s.queued_requests,
        )
        yield gauge(
            "conductor_engine_queued_prefill_tokens",
            "New prompt tokens queued for prefill on the engine (our bookkeeping)",
            lambda s: s.queued_prefill_tokens,
        )
        yield gauge(
            "conductor_engine_running_requests",
            "Requests holding a decode reservation on the engine (our bookkeeping)",
            lambda s: s.running_requests,
        )
        yield gauge(
            "conductor_engine_kv_reserved_tokens",
            "KV tokens reserved on the engine by admitted requests (our bookkeeping)",
            lambda s: s.kv_reserved_tokens,
        )
        yield gauge(
            "conductor_engine_reported_waiting_requests",
            "vllm:num_requests_waiting as last polled from the engine",
            lambda s: s.reported_waiting,
        )
        yield gauge(
            "conductor_engine_reported_running_requests",
            "vllm:num_requests_running as last polled from the engine",
            lambda s: s.reported_running,
        )
        yield gauge(
            "conductor_engine_reported_kv_usage_ratio",
            "vllm:kv_cache_usage_perc (0-1) as last polled from the engine",
            lambda s: s.reported_kv_usage,
        )
        yield gauge("conductor_engine_healthy", "1 if the engine is healthy", lambda s: s.healthy)
        yield gauge(
            "conductor_engine_draining", "1 if the engine takes no new work", lambda s: s.draining
        )
        yield gauge(
            "conductor_engine_indexed_blocks",
            "Blocks the prefix index holds for the engine (from its KV events)",
            lambda s: s.indexed_blocks,
        )
        yield gauge(
            "conductor_kv_event_queue_depth",
            "Core events waiting in the engine's bounded KV-event queue",
            lambda s: s.kv_queue_depth,
        )
        yield gauge(
            "conductor_kv_event_needs_resync",
            "1 while the engine's index entries are being rebuilt after a loss",
            lambda s: s.kv_needs_resync,
        )
        drops = CounterMetricFamily(
            "conductor_kv_event_drops",
            "KV events dropped because the engine's queue was full",
            labels=["engine", "role"],
        )
        for s in snaps:
            drops.add_metric([s.engine_id, s.role], s.kv_events_dropped)
        yield drops
        dropped = CounterMetricFamily(
            "conductor_kv_dropped",
            "KV-event messages (undecodable) and events (queue_full, over_capacity, "
            "missing_parent, bad_length, ...) dropped, by reason",
            labels=["engine", "reason"],
        )
        for s in snaps:
            for reason, count in sorted(s.kv_dropped_by_reason.items()):
                dropped.add_metric([s.engine_id, reason], count)
        yield dropped
        yield gauge(
            "conductor_engine_kv_silent",
            "1 if the engine served traffic but no KV event reached the gateway",
            lambda s: s.kv_silent,
        )
        if self._http is not None:
            refused = CounterMetricFamily(
                "conductor_http_refused",
                "Connections and requests the HTTP server refused, by reason",
                labels=["reason"],
            )
            for reason, count in sorted(self._http().items()):
                refused.add_metric([reason], count)
            yield refused
        inflight = GaugeMetricFamily(
            "conductor_inflight_requests", "Accepted requests not yet finished"
        )
        inflight.add_metric([], self._inflight())
        yield inflight


class GatewayMetrics:
    """The gateway's metric objects, registered in their own :class:`CollectorRegistry`."""

    def __init__(self) -> None:
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.decisions = Counter(
            "conductor_decisions",
            "Scheduling decisions by policy and outcome (accepted or rejected)",
            ["policy", "outcome"],
            registry=r,
        )
        self.decision_latency = Histogram(
            "conductor_decision_latency_seconds",
            "Wall time of one Scheduler.schedule() call",
            ["policy"],
            buckets=DECISION_BUCKETS_S,
            registry=r,
        )
        self.predicted_ttft = Histogram(
            "conductor_predicted_ttft_seconds",
            "TTFT the scheduler predicted for accepted requests",
            ["policy"],
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self.observed_ttft = Histogram(
            "conductor_observed_ttft_seconds",
            "TTFT observed by the gateway (scheduling to first streamed token)",
            ["policy", "mode"],
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self.observed_prefill = Histogram(
            "conductor_observed_prefill_seconds",
            "Disaggregated mode: scheduling to the end of the prefill leg",
            ["policy"],
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self.cache_hit_tokens = Counter(
            "conductor_cache_hit_tokens",
            "Prompt tokens the chosen engine was expected to reuse from its cache",
            ["policy"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "conductor_prompt_tokens", "Prompt tokens of accepted requests", ["policy"], registry=r
        )
        self.rejections = Counter(
            "conductor_rejections",
            "Requests the scheduler rejected, by reason",
            ["reason"],
            registry=r,
        )
        self.responses = Counter(
            "conductor_http_responses",
            "Responses of the OpenAI endpoints by endpoint and status code",
            ["endpoint", "status"],
            registry=r,
        )
        self.finished = Counter(
            "conductor_requests_finished",
            "Accepted requests by how they ended (completed, upstream_error, client_disconnect, "
            "timeout, error)",
            ["outcome"],
            registry=r,
        )
        self.retries = Counter(
            "conductor_retries",
            "Requests scheduled again after an engine failed to start them",
            ["reason"],
            registry=r,
        )
        self.engine_failures = Counter(
            "conductor_engine_failures",
            "Engines marked unhealthy, by reason (health check, request failure)",
            ["engine", "reason"],
            registry=r,
        )
        self.kv_lag = Histogram(
            "conductor_kv_event_lag_seconds",
            "Engine publication (batch ts) to the event reaching the index",
            ["engine"],
            buckets=LAG_BUCKETS_S,
            registry=r,
        )
        self.kv_events = Counter(
            "conductor_kv_events",
            "KV events applied to the prefix index by engine and kind",
            ["engine", "kind"],
            registry=r,
        )
        self.kv_resyncs = Counter(
            "conductor_kv_resyncs",
            "Times an engine's index entries were cleared to resynchronise, by reason",
            ["engine", "reason"],
            registry=r,
        )
        self.load_polls = Counter(
            "conductor_load_polls",
            "Polls of engines' /metrics by result (ok, error)",
            ["engine", "result"],
            registry=r,
        )

    def child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, remembered (the request path's label lookups are a
        measurable share of its CPU; no metric child is ever removed)."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def attach_state(
        self, engines: Callable[[], Iterable[EngineSnapshot]], inflight: Callable[[], int]
    ) -> None:
        self._state = _StateCollector(engines, inflight)
        self.registry.register(self._state)

    def attach_http(self, counters: Callable[[], Mapping[str, int]]) -> None:
        """Export the HTTP server's refusal counters (431, 408, connection cap...)."""
        self._state._http = counters

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
