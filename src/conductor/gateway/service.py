"""The gateway service: the schedulers in front of real engines, and its lifecycle.

:class:`Gateway` serves one or several models, each by its own
:class:`~conductor.gateway.pool.ModelPool` (a :class:`~conductor.core.scheduler.Scheduler`,
a tokenizer, engines); a request goes to the pool its ``model`` names. Each pool composes
the parts that each answer one question: which engines there are
(:class:`~conductor.gateway.membership.EngineSet`), how their KV events reach the scheduler
(:class:`~conductor.gateway.kv_pump.KvPump`), whether they are healthy and how loaded they say
they are (:class:`~conductor.gateway.monitor.Monitor`), and how one request is served
(:class:`~conductor.gateway.request_path.RequestPath`). :meth:`Gateway.running` starts the
HTTP clients for upstream calls (transport injectable) and the background tasks (per engine:
KV-event feed and pump; per pool: health checks, load polling) inside one
``asyncio.TaskGroup`` and cancels them when it exits. Everything runs on one event loop, so
the scheduler needs no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

import httpx
import zmq.asyncio

from conductor.core.errors import InvalidInput
from conductor.core.scheduler import Scheduler
from conductor.core.types import InstanceId
from conductor.gateway.config import EngineConfig, GatewayConfig
from conductor.gateway.engines.handle import EngineHandle
from conductor.gateway.errors import Conflict, NotFound
from conductor.gateway.kv_pump import KvPump
from conductor.gateway.membership import EngineSet
from conductor.gateway.metrics import GatewayMetrics
from conductor.gateway.metrics_state import EngineSnapshot
from conductor.gateway.monitor import Monitor
from conductor.gateway.openai_api import Kind, ParsedRequest, parse_json, parse_request
from conductor.gateway.pool import ModelPool, Pools
from conductor.gateway.request_path import NOT_RUNNING, RequestPath
from conductor.gateway.tokenizer import PromptTokenizer
from conductor.gateway.upstream import HttpxUpstream, Upstream
from conductor.web.client import RawHttpClient, Timeouts
from conductor.web.messages import AnyResponse

Clock = Callable[[], float]


@dataclass(slots=True)
class Routed:
    """What the gateway learnt of a request's model: its pool's name ("" until found)."""

    model: str = ""


class Gateway:
    """See the module docstring. Build it, then ``async with gateway.running(): ...``.

    One model (``config.models`` empty): ``Gateway(config, conductor, tokenizer)``. Several:
    ``Gateway(config, pools={name: (scheduler, tokenizer), ...})``, one per model of
    ``config.models``. ``conductor``, ``tokenizer``, ``members``, ``kv``, ``monitor`` and
    ``requests`` are the first model's.

    Invariant: the background tasks and the upstream clients exist only inside
    :meth:`running`; engines added meanwhile get their KV-event tasks at once; an engine
    id is in at most one pool.
    """

    def __init__(
        self,
        config: GatewayConfig,
        conductor: Scheduler | None = None,
        tokenizer: PromptTokenizer | None = None,
        *,
        pools: Mapping[str, tuple[Scheduler, PromptTokenizer]] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        zmq_context: zmq.asyncio.Context | None = None,
    ) -> None:
        parts = _pool_parts(config, conductor, tokenizer, pools)
        self.config = config
        self.clock = clock
        self.wall_clock = wall_clock
        self.metrics = GatewayMetrics(labelled=config.several_models)
        self.pools = Pools(
            [
                ModelPool(
                    config, model, *parts[model.name], self.metrics, clock=clock,
                    wall_clock=wall_clock,
                )
                for model in config.pool_models()
            ],
            name_known=config.several_models,
        )  # fmt: skip
        self.metrics.attach_state(
            self.snapshot, lambda: [(p.name, p.conductor.inflight()) for p in self.pools]
        )
        first = self.pools.first
        self.conductor: Scheduler = first.conductor
        self.tokenizer: PromptTokenizer = first.tokenizer
        self.members: EngineSet = first.members
        self.kv: KvPump = first.kv
        self.monitor: Monitor = first.monitor
        self.requests: RequestPath = first.requests
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
                self._tg = tg
                loops = []
                for pool in self.pools:
                    pool.requests.upstream = upstream
                    for handle in pool.members.engines.values():
                        pool.kv.start(handle, tg, self._zmq)
                    suffix = f"-{pool.name}" if self.config.several_models else ""
                    loops += [
                        tg.create_task(pool.monitor.health_loop(c), name=f"health{suffix}"),
                        tg.create_task(pool.monitor.load_loop(c), name=f"load{suffix}"),
                    ]
                try:
                    yield self
                finally:
                    self._tg = None
                    for handle in self.engines.values():
                        handle.cancel_tasks()
                    for task in loops:
                        task.cancel()
                    await upstream.aclose()
        finally:
            self._client = None
            for pool in self.pools:
                pool.requests.upstream = None
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
        """Every pool's engines (a new dict)."""
        return self.pools.engines()

    def pool_for(self, engine: EngineConfig) -> ModelPool:
        """The pool ``engine`` joins (its ``model``; the only one with one model)."""
        return self.pools.get(self.config.model_of(engine).name)

    def add_engine(self, config: EngineConfig) -> EngineHandle:
        pool = self.pool_for(config)
        if self.pools.of_engine(config.engine_id) is not None:
            raise Conflict(f"engine {config.engine_id!r} already exists", param="id")
        handle = pool.members.add(config)
        if self._tg is not None and self._zmq is not None:
            pool.kv.start(handle, self._tg, self._zmq)
        return handle

    def _pool_of(self, engine_id: str) -> ModelPool:
        pool = self.pools.of_engine(engine_id)
        if pool is None:
            raise NotFound(f"no engine {engine_id!r}", param="id")
        return pool

    def handle(self, engine_id: str) -> EngineHandle:
        return self._pool_of(engine_id).members.get(engine_id)

    def remove_engine(self, engine_id: str) -> int:
        """Forget the engine; returns how many in-flight requests were placed on it."""
        return self._pool_of(engine_id).members.remove(engine_id)

    def set_draining(self, engine_id: str, draining: bool) -> None:
        self._pool_of(engine_id).members.set_draining(engine_id, draining)

    def mark_unhealthy(self, engine_id: InstanceId, reason: str) -> None:
        pool = self.pools.of_engine(engine_id)
        if pool is not None:
            pool.members.mark_unhealthy(engine_id, reason)

    def snapshot(self) -> list[EngineSnapshot]:
        return [snap for pool in self.pools for snap in pool.members.snapshot()]

    def can_serve(self) -> bool:
        """Whether some model can be served now."""
        return any(pool.can_serve() for pool in self.pools)

    # -- request path --------------------------------------------------------------------
    async def tokenize(self, req: ParsedRequest) -> list[int]:
        return await self.pools.get(req.model).requests.tokenize(req)

    def output_budget(self, req: ParsedRequest, prompt_tokens: int) -> int | None:
        return self.pools.get(req.model).requests.output_budget(req, prompt_tokens)

    async def generate(
        self, kind: Kind, raw_body: bytes, routed: Routed | None = None
    ) -> AnyResponse:
        """One OpenAI request, start to finish, served by the pool its ``model`` names
        (``routed.model`` is set once found); raises ``GatewayError`` for the client."""
        limits = self.config.requests
        req = parse_request(kind, parse_json(raw_body, max_depth=limits.max_json_depth), limits)
        pool = self.pools.get(req.model)
        if routed is not None:
            routed.model = pool.name
        return await pool.requests.serve(req, len(raw_body))


def _pool_parts(
    config: GatewayConfig,
    conductor: Scheduler | None,
    tokenizer: PromptTokenizer | None,
    pools: Mapping[str, tuple[Scheduler, PromptTokenizer]] | None,
) -> Mapping[str, tuple[Scheduler, PromptTokenizer]]:
    """Each model's scheduler and tokenizer, checked against ``config``'s models."""
    if pools is None:
        if conductor is None or tokenizer is None:
            raise InvalidInput("pools", None, "give a scheduler and a tokenizer, or pools")
        if config.several_models and len(config.models) > 1:
            raise InvalidInput("pools", None, "several models need a scheduler each (pools=)")
        if conductor.config.block_size_tokens != config.block_size_tokens:
            raise InvalidInput(
                "block_size",
                conductor.config.block_size_tokens,
                f"scheduler and gateway disagree ({config.block_size_tokens})",
            )
        return {config.model_name: (conductor, tokenizer)}
    if conductor is not None or tokenizer is not None:
        raise InvalidInput("pools", sorted(pools), "give pools or a scheduler, not both")
    names = [m.name for m in config.pool_models()]
    if sorted(pools) != sorted(names):
        raise InvalidInput("pools", sorted(pools), f"must be one per model: {names}")
    return pools
