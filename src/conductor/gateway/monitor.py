"""The gateway's two monitor loops: engine health and engine-reported load.

Each round probes every engine at once through its kind
(:meth:`~conductor.gateway.engines.kind.EngineKind.probe_health`,
:meth:`~conductor.gateway.engines.kind.EngineKind.read_load`). A failed health probe takes the
engine out of scheduling, a passed one brings it back; the polled load is kept in the engine's
handle (``handle.load``), exported in ``/metrics`` and the admin API, and fed to the scheduler
as an ``EngineLoad`` event (its load estimate takes it in: ``conductor.core.correction``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import httpx

from conductor.core.events import EngineLoad
from conductor.gateway.config import MonitorConfig
from conductor.gateway.engines.handle import EngineHandle
from conductor.gateway.kv_pump import KvPump
from conductor.gateway.membership import EngineSet
from conductor.gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)


class Monitor:
    """Runs the health and load loops over the engines of an :class:`EngineSet`.

    Invariant: a probe's result is applied only if its engine was not removed (or replaced)
    while the probe ran.
    """

    def __init__(
        self,
        engines: EngineSet,
        kv: KvPump,
        config: MonitorConfig,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engines = engines
        self.clock = clock
        self.kv = kv
        self.config = config
        self.metrics = metrics

    async def health_loop(self, client: httpx.AsyncClient) -> None:
        while True:
            try:
                self.kv.resync_if_needed()
                handles = list(self.engines.engines.values())
                await asyncio.gather(*(self._check_one(client, h) for h in handles))
            except Exception:
                log.exception("health check round failed")
            await asyncio.sleep(self.config.health_interval_s)

    async def _check_one(self, client: httpx.AsyncClient, handle: EngineHandle) -> None:
        why = await handle.kind.probe_health(
            client, handle.config.url, self.config.health_timeout_s
        )
        if not self.engines.current(handle):
            return
        if why is None:
            self.engines.mark_healthy(handle)
        else:
            self.engines.mark_unhealthy(handle.engine_id, f"health: {why}")

    async def load_loop(self, client: httpx.AsyncClient) -> None:
        while True:
            try:
                handles = list(self.engines.engines.values())
                await asyncio.gather(*(self._poll_one(client, h) for h in handles))
            except Exception:
                log.exception("load poll round failed")
            await asyncio.sleep(self.config.load_interval_s)

    async def _poll_one(self, client: httpx.AsyncClient, handle: EngineHandle) -> None:
        try:
            load = await handle.kind.read_load(
                client, handle.config.url, self.config.health_timeout_s
            )
        except (httpx.HTTPError, ValueError) as exc:
            self.metrics.load_polls.labels(handle.engine_id, "error").inc()
            log.debug("engine %s: /metrics poll failed: %s", handle.engine_id, exc)
            return
        if not self.engines.current(handle):
            return
        handle.load = load
        report = EngineLoad(
            handle.engine_id, load.running, load.waiting, load.kv_usage, self.clock()
        )
        self.engines.conductor.on_event(report)
        self.metrics.load_polls.labels(handle.engine_id, "ok").inc()
