"""The request path: one model's OpenAI request, parsed, to the engine's answer.

:meth:`RequestPath.serve` (the gateway parsed the body and picked the model's pool): tokenize
with the model's tokenizer, check its lengths, hash the prompt's full blocks, place it
through the pool's late-binding queue (:mod:`conductor.gateway.hold`: decided at once when
the queue is off or can start it now, else when capacity frees up); a rejection becomes 429
(or 503 when no engine can serve); a plan runs in aggregated mode (one engine) or
disaggregated mode (the prefill leg, then the real request to the decode
engine, both shaped by the engines' kind). An attempt that an engine did not start is
scheduled again, up to ``max_attempts``, until the client was sent its first byte; an
engine whose connection failed is marked unhealthy meanwhile. A timeout fails that request
only (504): a slow engine is not a dead one, its health comes from the health probe.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import secrets
from collections.abc import Callable

from conductor.core.errors import InvalidInput
from conductor.core.plan import Plan, Rejection
from conductor.core.scheduler import Scheduler
from conductor.core.types import InstanceId, Request, RequestId, Role
from conductor.gateway.config import GatewayConfig
from conductor.gateway.engines.handle import EngineHandle
from conductor.gateway.errors import (
    BadRequest,
    GatewayError,
    NoEngine,
    Overloaded,
    UpstreamTimeout,
)
from conductor.gateway.flight import Flight, Mode, Outcome, completion_tokens
from conductor.gateway.hold import Hold
from conductor.gateway.membership import EngineSet
from conductor.gateway.metrics import PoolMetrics
from conductor.gateway.model_config import ModelConfig
from conductor.gateway.openai_api import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    Kind,
    ParsedRequest,
)
from conductor.gateway.prefill_times import PrefillTimes
from conductor.gateway.proxy import (
    NotStarted,
    first_chunk,
    open_upstream,
    passthrough,
    read_body,
    tracked_stream,
    upstream_body,
)
from conductor.gateway.tokenizer import PromptTokenizer, prompt_token_ids, request_block_hashes
from conductor.gateway.upstream import Upstream
from conductor.web.messages import AnyResponse, Response

log = logging.getLogger(__name__)

PATHS: dict[Kind, str] = {"completion": "/v1/completions", "chat": "/v1/chat/completions"}
NOT_RUNNING = "the gateway is not running (use `async with gateway.running()`)"


class RequestPath:
    """Serves one model's requests on the engines of its pool's :class:`EngineSet` (see the
    module docstring).

    Invariant: every scheduled attempt ends in exactly one :class:`Flight` outcome.
    ``upstream`` is set while the gateway runs (None otherwise).
    """

    def __init__(
        self,
        config: GatewayConfig,
        model: ModelConfig,
        conductor: Scheduler,
        tokenizer: PromptTokenizer,
        engines: EngineSet,
        metrics: PoolMetrics,
        clock: Callable[[], float],
        hold: Hold,
    ) -> None:
        self.config = config
        self.model = model
        self.conductor = conductor
        self.tokenizer = tokenizer
        self.engines = engines
        self.metrics = metrics
        self.clock = clock
        self.hold = hold
        self.upstream: Upstream | None = None
        self._rid_prefix = secrets.token_hex(4)
        self._rid_counter = itertools.count(1)
        self.prefill_times = PrefillTimes()

    @property
    def client(self) -> Upstream:
        if self.upstream is None:
            raise RuntimeError(NOT_RUNNING)
        return self.upstream

    def _next_request_id(self) -> str:
        return f"gw-{self._rid_prefix}-{next(self._rid_counter)}"

    async def tokenize(self, req: ParsedRequest, body_bytes: int | None = None) -> list[int]:
        """The prompt's token ids; rendered and tokenized in a worker thread, off the event
        loop, when the work is large: a body (``body_bytes``, else the text and messages)
        over ``inline_work_chars``, or any tools (their schemas go through the template)."""
        size = body_bytes
        if size is None:
            size = len(req.prompt_text or "") + sum(len(str(m)) for m in req.messages)
        if size <= self.config.requests.inline_work_chars and not req.tools:
            return prompt_token_ids(self.tokenizer, req)
        return await asyncio.to_thread(prompt_token_ids, self.tokenizer, req)

    def output_budget(self, req: ParsedRequest, prompt_tokens: int) -> int | None:
        """Checks lengths against ``max_model_len`` (vLLM's rules) and returns the request's
        ``max_tokens`` for the scheduler: the client's (default: 16 for completions, none
        for chat — the scheduler then caps at the rest of the context) times ``n``. What the
        request will really generate is the scheduler's prediction
        (:mod:`conductor.core.output_length`), learnt from the completions it sees."""
        limit = self.model.max_model_len
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
        if per_choice is None and req.kind == "completion":
            per_choice = COMPLETION_DEFAULT_MAX_TOKENS
        return None if per_choice is None else min(per_choice, room) * req.n

    async def serve(self, req: ParsedRequest, body_bytes: int) -> AnyResponse:
        """A parsed request for this model (``body_bytes``: its body's size), start to
        finish; raises :class:`GatewayError` for the client."""
        token_ids = await self.tokenize(req, body_bytes)
        max_tokens = self.output_budget(req, len(token_ids))
        hashes = tuple(
            request_block_hashes(token_ids, self.model.block_size_tokens, req.cache_salt)
        )
        base_id = self._next_request_id()
        deadline = asyncio.get_running_loop().time() + self.config.upstream.request_timeout_s
        attempts = self.config.upstream.max_attempts
        failures: list[str] = []
        for attempt in range(attempts):
            rid = RequestId(base_id if attempt == 0 else f"{base_id}-retry{attempt}")
            now = self.clock()
            request = Request(rid, len(token_ids), hashes, max_tokens, arrival_s=now)
            try:
                plan = await self._schedule(request, now, deadline)
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
                on_change=self.hold.release,
                prefill_times=self.prefill_times,
                dispatched_at_s=self.clock(),
            )
            try:
                return await self._execute(req, flight, deadline)
            except NotStarted as exc:
                if exc.reason == "timeout":  # slow, not dead: this request fails, no more
                    flight.close(Outcome.TIMEOUT)
                    self.metrics.retries.labels("timeout_not_retried").inc()
                    raise UpstreamTimeout(
                        f"engine {exc.engine_id} sent nothing within "
                        f"{self.config.upstream.read_timeout_s:g} s (read_timeout_s)"
                    ) from None
                if exc.engine_at_fault:  # first: what the close releases must not go there
                    self.engines.mark_unhealthy(InstanceId(exc.engine_id), f"request: {exc.reason}")
                flight.close(Outcome.RETRIED)
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

    async def _schedule(self, request: Request, now: float, deadline: float) -> Plan:
        """The request's plan, once the hold queue places it (arrival ``now``, held until
        ``deadline`` at most, loop time); a rejection raises its 429/503.
        ``decision_latency`` is the scheduler's time, not the wait."""
        policy = self.conductor.policy_name
        try:
            placed = await self.hold.place(request, now, deadline)
        except InvalidInput as exc:
            raise BadRequest(str(exc)) from None
        decision, elapsed_s = placed.decision, placed.decide_s
        if isinstance(decision, Rejection):
            self.metrics.child(self.metrics.decision_latency, policy).observe(elapsed_s)
            self.metrics.decisions.labels(policy, "rejected").inc()
            self.metrics.rejections.labels(decision.code).inc()
            raise self.rejection_error(decision)
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

    def rejection_error(self, rejection: Rejection) -> GatewayError:
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
        prefill = self.engines.engines[plan.prefill].config
        if plan.prefill == plan.decode or prefill.role is Role.BOTH:
            return Mode.AGGREGATED
        return Mode.DISAGGREGATED

    def _headers(self, flight: Flight) -> dict[str, str]:
        queued_ms = (flight.dispatched_at_s - flight.scheduled_at_s) * 1e3
        return {
            "x-conductor-request-id": flight.request_id,
            "x-conductor-prefill": flight.plan.prefill,
            "x-conductor-decode": flight.decode
            if flight.mode is Mode.DISAGGREGATED
            else flight.plan.prefill,
            "x-conductor-mode": flight.mode.value,
            "x-conductor-cached-tokens": str(flight.plan.cached_tokens),
            "x-conductor-queued-ms": f"{queued_ms:.1f}",
            "x-conductor-predicted-ttft-ms": f"{flight.plan.predicted_ttft_s * 1e3:.1f}",
        }

    def _model_for(self, handle: EngineHandle) -> str:
        return handle.upstream_model or self.model.upstream_name

    async def _execute(self, req: ParsedRequest, flight: Flight, deadline: float) -> AnyResponse:
        plan = flight.plan
        path = PATHS[req.kind]
        prefill = self.engines.engines[plan.prefill]
        if flight.mode is Mode.AGGREGATED:
            body = upstream_body(req.body, self._model_for(prefill))
            return await self._final_leg(req, prefill, body, flight, deadline)
        # disaggregated: the prefill leg computes (and hands off) the prompt's KV
        transfer_params = self.config.upstream.kv_transfer_params
        leg = prefill.kind.prefill_body(
            req.body, self._model_for(prefill), transfer_params=transfer_params
        )
        resp = await open_upstream(
            self.client,
            prefill.engine_id,
            prefill.config.url + path,
            leg,
            deadline=deadline,
            headers={"X-Request-Id": f"{flight.request_id}-prefill"},
        )
        content = await read_body(resp, flight, deadline=deadline, engine_id=prefill.engine_id)
        if resp.status_code != 200:
            flight.close(Outcome.UPSTREAM_ERROR)
            return passthrough(resp.status_code, content, self._headers(flight))
        prefill.served += 1
        flight.prefill_finished()
        self.metrics.observed_prefill.labels(plan.policy).observe(
            self.clock() - flight.scheduled_at_s
        )
        decode_id = self._confirm_decode(flight)
        decode = self.engines.engines[decode_id]
        body = decode.kind.decode_body(
            req.body, self._model_for(decode), content, transfer_params=transfer_params
        )
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
            raise self.rejection_error(choice)
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
            self.client,
            engine.engine_id,
            url,
            body,
            deadline=deadline,
            headers={"X-Request-Id": flight.request_id},
        )
        headers = self._headers(flight)
        engine_id = engine.engine_id
        if resp.status_code != 200:
            content = await read_body(resp, flight, deadline=deadline, engine_id=engine_id)
            flight.close(Outcome.UPSTREAM_ERROR)
            return passthrough(resp.status_code, content, headers)
        if req.stream:
            first = await first_chunk(resp, engine_id, deadline=deadline)
            engine.served += 1
            return tracked_stream(flight, resp, deadline=deadline, headers=headers, first=first)
        if flight.mode is Mode.AGGREGATED:
            flight.assume_prefill_end(asyncio.get_running_loop())
        content = await read_body(resp, flight, deadline=deadline, engine_id=engine_id)
        engine.served += 1
        flight.output_tokens = completion_tokens(content)
        flight.close(Outcome.COMPLETED)
        media = resp.headers.get("content-type", "application/json")
        return Response(content, 200, headers, media)
