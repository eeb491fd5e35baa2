"""The gateway's state read at scrape time: one :class:`EngineSnapshot` per engine and the
collector that exports them (per engine, and per model with several models)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


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
    model: str = ""
    """The model whose pool the engine is in."""
    model_error: str | None = None
    """Why the engine is out for serving another model than its config says (None: not)."""


class StateCollector(Collector):
    def __init__(
        self,
        engines: Callable[[], Iterable[EngineSnapshot]],
        inflight: Callable[[], Iterable[tuple[str, int]]],
        labelled: bool,
        held: Mapping[str, Callable[[], int]] | None = None,
    ) -> None:
        self._engines = engines
        self._inflight = inflight
        self._labelled = labelled
        self._held = held if held is not None else {}
        self._http: Callable[[], Mapping[str, int]] | None = None

    def collect(self) -> Iterator[Metric]:
        snaps = list(self._engines())
        by_model = self._labelled
        names = ["engine", "model", "role"] if by_model else ["engine", "role"]

        def gauge(name: str, doc: str, value: Callable[[EngineSnapshot], float]) -> Metric:
            fam = GaugeMetricFamily(name, doc, labels=names)
            for s in snaps:
                fam.add_metric(_engine_labels(s, by_model), value(s))
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
            labels=names,
        )
        for s in snaps:
            drops.add_metric(_engine_labels(s, by_model), s.kv_events_dropped)
        yield drops
        dropped = CounterMetricFamily(
            "conductor_kv_dropped",
            "KV-event messages (undecodable) and events (queue_full, over_capacity, "
            "missing_parent, bad_length, ...) dropped, by reason",
            labels=["engine", "model", "reason"] if by_model else ["engine", "reason"],
        )
        for s in snaps:
            for reason, count in sorted(s.kv_dropped_by_reason.items()):
                dropped.add_metric([s.engine_id, *([s.model] if by_model else []), reason], count)
        yield dropped
        yield gauge(
            "conductor_engine_kv_silent",
            "1 if the engine served traffic but no KV event reached the gateway",
            lambda s: s.kv_silent,
        )
        yield gauge(
            "conductor_engine_model_mismatch",
            "1 while the engine is out for serving another model than its config says",
            lambda s: s.model_error is not None,
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
            "conductor_inflight_requests",
            "Accepted requests not yet finished",
            labels=["model"] if by_model else [],
        )
        counts = list(self._inflight())
        if by_model:
            for model, count in counts:
                inflight.add_metric([model], count)
        else:
            inflight.add_metric([], sum(count for _, count in counts))
        yield inflight
        held = GaugeMetricFamily(
            "conductor_held_requests",
            "Late binding: requests waiting in the gateway's queue to be placed",
            labels=["model"] if by_model else [],
        )
        if by_model:
            for model, count_held in self._held.items():
                held.add_metric([model], count_held())
        else:
            held.add_metric([], sum(count_held() for count_held in self._held.values()))
        yield held


def _engine_labels(s: EngineSnapshot, by_model: bool) -> list[str]:
    return [s.engine_id, s.model, s.role] if by_model else [s.engine_id, s.role]
