"""The gateway service: the scheduler in front of real engines, and its lifecycle.

:class:`Gateway` owns a :class:`~conductor.core.scheduler.Scheduler` and composes the parts
that each answer one question: which engines there are
(:class:`~conductor.gateway.membership.EngineSet`), how their KV events reach the scheduler
(:class:`~conductor.gateway.kv_pump.KvPump`), whether they are healthy and how loaded they say
they are (:class:`~conductor.gateway.monitor.Monitor`), and how one request is served
(:class:`~conductor.gateway.request_path.RequestPath`). :meth:`Gateway.running` starts the
HTTP clients for upstream calls (transport injectable) and the background tasks (per engine:
KV-event feed and pump; global: health checks, load polling) inside one
``asyncio.TaskGroup`` and cancels them when it exits. Everything runs on one event loop, so
the scheduler needs no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import httpx
import zmq.asyncio

from conductor.core.errors import InvalidInput
from conductor.core.scheduler import Scheduler
from conductor.core.types import InstanceId
from conductor.gateway.config import EngineConfig, GatewayConfig
from conductor.gateway.engines.handle import EngineHandle
from conductor.gateway.kv_pump import KvPump
from conductor.gateway.membership import EngineSet
from conductor.gateway.metrics import EngineSnapshot, GatewayMetrics
from conductor.gateway.monitor import Monitor
from conductor.gateway.openai_api import Kind, ParsedRequest
from conductor.gateway.request_path import NOT_RUNNING, RequestPath
from conductor.gateway.tokenizer import PromptTokenizer
from conductor.gateway.upstream import HttpxUpstream, Upstream
from conductor.web.client import RawHttpClient, Timeouts
from conductor.web.messages import AnyResponse

Clock = Callable[[], float]


class Gateway:
    """See the module docstring. Build it, then ``async with gateway.running(): ...``.

    Invariant: the background tasks and the upstream clients exist only inside
    :meth:`running`; engines added meanwhile get their KV-event tasks at once.
    """

    def __init__(
        self,
        config: GatewayConfig,
        conductor: Scheduler,
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
        self.metrics = GatewayMetrics()
        self.members = EngineSet(config, conductor, self.metrics)
        self.metrics.attach_state(self.members.snapshot, conductor.inflight)
        self.kv = KvPump(self.members, conductor, self.metrics, wall_clock)
        self.monitor = Monitor(self.members, self.kv, config.monitor, self.metrics, clock)
        self.requests = RequestPath(config, conductor, tokenizer, self.members, self.metrics, clock)
        self._transport = transport
        self._zmq_given = zmq_context
        self._zmq: zmq.asyncio.Context | None = None
        self._client: httpx.AsyncClient | None = None
        self._tg: asyncio.TaskGroup | None = None
        self.started_at_wall_s = wall_clock()
        for engine in config.engines:
            self.add_engine(engine)

    # -- lifecycle -----------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Gateway]:
        """Run the background tasks and the upstream clients for the duration of the block."""
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
                upstream = self._request_client(c)
                self.requests.upstream = upstream
                self._tg = tg
                for handle in self.members.engines.values():
                    self.kv.start(handle, tg, self._zmq)
                loops = [
                    tg.create_task(self.monitor.health_loop(c), name="health"),
                    tg.create_task(self.monitor.load_loop(c), name="load"),
                ]
                try:
                    yield self
                finally:
                    self._tg = None
                    for handle in self.members.engines.values():
                        handle.cancel_tasks()
                    for task in loops:
                        task.cancel()
                    await upstream.aclose()
        finally:
            self._client = None
            self.requests.upstream = None
            if self._zmq_given is None:
                self._zmq.destroy(linger=0)
            self._zmq = None

    def _request_client(self, client: httpx.AsyncClient) -> Upstream:
        """The request path's client: httpx when a transport is injected (tests), else the
        lean keep-alive client (httpx costs milliseconds of CPU per stream)."""
        if self._transport is not None:
            return HttpxUpstream(client)
        up = self.config.upstream
        return RawHttpClient(
            Timeouts(
                connect_s=up.connect_timeout_s,
                read_s=up.read_timeout_s,
                pool_s=up.connect_timeout_s,
            )
        )

    @property
    def client(self) -> httpx.AsyncClient:
        """The httpx client of the monitor loops (and of the request path in tests)."""
        if self._client is None:
            raise RuntimeError(NOT_RUNNING)
        return self._client

    @property
    def upstream(self) -> Upstream:
        """The request path's client."""
        return self.requests.client

    # -- membership ----------------------------------------------------------------------
    @property
    def engines(self) -> dict[InstanceId, EngineHandle]:
        return self.members.engines

    def add_engine(self, config: EngineConfig) -> EngineHandle:
        handle = self.members.add(config)
        if self._tg is not None and self._zmq is not None:
            self.kv.start(handle, self._tg, self._zmq)
        return handle

    def handle(self, engine_id: str) -> EngineHandle:
        return self.members.get(engine_id)

    def remove_engine(self, engine_id: str) -> int:
        """Forget the engine; returns how many in-flight requests were placed on it."""
        return self.members.remove(engine_id)

    def set_draining(self, engine_id: str, draining: bool) -> None:
        self.members.set_draining(engine_id, draining)

    def mark_unhealthy(self, engine_id: InstanceId, reason: str) -> None:
        self.members.mark_unhealthy(engine_id, reason)

    def snapshot(self) -> list[EngineSnapshot]:
        return self.members.snapshot()

    def can_serve(self) -> bool:
        return self.members.can_serve()

    # -- request path --------------------------------------------------------------------
    async def tokenize(self, req: ParsedRequest) -> list[int]:
        return await self.requests.tokenize(req)

    def output_budget(self, req: ParsedRequest, prompt_tokens: int) -> int | None:
        return self.requests.output_budget(req, prompt_tokens)

    async def generate(self, kind: Kind, raw_body: bytes) -> AnyResponse:
        """One OpenAI request, start to finish; raises ``GatewayError`` for the client."""
        return await self.requests.generate(kind, raw_body)
