"""The gateway service: the scheduler in front of real engines.

:class:`Gateway` owns a :class:`~conductor.core.scheduler.Scheduler`, one
:class:`~conductor.gateway.engines.EngineHandle` per engine, an HTTP client for upstream
calls (transport injectable) and the background tasks (per engine: KV-event subscriber and
pump; global: health checks, load polling), all started by :meth:`Gateway.running` inside one
``asyncio.TaskGroup`` and cancelled when it exits. Everything runs on one event loop, so the
scheduler needs no lock.

Request path (:meth:`Gateway.generate`): parse, tokenize, hash the prompt's full blocks,
``schedule()``; a rejection becomes 429 (or 503 when no engine can serve); a plan runs in
aggregated mode (one engine) or disaggregated mode (prefill leg with ``max_tokens: 1``, then
the real request to the decode engine). An attempt that an engine did not start is scheduled
again, up to ``max_attempts``; the failed engine is marked unhealthy meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Callable

import httpx
import zmq.asyncio

from conductor.core.errors import InvalidInput, UnknownInstance
from conductor.core.events import AllBlocksCleared, BlocksRemoved, BlocksStored, KvEvent
from conductor.core.plan import Plan, Rejection
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceSpec
from conductor.core.types import InstanceId, Request, RequestId, Role
from conductor.gateway.config import EngineConfig, GatewayConfig, check_engine_fits
from conductor.gateway.engines import EngineHandle, attach_subscriber, make_handle
from conductor.gateway.errors import (
    BadRequest,
    Conflict,
    GatewayError,
    NoEngine,
    NotFound,
    Overloaded,
    UpstreamTimeout,
)
from conductor.gateway.flight import Flight, Mode, Outcome
from conductor.gateway.metrics import EngineSnapshot, GatewayMetrics
from conductor.gateway.monitor import check_health, poll_load
from conductor.gateway.openai_api import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    Kind,
    ParsedRequest,
    parse_json,
    parse_request,
)
from conductor.gateway.proxy import (
    NotStarted,
    kv_params_of,
    open_upstream,
    passthrough,
    prefill_body,
    read_body,
    tracked_stream,
    upstream_body,
)
from conductor.gateway.tokenizer import PromptTokenizer, prompt_token_ids, request_block_hashes
from conductor.gateway.upstream import HttpxUpstream, RawHttpClient, Timeouts, Upstream
from conductor.web.messages import AnyResponse, Response

log = logging.getLogger(__name__)

NO_FETCH_BYTES_PER_S = 1e-3
"""Engines cannot pull each other's KV blocks through the gateway (no shared store): a
fetch is priced out by a vanishing cross-engine bandwidth, so plans reuse local caches only."""
TOKENIZE_INLINE_CHARS = 4096
"""Longer prompts are tokenized in a worker thread, off the event loop."""
PATHS: dict[Kind, str] = {"completion": "/v1/completions", "chat": "/v1/chat/completions"}
Clock = Callable[[], float]


class Gateway:
    """See the module docstring. Build it, then ``async with gateway.running(): ...``."""

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
        self.engines: dict[InstanceId, EngineHandle] = {}
        self.metrics = GatewayMetrics()
        self.metrics.attach_state(self.snapshot, conductor.inflight)
        self._transport = transport
        self._zmq_given = zmq_context
        self._zmq: zmq.asyncio.Context | None = None
        self._client: httpx.AsyncClient | None = None
        self._upstream: Upstream | None = None
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
                # the request path: httpx when a transport is injected (tests), else the
                # lean keep-alive client (httpx costs milliseconds of CPU per stream)
                self._upstream = (
                    HttpxUpstream(c)
                    if self._transport is not None
                    else RawHttpClient(
                        Timeouts(
                            connect_s=up.connect_timeout_s,
                            read_s=up.read_timeout_s,
                            pool_s=up.connect_timeout_s,
                        )
                    )
                )
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
                    await self._upstream.aclose()
        finally:
            self._client = None
            self._upstream = None
            if self._zmq_given is None:
                self._zmq.destroy(linger=0)
            self._zmq = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("the gateway is not running (use `async with gateway.running()`)")
        return self._client

    @property
    def upstream(self) -> Upstream:
        if self._upstream is None:
            raise RuntimeError("the gateway is not running (use `async with gateway.running()`)")
        return self._upstream

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
            event = await queue.get()
            while True:  # this one, then whatever else is queued, without waiting again
                if sub.needs_resync:
                    self._resync(handle)
                self._apply_kv(handle, event)
                try:
                    event = queue.get_nowait()
                except asyncio.QueueEmpty:
                    break

    def _resync_if_needed(self) -> None:
        """Resyncs engines marked while no event came to trigger it in :meth:`_pump`."""
        for handle in list(self.engines.values()):
            sub = handle.subscriber
            if sub is not None and sub.needs_resync:
                self._resync(handle)

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
        self.metrics.child(self.metrics.kv_events, engine_id, kind).inc()
        seq = getattr(event, "seq", None)
        published = None if handle.ingest is None else handle.ingest.published_at(seq)
        if published is not None:
            self.metrics.kv_lag.labels(engine_id).observe(max(0.0, self.wall_clock() - published))

    # -- health and load -----------------------------------------------------------------
    async def _health_loop(self) -> None:
        interval = self.config.monitor.health_interval_s
        while True:
            try:
                self._resync_if_needed()
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

    # -- request path --------------------------------------------------------------------
    def _next_request_id(self) -> str:
        return f"gw-{self._rid_prefix}-{next(self._rid_counter)}"

    async def tokenize(self, req: ParsedRequest) -> list[int]:
        size = len(req.prompt_text or "") + sum(len(str(m.get("content"))) for m in req.messages)
        if size <= TOKENIZE_INLINE_CHARS:
            return prompt_token_ids(self.tokenizer, req)
        return await asyncio.to_thread(prompt_token_ids, self.tokenizer, req)

    def output_budget(self, req: ParsedRequest, prompt_tokens: int) -> int:
        """Checks lengths against ``max_model_len`` (vLLM's rules) and returns the output
        tokens to reserve: ``max_tokens`` (default: 16 for completions, the rest of the
        context for chat) times ``n``."""
        limit = self.config.max_model_len
        param = "prompt" if req.kind == "completion" else "messages"
        if prompt_tokens == 0:
            raise BadRequest("the prompt has no tokens", param=param)
        if prompt_tokens >= limit:
            raise BadRequest(
                f"This model's maximum context length is {limit} tokens. However, your "
                f"request has {prompt_tokens} input tokens. Please reduce the length of the "
                "input.",
                param=param,
            )
        room = limit - prompt_tokens
        if req.max_tokens is not None and req.max_tokens > room:
            raise BadRequest(
                f"'max_tokens' is too large: {req.max_tokens}. This model's maximum context "
                f"length is {limit} tokens and your request has {prompt_tokens} input tokens "
                f"({req.max_tokens} > {limit} - {prompt_tokens}).",
                param="max_tokens",
            )
        per_choice = req.max_tokens
        if per_choice is None:
            per_choice = COMPLETION_DEFAULT_MAX_TOKENS if req.kind == "completion" else room
        return min(per_choice, room) * req.n

    async def generate(self, kind: Kind, raw_body: bytes) -> AnyResponse:
        """One OpenAI request, start to finish; raises :class:`GatewayError` for the client."""
        req = parse_request(kind, parse_json(raw_body))
        if req.model != self.config.model_name:
            raise NotFound(f"The model `{req.model}` does not exist.", param="model")
        token_ids = await self.tokenize(req)
        output_tokens = self.output_budget(req, len(token_ids))
        hashes = tuple(
            request_block_hashes(token_ids, self.config.block_size_tokens, req.cache_salt)
        )
        base_id = self._next_request_id()
        deadline = asyncio.get_running_loop().time() + self.config.upstream.request_timeout_s
        attempts = self.config.upstream.max_attempts
        failures: list[str] = []
        for attempt in range(attempts):
            rid = RequestId(base_id if attempt == 0 else f"{base_id}-retry{attempt}")
            now = self.clock()
            request = Request(rid, len(token_ids), hashes, output_tokens, arrival_s=now)
            try:
                plan = self._schedule(request, now)
            except NoEngine as exc:
                if not failures:
                    raise
                raise NoEngine(
                    f"no engine could start the request: {'; '.join(failures)}; {exc.message}",
                    headers=exc.headers,
                ) from None
            flight = Flight(
                self.conductor,
                plan,
                self._mode(plan),
                clock=self.clock,
                metrics=self.metrics,
                scheduled_at_s=now,
            )
            try:
                return await self._execute(req, flight, deadline)
            except NotStarted as exc:
                flight.close(Outcome.RETRIED)
                if exc.engine_at_fault:
                    self.mark_unhealthy(InstanceId(exc.engine_id), f"request: {exc.reason}")
                self.metrics.retries.labels(exc.reason).inc()
                failures.append(str(exc))
                log.warning("request %s: %s (attempt %d/%d)", rid, exc, attempt + 1, attempts)
            except TimeoutError:
                flight.close(Outcome.TIMEOUT)
                raise UpstreamTimeout(
                    f"no answer within {self.config.upstream.request_timeout_s:g} s"
                ) from None
            except asyncio.CancelledError:
                flight.close(Outcome.CLIENT_DISCONNECT)
                raise
            except BaseException:
                flight.close(Outcome.ERROR)
                raise
        raise NoEngine(
            f"no engine could start the request after {attempts} attempts: {'; '.join(failures)}",
            headers={"Retry-After": "1"},
        )

    def _schedule(self, request: Request, now: float) -> Plan:
        policy = self.conductor.policy_name
        t0 = time.perf_counter()
        try:
            decision = self.conductor.schedule(request, now)
        except InvalidInput as exc:
            raise BadRequest(str(exc)) from None
        elapsed_s = time.perf_counter() - t0
        if isinstance(decision, Rejection):
            self.metrics.child(self.metrics.decision_latency, policy).observe(elapsed_s)
            self.metrics.decisions.labels(policy, "rejected").inc()
            self.metrics.rejections.labels(decision.code).inc()
            raise self._rejection_error(decision)
        # recorded on the loop's next pass: after the request went out to the engine
        asyncio.get_running_loop().call_soon(
            self._record_decision, policy, elapsed_s, decision, request.prompt_tokens
        )
        return decision

    def _record_decision(
        self, policy: str, elapsed_s: float, plan: Plan, prompt_tokens: int
    ) -> None:
        m = self.metrics
        m.child(m.decision_latency, policy).observe(elapsed_s)
        m.child(m.decisions, policy, "accepted").inc()
        m.child(m.predicted_ttft, policy).observe(plan.predicted_ttft_s)
        m.child(m.cache_hit_tokens, policy).inc(plan.cached_tokens)
        m.child(m.prompt_tokens, policy).inc(prompt_tokens)

    def _rejection_error(self, rejection: Rejection) -> GatewayError:
        retry_s = 1
        slo = self.conductor.config.ttft_slo_s
        if rejection.code == "ttft_slo" and rejection.predicted_ttft_s is not None:
            retry_s = max(1, math.ceil(rejection.predicted_ttft_s - slo))
        headers = {"Retry-After": str(retry_s)}
        message = f"request rejected ({rejection.code}): {rejection.reason}"
        if rejection.code == "no_instance":
            return NoEngine(message, headers=headers)
        return Overloaded(message, headers=headers)

    def _mode(self, plan: Plan) -> Mode:
        prefill = self.engines[plan.prefill].config
        if plan.prefill == plan.decode or prefill.role is Role.BOTH:
            return Mode.AGGREGATED
        return Mode.DISAGGREGATED

    def _headers(self, flight: Flight) -> dict[str, str]:
        return {
            "x-conductor-request-id": flight.request_id,
            "x-conductor-prefill": flight.plan.prefill,
            "x-conductor-decode": flight.decode
            if flight.mode is Mode.DISAGGREGATED
            else flight.plan.prefill,
            "x-conductor-mode": flight.mode.value,
            "x-conductor-cached-tokens": str(flight.plan.cached_tokens),
        }

    def _model_for(self, handle: EngineHandle) -> str:
        return handle.upstream_model or self.config.model_name

    async def _execute(self, req: ParsedRequest, flight: Flight, deadline: float) -> AnyResponse:
        plan = flight.plan
        path = PATHS[req.kind]
        prefill = self.engines[plan.prefill]
        if flight.mode is Mode.AGGREGATED:
            body = upstream_body(req.body, self._model_for(prefill))
            return await self._final_leg(req, prefill, body, flight, deadline)
        # disaggregated: the prefill leg computes (and hands off) the prompt's KV
        leg = prefill_body(
            req.body,
            self._model_for(prefill),
            kv_transfer_params=self.config.upstream.kv_transfer_params,
        )
        resp = await open_upstream(
            self.upstream,
            prefill.engine_id,
            prefill.config.url + path,
            leg,
            deadline=deadline,
            headers={"X-Request-Id": f"{flight.request_id}-prefill"},
        )
        content = await read_body(resp, flight, deadline=deadline)
        if resp.status_code != 200:
            flight.close(Outcome.UPSTREAM_ERROR)
            return passthrough(resp.status_code, content, self._headers(flight))
        flight.prefill_finished()
        self.metrics.observed_prefill.labels(plan.policy).observe(
            self.clock() - flight.scheduled_at_s
        )
        decode_id = self._confirm_decode(flight)
        decode = self.engines[decode_id]
        kv = kv_params_of(content) if self.config.upstream.kv_transfer_params else None
        body = upstream_body(req.body, self._model_for(decode), kv)
        return await self._final_leg(req, decode, body, flight, deadline)

    def _confirm_decode(self, flight: Flight) -> InstanceId:
        """The decode instance; under ``baseline`` admission it is chosen (and checked) only
        now that prefill is over."""
        if self.conductor.config.admission != "baseline":
            return flight.decode
        choice = self.conductor.confirm_decode(flight.request_id, self.clock())
        if isinstance(choice, Rejection):
            flight.close(Outcome.ERROR)
            self.metrics.rejections.labels(choice.code).inc()
            raise self._rejection_error(choice)
        flight.set_decode(choice)
        return choice

    async def _final_leg(
        self,
        req: ParsedRequest,
        engine: EngineHandle,
        body: dict[str, object],
        flight: Flight,
        deadline: float,
    ) -> AnyResponse:
        """The leg whose answer goes to the client (streamed or whole)."""
        url = engine.config.url + PATHS[req.kind]
        resp = await open_upstream(
            self.upstream,
            engine.engine_id,
            url,
            body,
            deadline=deadline,
            headers={"X-Request-Id": flight.request_id},
        )
        headers = self._headers(flight)
        if resp.status_code != 200:
            content = await read_body(resp, flight, deadline=deadline)
            flight.close(Outcome.UPSTREAM_ERROR)
            return passthrough(resp.status_code, content, headers)
        if req.stream:
            return tracked_stream(flight, resp, deadline=deadline, headers=headers)
        if flight.mode is Mode.AGGREGATED:
            flight.assume_prefill_end(asyncio.get_running_loop())
        content = await read_body(resp, flight, deadline=deadline)
        flight.close(Outcome.COMPLETED)
        media = resp.headers.get("content-type", "application/json")
        return Response(content, 200, headers, media)
