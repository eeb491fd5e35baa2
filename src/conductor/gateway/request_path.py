"""The request path of the gateway: parse, tokenize, hash, schedule, run the plan.

:class:`RequestPath` is a mixin of :class:`~conductor.gateway.service.Gateway` (kept apart so
each file stays small): a rejection becomes 429 (or 503 when no engine can serve); a plan
runs in aggregated mode (one engine) or disaggregated mode (prefill leg with
``max_tokens: 1``, then the real request to the decode engine). An attempt that an engine did
not start is scheduled again, up to ``max_attempts``; the failed engine is marked unhealthy
meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Callable

import httpx
from starlette.responses import Response

from conductor.core.conductor import Conductor
from conductor.core.errors import InvalidInput
from conductor.core.plan import Plan, Rejection
from conductor.core.types import InstanceId, Request, RequestId, Role
from conductor.gateway.config import GatewayConfig
from conductor.gateway.engines import EngineHandle
from conductor.gateway.errors import (
    BadRequest,
    GatewayError,
    NoEngine,
    NotFound,
    Overloaded,
    UpstreamTimeout,
)
from conductor.gateway.flight import Flight, Mode, Outcome
from conductor.gateway.metrics import GatewayMetrics
from conductor.gateway.openai_api import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    Kind,
    ParsedRequest,
    parse_json,
    parse_request,
)
from conductor.gateway.proxy import (
    NotStarted,
    TrackedStream,
    kv_params_of,
    open_upstream,
    passthrough,
    prefill_body,
    read_body,
    upstream_body,
)
from conductor.gateway.tokenizer import PromptTokenizer, prompt_token_ids, request_block_hashes

log = logging.getLogger(__name__)

TOKENIZE_INLINE_CHARS = 4096
"""Longer prompts are tokenized in a worker thread, off the event loop."""
PATHS: dict[Kind, str] = {"completion": "/v1/completions", "chat": "/v1/chat/completions"}


class RequestPath:
    """The request path; the service provides the state below."""

    config: GatewayConfig
    conductor: Conductor
    tokenizer: PromptTokenizer
    clock: Callable[[], float]
    metrics: GatewayMetrics
    engines: dict[InstanceId, EngineHandle]
    _rid_prefix: str
    _rid_counter: itertools.count[int]

    @property
    def client(self) -> httpx.AsyncClient:
        raise NotImplementedError

    def mark_unhealthy(self, engine_id: InstanceId, reason: str) -> None:
        raise NotImplementedError

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

    async def generate(self, kind: Kind, raw_body: bytes) -> Response:
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
        self.metrics.decision_latency.labels(policy).observe(time.perf_counter() - t0)
        if isinstance(decision, Rejection):
            self.metrics.decisions.labels(policy, "rejected").inc()
            self.metrics.rejections.labels(decision.code).inc()
            raise self._rejection_error(decision)
        self.metrics.decisions.labels(policy, "accepted").inc()
        self.metrics.predicted_ttft.labels(policy).observe(decision.predicted_ttft_s)
        self.metrics.cache_hit_tokens.labels(policy).inc(decision.cached_tokens)
        self.metrics.prompt_tokens.labels(policy).inc(request.prompt_tokens)
        return decision

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

    async def _execute(self, req: ParsedRequest, flight: Flight, deadline: float) -> Response:
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
            self.client,
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
    ) -> Response:
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
        if resp.status_code != 200:
            content = await read_body(resp, flight, deadline=deadline)
            flight.close(Outcome.UPSTREAM_ERROR)
            return passthrough(resp.status_code, content, headers)
        if req.stream:
            return TrackedStream(flight, resp, deadline=deadline, headers=headers)
        if flight.mode is Mode.AGGREGATED:
            flight.assume_prefill_end(asyncio.get_running_loop())
        content = await read_body(resp, flight, deadline=deadline)
        flight.close(Outcome.COMPLETED)
        media = resp.headers.get("content-type", "application/json")
        return Response(content, status_code=200, headers=headers, media_type=media)
