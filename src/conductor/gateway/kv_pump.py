"""Per engine, two tasks carry KV events into the scheduler: the feed and the pump.

The feed (:class:`~conductor.gateway.kv_feed.KvFeed`, from the engine's kind) fills the
engine's bounded queue; :class:`KvPump` restarts it after a failure, moves the queued core
events into the scheduler in order, and resyncs an engine whose events were lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import zmq.asyncio

from conductor.core.errors import UnknownInstance
from conductor.core.events import BlocksRemoved, BlocksStored, KvEvent
from conductor.core.scheduler import Scheduler
from conductor.gateway.engines.handle import EngineHandle, attach_feed
from conductor.gateway.membership import EngineSet
from conductor.gateway.metrics import PoolMetrics

log = logging.getLogger(__name__)


class KvPump:
    """Starts and runs the KV-event tasks of each engine (see the module docstring).

    Invariant: an engine's events reach the scheduler in the order its feed queued them;
    events of a removed engine are dropped.
    """

    def __init__(
        self,
        engines: EngineSet,
        conductor: Scheduler,
        metrics: PoolMetrics,
        wall_clock: Callable[[], float],
    ) -> None:
        self.engines = engines
        self.conductor = conductor
        self.metrics = metrics
        self.wall_clock = wall_clock

    def start(
        self, handle: EngineHandle, tg: asyncio.TaskGroup, zmq_context: zmq.asyncio.Context
    ) -> None:
        """Attach the engine's feed and run it and its pump in ``tg`` (no-op without events)."""
        attach_feed(handle, zmq_context)
        if handle.feed is None:
            return
        name = handle.engine_id
        handle.tasks = [
            tg.create_task(self._subscribe(handle), name=f"kv-sub-{name}"),
            tg.create_task(self._pump(handle), name=f"kv-pump-{name}"),
        ]

    async def _subscribe(self, handle: EngineHandle) -> None:
        assert handle.feed is not None
        backoff_s = 0.5
        while True:
            try:
                await handle.feed.run()
            except Exception as exc:  # a socket error must not end the subscription for good
                log.warning("engine %s: KV subscriber failed: %s", handle.engine_id, exc)
                self.metrics.kv_resyncs.labels(handle.engine_id, "subscriber_error").inc()
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 10.0)

    async def _pump(self, handle: EngineHandle) -> None:
        """Move the engine's queued core events into the scheduler, in order."""
        assert handle.queue is not None and handle.feed is not None
        queue, feed = handle.queue, handle.feed
        while True:
            event = await queue.get()
            while True:  # this one, then whatever else is queued, without waiting again
                if feed.needs_resync:
                    self._resync(handle)
                self._apply(handle, event)
                try:
                    event = queue.get_nowait()
                except asyncio.QueueEmpty:
                    break

    def resync_if_needed(self) -> None:
        """Resyncs engines marked while no event came to trigger it in :meth:`_pump`."""
        for handle in list(self.engines.engines.values()):
            feed = handle.feed
            if feed is not None and feed.needs_resync:
                self._resync(handle)

    def _resync(self, handle: EngineHandle) -> None:
        """Events were lost (queue overflow, sequence gap without replay, undecodable batch):
        the engine's index entries may hold blocks it has since evicted, so they are cleared
        with the hash map; the index refills from the events that follow (vLLM has no
        snapshot API). Events already queued are still true stores and are kept."""
        assert handle.feed is not None
        with contextlib.suppress(UnknownInstance):
            self.engines.clear_blocks(handle)
        handle.feed.resynced()
        self.metrics.kv_resyncs.labels(handle.engine_id, "lost_events").inc()
        log.warning("engine %s: KV events lost; its index entries were cleared", handle.engine_id)

    def _apply(self, handle: EngineHandle, event: KvEvent) -> None:
        engine_id = handle.engine_id
        if not self.engines.current(handle):
            return  # removed meanwhile
        kind = (
            "stored"
            if isinstance(event, BlocksStored)
            else "removed"
            if isinstance(event, BlocksRemoved)
            else "cleared"
        )
        try:
            self.conductor.on_event(event)
        except UnknownInstance:
            return
        self.metrics.child(self.metrics.kv_events, engine_id, kind).inc()
        seq = getattr(event, "seq", None)
        published = None if handle.ingest is None else handle.ingest.published_at(seq)
        if published is not None:
            self.metrics.kv_lag.labels(engine_id).observe(max(0.0, self.wall_clock() - published))
