"""The gateway's two monitor loops: engine health and engine-reported load.

Each round probes every engine at once through its kind
(:meth:`~conductor.gateway.engines.kind.EngineKind.probe_health`,
:meth:`~conductor.gateway.engines.kind.EngineKind.read_load`). A failed health probe takes the
engine out of scheduling (a timed-out one only after ``health_timeouts_to_unhealthy`` in
a row: slow is not dead), a passed one brings it back; the polled load is kept in the engine's
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
from conductor.gateway.metrics import PoolMetrics
from conductor.gateway.model_check import mismatch, served_models

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
        metrics: PoolMetrics,
        clock: Callable[[], float] = time.monotonic,
        *,
        check_all_models: bool = False,
    ) -> None:
        self.check_all_models = check_all_models
        """Check every engine's ``/v1/models`` (several models), not only those whose
        config names a model."""
        self.engines = engines
        self.clock = clock
        self.kv = kv
        self.config = config
        self.metrics = metrics

    async def health_loop(self, client: httpx.AsyncClient) -> None:
        while True:
            try:
                self.kv.resync_if_needed()
                self.engines.check_kv_silence(self.config.kv_silent_after_requests)
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
            handle.probe_timeouts = 0
            if not handle.model_checked and (self.check_all_models or handle.config.model):
                await self._check_model(client, handle)
                if not self.engines.current(handle):
                    return
            self.engines.mark_healthy(handle)
            return
        if why == "timeout":  # a busy engine answers slowly: only a run of them counts
            handle.probe_timeouts += 1
            if handle.probe_timeouts < self.config.health_timeouts_to_unhealthy:
                return
        self.engines.mark_unhealthy(handle.engine_id, f"health: {why}")

    async def _check_model(self, client: httpx.AsyncClient, handle: EngineHandle) -> None:
        """Read the engine's ``/v1/models``: one serving another model than its config says
        is kept out (``model_error``), until a later round finds it right."""
        served = await served_models(client, handle.config.url, self.config.health_timeout_s)
        if not self.engines.current(handle):
            return
        handle.model_checked = True
        if served is None:  # it cannot tell: take it at its config's word
            return
        expected = handle.upstream_model or self.engines.model.upstream_name
        why = mismatch(expected, served)
        if why is None:
            if handle.model_error is not None:
                log.info("engine %s serves %r again", handle.engine_id, expected)
            handle.model_error = None
            return
        if handle.model_error != why:
            log.warning("engine %s kept out: %s", handle.engine_id, why)
        handle.model_error = why
        self.engines.mark_unhealthy(handle.engine_id, f"model: {why}")
        handle.model_checked = False  # checked again next round

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
