"""The gateway service: the scheduler in front of real engines.

:class:`Gateway` owns a :class:`~conductor.core.conductor.Conductor`, one
:class:`~conductor.gateway.engines.EngineHandle` per engine, an HTTP client for upstream
calls (transport injectable) and the background tasks (per engine: KV-event subscriber and
pump; global: health checks, load polling), all started by :meth:`Gateway.running` inside one
``asyncio.TaskGroup`` and cancelled when it exits. Everything runs on one event loop, so the
scheduler needs no lock.

The request path (:meth:`Gateway.generate`) lives in :mod:`conductor.gateway.request_path`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable

import httpx
import zmq.asyncio

from conductor.core.conductor import Conductor
from conductor.core.errors import InvalidInput, UnknownInstance
from conductor.core.events import AllBlocksCleared, BlocksRemoved, BlocksStored, KvEvent
from conductor.core.state import InstanceSpec
from conductor.core.types import InstanceId
from conductor.gateway.config import EngineConfig, GatewayConfig, check_engine_fits
from conductor.gateway.engines import EngineHandle, attach_subscriber, make_handle
from conductor.gateway.errors import Conflict, NotFound
from conductor.gateway.metrics import EngineSnapshot, GatewayMetrics
from conductor.gateway.monitor import check_health, poll_load
from conductor.gateway.request_path import RequestPath
from conductor.gateway.tokenizer import PromptTokenizer

log = logging.getLogger(__name__)

NO_FETCH_BYTES_PER_S = 1e-3
"""Engines cannot pull each other's KV blocks through the gateway (no shared store): a
fetch is priced out by a vanishing cross-engine bandwidth, so plans reuse local caches only."""
Clock = Callable[[], float]


class Gateway(RequestPath):
    """See the module docstring. Build it, then ``async with gateway.running(): ...``."""

    def __init__(
        self,
        config: GatewayConfig,
        conductor: Conductor,
        tokenizer: PromptTokenizer,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        zmq_context: zmq.asyncio.Context | None = None,
    ) -> None:
        if conductor.config.block_size_tokens != config.block_size_tokens:
            raise InvalidInput(
                "block_size",
                conductor.config.block_size_tokens,
                f"scheduler and gateway disagree ({config.block_size_tokens})",
            )
        self.config = config
        self.conductor = conductor
        self.tokenizer = tokenizer
        self.clock = clock
        self.wall_clock = wall_clock
        self.engines: dict[InstanceId, EngineHandle] = {}
        self.metrics = GatewayMetrics()
        self.metrics.attach_state(self.snapshot, conductor.inflight)
        self._transport = transport
        self._zmq_given = zmq_context
        self._zmq: zmq.asyncio.Context | None = None
        self._client: httpx.AsyncClient | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._loops: list[asyncio.Task[None]] = []
        self._rid_prefix = secrets.token_hex(4)
        self._rid_counter = itertools.count(1)
        self.started_at_wall_s = wall_clock()
        for engine in config.engines:
            self.add_engine(engine)

    # -- lifecycle -----------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Gateway]:
        """Run the background tasks and the upstream client for the duration of the block."""
        up = self.config.upstream
        timeout = httpx.Timeout(
            connect=up.connect_timeout_s,
            read=up.read_timeout_s,
            write=up.read_timeout_s,
            pool=up.connect_timeout_s,
        )
        limits = httpx.Limits(max_connections=2048, max_keepalive_connections=256)
        self._zmq = self._zmq_given if self._zmq_given is not None else zmq.asyncio.Context()
        try:
            async with (
                httpx.AsyncClient(transport=self._transport, timeout=timeout, limits=limits) as c,
                asyncio.TaskGroup() as tg,
            ):
                self._client = c
                self._tg = tg
                for handle in self.engines.values():
                    self._start_engine(handle)
                self._loops = [
                    tg.create_task(self._health_loop(), name="health"),
                    tg.create_task(self._load_loop(), name="load"),
                ]
                try:
                    yield self
                finally:
                    self._tg = None
                    for handle in self.engines.values():
                        handle.cancel_tasks()
                    for task in self._loops:
                        task.cancel()
                    self._loops = []
        finally:
            self._client = None
            if self._zmq_given is None:
                self._zmq.destroy(linger=0)
            self._zmq = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("the gateway is not running (use `async with gateway.running()`)")
        return self._client

    def _start_engine(self, handle: EngineHandle) -> None:
        if self._tg is None or self._zmq is None:
            return
        attach_subscriber(handle, self._zmq)
        if handle.subscriber is None:
            return
        name = handle.engine_id
        handle.tasks = [
            self._tg.create_task(self._subscribe(handle), name=f"kv-sub-{name}"),
            self._tg.create_task(self._pump(handle), name=f"kv-pump-{name}"),
        ]

    # -- membership ----------------------------------------------------------------------
    def add_engine(self, config: EngineConfig) -> EngineHandle:
        check_engine_fits(config, self.config.block_size_tokens, where="engine")
        engine_id = InstanceId(config.engine_id)
        if engine_id in self.engines or engine_id in self.conductor.instances:
            raise Conflict(f"engine {engine_id!r} already exists", param="id")
        self.conductor.add_instance(
            InstanceSpec(engine_id, config.role, nic_bytes_per_s=NO_FETCH_BYTES_PER_S)
        )
        handle = make_handle(config, queue_size=self.config.monitor.kv_queue_size)
        self.engines[engine_id] = handle
        self._start_engine(handle)
        log.info("engine %s added (%s, %s)", engine_id, config.role.value, config.url)
        return handle

    def handle(self, engine_id: str) -> EngineHandle:
        handle = self.engines.get(InstanceId(engine_id))
        if handle is None:
            raise NotFound(f"no engine {engine_id!r}", param="id")
        return handle

    def remove_engine(self, engine_id: str) -> int:
        """Forget the engine; returns how many in-flight requests were placed on it (they
        finish or fail on their own; their bookkeeping left with the engine)."""
        handle = self.handle(engine_id)
        handle.cancel_tasks()
        del self.engines[handle.engine_id]
        lost = self.conductor.remove_instance(handle.engine_id)
        log.info("engine %s removed (%d in-flight requests on it)", engine_id, len(lost))
        return len(lost)

    def set_draining(self, engine_id: str, draining: bool) -> None:
        handle = self.handle(engine_id)
        self.conductor.set_draining(handle.engine_id, draining=draining)
        log.info("engine %s %s", engine_id, "draining" if draining else "resumed")

    def mark_unhealthy(self, engine_id: InstanceId, reason: str) -> None:
        """Take the engine out of scheduling and its blocks out of the index (it may have
        restarted with an empty cache); the health loop brings it back."""
        handle = self.engines.get(engine_id)
        state = self.conductor.instances.get(engine_id)
        if handle is None or state is None or not state.healthy:
            return
        self.conductor.set_health(engine_id, healthy=False)
        self._clear_blocks(handle)
        self.metrics.engine_failures.labels(engine_id, reason.split(":")[0]).inc()
        log.warning("engine %s marked unhealthy: %s", engine_id, reason)

    def _clear_blocks(self, handle: EngineHandle) -> None:
        if handle.ingest is not None:
            handle.ingest.mapper.clear()
        self.conductor.on_event(AllBlocksCleared(handle.engine_id))

    def snapshot(self) -> list[EngineSnapshot]:
        out: list[EngineSnapshot] = []
        for engine_id, handle in self.engines.items():
            state = self.conductor.instances.get(engine_id)
            if state is None:
                continue
            sub = handle.subscriber
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
                    reported_waiting=state.reported_waiting,
                    reported_running=state.reported_running,
                    reported_kv_usage=state.reported_kv_usage,
                    indexed_blocks=self.conductor.index.count(engine_id),
                    kv_queue_depth=handle.kv_queue_depth,
                    kv_events_dropped=0 if sub is None else sub.stats.drops,
                    kv_needs_resync=False if sub is None else sub.needs_resync,
                )
            )
        return out

    def can_serve(self) -> bool:
        prefill, decode = self.conductor.pools()
        return bool(prefill) and bool(decode)

    # -- KV events -----------------------------------------------------------------------
    async def _subscribe(self, handle: EngineHandle) -> None:
        assert handle.subscriber is not None
        backoff_s = 0.5
        while True:
            try:
                await handle.subscriber.run()
            except Exception as exc:  # a socket error must not end the subscription for good
                log.warning("engine %s: KV subscriber failed: %s", handle.engine_id, exc)
                self.metrics.kv_resyncs.labels(handle.engine_id, "subscriber_error").inc()
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 10.0)

    async def _pump(self, handle: EngineHandle) -> None:
        """Move the engine's queued core events into the scheduler, in order."""
        assert handle.queue is not None and handle.subscriber is not None
        queue, sub = handle.queue, handle.subscriber
        while True:
            event: KvEvent | None = None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    event = await queue.get()
            if sub.needs_resync:
                self._resync(handle)
            if event is not None:
                self._apply_kv(handle, event)

    def _resync(self, handle: EngineHandle) -> None:
        """Events were lost (queue overflow, sequence gap without replay, undecodable batch):
        the engine's index entries may hold blocks it has since evicted, so they are cleared
        with the hash map; the index refills from the events that follow (vLLM has no
        snapshot API). Events already queued are still true stores and are kept."""
        assert handle.subscriber is not None
        with contextlib.suppress(UnknownInstance):
            self._clear_blocks(handle)
        handle.subscriber.resynced()
        self.metrics.kv_resyncs.labels(handle.engine_id, "lost_events").inc()
        log.warning("engine %s: KV events lost; its index entries were cleared", handle.engine_id)

    def _apply_kv(self, handle: EngineHandle, event: KvEvent) -> None:
        engine_id = handle.engine_id
        if self.engines.get(engine_id) is not handle:
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
        self.metrics.kv_events.labels(engine_id, kind).inc()
        seq = getattr(event, "seq", None)
        published = None if handle.ingest is None else handle.ingest.published_at(seq)
        if published is not None:
            self.metrics.kv_lag.labels(engine_id).observe(max(0.0, self.wall_clock() - published))

    # -- health and load -----------------------------------------------------------------
    async def _health_loop(self) -> None:
        interval = self.config.monitor.health_interval_s
        while True:
            try:
                handles = list(self.engines.values())
                await asyncio.gather(*(self._check_one(h) for h in handles))
            except Exception:
                log.exception("health check round failed")
            await asyncio.sleep(interval)

    async def _check_one(self, handle: EngineHandle) -> None:
        why = await check_health(
            self.client, handle.config.url, self.config.monitor.health_timeout_s
        )
        if self.engines.get(handle.engine_id) is not handle:
            return
        state = self.conductor.instances[handle.engine_id]
        if why is None:
            handle.health_failures = 0
            if not state.healthy:
                self.conductor.set_health(handle.engine_id, healthy=True)
                log.info("engine %s healthy again", handle.engine_id)
        else:
            handle.health_failures += 1
            self.mark_unhealthy(handle.engine_id, f"health: {why}")

    async def _load_loop(self) -> None:
        interval = self.config.monitor.load_interval_s
        while True:
            try:
                handles = list(self.engines.values())
                await asyncio.gather(*(self._poll_one(h) for h in handles))
            except Exception:
                log.exception("load poll round failed")
            await asyncio.sleep(interval)

    async def _poll_one(self, handle: EngineHandle) -> None:
        try:
            load = await poll_load(
                self.client, handle.config.url, self.config.monitor.health_timeout_s
            )
        except (httpx.HTTPError, ValueError) as exc:
            self.metrics.load_polls.labels(handle.engine_id, "error").inc()
            log.debug("engine %s: /metrics poll failed: %s", handle.engine_id, exc)
            return
        state = self.conductor.instances.get(handle.engine_id)
        if state is None or self.engines.get(handle.engine_id) is not handle:
            return
        state.reported_running = load.running
        state.reported_waiting = load.waiting
        state.reported_kv_usage = load.kv_usage
        self.metrics.load_polls.labels(handle.engine_id, "ok").inc()
