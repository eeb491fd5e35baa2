"""Which engines the gateway has, and in what state: add, remove, drain, mark unhealthy.

:class:`EngineSet` keeps one :class:`~conductor.gateway.engines.handle.EngineHandle` per engine
beside the scheduler's ``instances`` and is the one place both change together. It also
answers the read-only questions about them (:meth:`EngineSet.snapshot` for ``/metrics`` and
the admin API, :meth:`EngineSet.can_serve` for ``/health``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from conductor.core.events import AllBlocksCleared
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceSpec
from conductor.core.types import InstanceId
from conductor.gateway.config import EngineConfig, MonitorConfig, check_engine_fits
from conductor.gateway.engines.handle import EngineHandle, make_handle
from conductor.gateway.errors import Conflict, NotFound
from conductor.gateway.metrics import PoolMetrics
from conductor.gateway.metrics_state import EngineSnapshot
from conductor.gateway.model_config import ModelConfig

log = logging.getLogger(__name__)


def kv_drops(handle: EngineHandle) -> dict[str, int]:
    """What the engine's KV feed dropped, by reason (undecodable messages, events lost to a
    full queue, events the mapper skipped)."""
    feed, ingest = handle.feed, handle.ingest
    out: dict[str, int] = {}
    if feed is not None:
        out["undecodable"] = feed.stats.decode_errors
        out["queue_full"] = feed.stats.drops
    if ingest is not None:
        out.update(ingest.mapper.stats.by_reason())
    return out


class EngineSet:
    """The engines of one model's pool.

    Invariant: ``engines`` and ``conductor.instances`` hold the same ids (every change goes
    through :meth:`add` and :meth:`remove`); an engine whose ``model_error`` is set stays
    out of scheduling.
    """

    def __init__(
        self,
        model: ModelConfig,
        monitor: MonitorConfig,
        conductor: Scheduler,
        metrics: PoolMetrics,
    ):
        self.model = model
        self.monitor = monitor
        self.conductor = conductor
        self.metrics = metrics
        self.engines: dict[InstanceId, EngineHandle] = {}
        self.changed: Callable[[], None] | None = None
        """Called after an engine joined, left or changed state (late binding's release)."""

    def _changed(self) -> None:
        if self.changed is not None:
            self.changed()

    def add(self, config: EngineConfig) -> EngineHandle:
        check_engine_fits(config, self.model.block_size_tokens, where="engine")
        engine_id = InstanceId(config.engine_id)
        if engine_id in self.engines or engine_id in self.conductor.instances:
            raise Conflict(f"engine {engine_id!r} already exists", param="id")
        # no KV store between engines; a known KV capacity is its prefix cache's size
        # (vLLM caches in its free KV blocks), which conductor reads for what a placement
        # there would evict
        cache = config.max_blocks * config.block_size_tokens if config.max_blocks else None
        self.conductor.add_instance(
            InstanceSpec(
                engine_id,
                config.role,
                pulls_kv=False,
                cache_capacity_tokens=cache,
                prefill_lanes=config.prefill_lanes,
                prefill_chunk_tokens=config.prefill_chunk_tokens,
            )
        )
        monitor = self.monitor
        handle = make_handle(
            config, queue_size=monitor.kv_queue_size, max_blocks=monitor.kv_max_blocks
        )
        self.engines[engine_id] = handle
        log.info("engine %s added (%s, %s)", engine_id, config.role.value, config.url)
        self._changed()
        return handle

    def get(self, engine_id: str) -> EngineHandle:
        handle = self.engines.get(InstanceId(engine_id))
        if handle is None:
            raise NotFound(f"no engine {engine_id!r}", param="id")
        return handle

    def remove(self, engine_id: str) -> int:
        """Forget the engine; returns how many in-flight requests were placed on it (they
        finish or fail on their own; their bookkeeping left with the engine)."""
        handle = self.get(engine_id)
        handle.cancel_tasks()
        del self.engines[handle.engine_id]
        lost = self.conductor.remove_instance(handle.engine_id)
        log.info("engine %s removed (%d in-flight requests on it)", engine_id, len(lost))
        self._changed()
        return len(lost)

    def set_draining(self, engine_id: str, draining: bool) -> None:
        handle = self.get(engine_id)
        self.conductor.set_draining(handle.engine_id, draining=draining)
        log.info("engine %s %s", engine_id, "draining" if draining else "resumed")
        self._changed()

    def mark_unhealthy(self, engine_id: InstanceId, reason: str) -> None:
        """Take the engine out of scheduling and its blocks out of the index (it may have
        restarted with an empty cache); the health loop brings it back."""
        handle = self.engines.get(engine_id)
        state = self.conductor.instances.get(engine_id)
        if handle is None or state is None or not state.healthy:
            return
        self.conductor.set_health(engine_id, healthy=False)
        handle.model_checked = False  # it may come back serving something else
        self.clear_blocks(handle)
        self.metrics.engine_failures.labels(engine_id, reason.split(":")[0]).inc()
        log.warning("engine %s marked unhealthy: %s", engine_id, reason)
        self._changed()

    def mark_healthy(self, handle: EngineHandle) -> None:
        """The engine answered its health probe: schedule on it again if it was out (unless
        it serves another model than its config says)."""
        if handle.model_error is not None:
            return
        if not self.conductor.instances[handle.engine_id].healthy:
            self.conductor.set_health(handle.engine_id, healthy=True)
            log.info("engine %s healthy again", handle.engine_id)
            self._changed()

    def clear_blocks(self, handle: EngineHandle) -> None:
        """Forget what the engine caches: our hash map of it and its index entries."""
        if handle.ingest is not None:
            handle.ingest.mapper.clear()
        self.conductor.on_event(AllBlocksCleared(handle.engine_id))

    def current(self, handle: EngineHandle) -> bool:
        """Whether ``handle`` is still the engine's (not removed, or replaced, meanwhile)."""
        return self.engines.get(handle.engine_id) is handle

    def snapshot(self) -> list[EngineSnapshot]:
        out: list[EngineSnapshot] = []
        for engine_id, handle in self.engines.items():
            state = self.conductor.instances.get(engine_id)
            if state is None:
                continue
            feed = handle.feed
            out.append(
                EngineSnapshot(
                    engine_id=engine_id,
                    role=handle.config.role.value,
                    healthy=state.healthy,
                    draining=state.draining,
                    queued_requests=state.prefill.queued_requests,
                    queued_prefill_tokens=state.prefill.queued_tokens,
                    running_requests=state.decode.batch_size,
                    kv_reserved_tokens=state.decode.kv_reserved_tokens,
                    reported_waiting=handle.load.waiting,
                    reported_running=handle.load.running,
                    reported_kv_usage=handle.load.kv_usage,
                    indexed_blocks=self.conductor.index.count(engine_id),
                    kv_queue_depth=handle.kv_queue_depth,
                    kv_events_dropped=0 if feed is None else feed.stats.drops,
                    kv_needs_resync=False if feed is None else feed.needs_resync,
                    kv_dropped_by_reason=kv_drops(handle),
                    kv_silent=handle.kv_silent,
                    model=self.model.name,
                    model_error=handle.model_error,
                )
            )
        return out

    def check_kv_silence(self, after_requests: int) -> None:
        """Marks (and warns once about) engines with ``kv_events`` that served
        ``after_requests`` requests without one KV event reaching us: vLLM binds its
        publisher only for ``tcp://*:port`` (an address makes it connect instead), so a
        config that looks right can leave the index empty."""
        for handle in self.engines.values():
            feed = handle.feed
            if feed is None:
                continue
            silent = handle.served >= after_requests and feed.stats.batches == 0
            if silent and not handle.kv_silent:
                log.warning(
                    "engine %s served %d requests but sent no KV event to %s: is its "
                    "publisher bound (vLLM: endpoint tcp://*:PORT) and reachable?",
                    handle.engine_id,
                    handle.served,
                    handle.config.kv_events,
                )
            handle.kv_silent = silent

    def can_serve(self) -> bool:
        prefill, decode = self.conductor.pools()
        return bool(prefill) and bool(decode)
