"""The HTTP surface: a :class:`~conductor.web.router.Router` around a
:class:`~conductor.gateway.service.Gateway`, served by :mod:`conductor.web`.

OpenAI endpoints (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``), ``/health``
(liveness: the process answers, always 200), ``/ready`` (readiness: 200 while it can route,
503 otherwise, with a detail per engine), ``/metrics`` and the admin API
(``/admin/engines``...), which needs ``Authorization: Bearer <token>``. Every error leaves
as JSON ``{"error": {...}}``; nothing escapes as a traceback.
:func:`server` builds the HTTP server (body limit, error shape) and :func:`lifespan` runs the
gateway's background tasks around it; the handlers are the methods of :class:`Handlers`.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

from conductor.core.errors import InvalidInput
from conductor.gateway.config import engine_from_mapping
from conductor.gateway.errors import (
    BadRequest,
    Forbidden,
    GatewayError,
    Unauthorized,
    error_response,
)
from conductor.gateway.metrics import CONTENT_TYPE
from conductor.gateway.model_check import served_models, single_model
from conductor.gateway.openai_api import Kind, parse_json
from conductor.gateway.service import Gateway, Routed
from conductor.web.errors import error_body
from conductor.web.messages import AnyResponse, Request, Response, json_response
from conductor.web.router import Router
from conductor.web.server import HttpServer

log = logging.getLogger(__name__)
Endpoint = Callable[[Request], Awaitable[AnyResponse]]


def server(gateway: Gateway) -> HttpServer:
    """The gateway's HTTP server (not started): its routes, limits and error shape."""
    http = HttpServer(
        create_app(gateway),
        max_body_bytes=gateway.config.max_body_bytes,
        limits=gateway.config.http,
        error=error_response,
    )
    gateway.metrics.attach_http(lambda: http.counters)
    return http


def lifespan(gateway: Gateway) -> AbstractAsyncContextManager[Gateway]:
    """Runs the gateway's background tasks (health, load, KV events) while entered."""
    return gateway.running()


def create_app(gateway: Gateway) -> Router:
    """The gateway's routes."""
    h = Handlers(gateway)
    router = Router(error=error_response)
    router.add("POST", "/v1/completions", h.generation("completion", "completions"))
    router.add("POST", "/v1/chat/completions", h.generation("chat", "chat_completions"))
    router.add("GET", "/v1/models", h.models)
    router.add("GET", "/health", h.health)
    router.add("GET", "/ready", h.ready)
    router.add("GET", "/metrics", h.metrics)
    router.add("GET", "/admin/engines", h.admin(h.list_engines))
    router.add("GET", "/admin/models", h.admin(h.list_models))
    router.add("POST", "/admin/engines", h.admin(h.add_engine))
    router.add("DELETE", "/admin/engines/{engine_id}", h.admin(h.remove))
    router.add("POST", "/admin/engines/{engine_id}/drain", h.admin(h.drain))
    router.add("POST", "/admin/engines/{engine_id}/resume", h.admin(h.resume))
    return router


class Handlers:
    """The endpoints of one :class:`Gateway`; admin ones go through :meth:`admin`."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.config = gateway.config

    def generation(self, kind: Kind, endpoint: str) -> Endpoint:
        """The OpenAI endpoint ``endpoint`` for requests of ``kind``."""
        gateway = self.gateway
        metrics = gateway.metrics

        async def handler(request: Request) -> AnyResponse:
            routed = Routed()
            try:
                response = await gateway.generate(kind, request.body, routed)
            except GatewayError as exc:
                response = exc.response()
            except InvalidInput as exc:
                response = BadRequest(str(exc), param=exc.field).response()
            except asyncio.CancelledError:  # the client went away
                pool = metrics.pool(routed.model)
                pool.child(pool.responses, endpoint, "499").inc()
                raise
            except Exception:
                log.exception("unexpected error in %s", endpoint)
                response = json_response(
                    error_body(500, "internal error in the gateway", "server_error"), 500
                )
            pool = metrics.pool(routed.model)
            pool.child(pool.responses, endpoint, str(response.status)).inc()
            return response

        return handler

    async def models(self, request: Request) -> Response:
        created = int(self.gateway.started_at_wall_s)
        return json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": model.name,
                        "object": "model",
                        "created": created,
                        "owned_by": "conductor",
                        "max_model_len": model.max_model_len,
                    }
                    for model in self.config.pool_models()
                ],
            }
        )

    async def health(self, request: Request) -> Response:
        """Liveness: answering at all is the news (overload or dead engines are /ready's)."""
        return json_response({"status": "alive"})

    async def ready(self, request: Request) -> Response:
        """Readiness: whether a request can be routed now, and why not."""
        snaps = self.gateway.snapshot()
        healthy = sum(1 for s in snaps if s.healthy)
        ok = self.gateway.can_serve()
        warnings = [
            f"engine {s.engine_id} served traffic but sent no KV events"
            for s in snaps
            if s.kv_silent
        ]
        body: dict[str, object] = {
            "status": "ready" if ok else "unavailable",
            "engines": len(snaps),
            "healthy_engines": healthy,
            "unhealthy": sorted(s.engine_id for s in snaps if not s.healthy),
            "warnings": warnings,
        }
        if self.config.several_models:  # ready while some model can be served
            body["models"] = {
                p.name: "ready" if p.can_serve() else "unavailable" for p in self.gateway.pools
            }
        return json_response(body, 200 if ok else 503)

    async def metrics(self, request: Request) -> Response:
        return Response(self.gateway.metrics.exposition(), media_type=CONTENT_TYPE)

    # -- admin API -----------------------------------------------------------------------
    def authorize(self, request: Request) -> None:
        token = self.config.admin_token
        if token is None:
            raise Forbidden("the admin API is disabled; start the gateway with --admin-token")
        challenge = {"WWW-Authenticate": "Bearer"}
        header = request.headers.get("authorization")
        if not header:
            raise Unauthorized("missing 'Authorization: Bearer <token>' header", headers=challenge)
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise Unauthorized(
                "the Authorization header must be 'Bearer <token>'", headers=challenge
            )
        if not hmac.compare_digest(value.strip().encode(), token.encode()):
            raise Forbidden("invalid admin token")

    def admin(self, fn: Endpoint) -> Endpoint:
        """``fn`` behind the admin token, its errors as JSON answers."""

        async def handler(request: Request) -> AnyResponse:
            try:
                self.authorize(request)
                return await fn(request)
            except GatewayError as exc:
                return exc.response()
            except InvalidInput as exc:
                return BadRequest(str(exc), param=exc.field).response()

        return handler

    def engine_json(self, engine_id: str) -> dict[str, object]:
        handle = self.gateway.handle(engine_id)
        out = handle.config.to_json()
        snap = next((s for s in self.gateway.snapshot() if s.engine_id == engine_id), None)
        if snap is not None:
            out.update(
                healthy=snap.healthy,
                draining=snap.draining,
                queued_requests=snap.queued_requests,
                queued_prefill_tokens=snap.queued_prefill_tokens,
                running_requests=snap.running_requests,
                kv_reserved_tokens=snap.kv_reserved_tokens,
                reported_waiting=snap.reported_waiting,
                reported_running=snap.reported_running,
                reported_kv_usage=snap.reported_kv_usage,
                indexed_blocks=snap.indexed_blocks,
                kv_queue_depth=snap.kv_queue_depth,
                kv_events_dropped=snap.kv_events_dropped,
            )
            if self.config.several_models:
                out.update(pool=snap.model, model_error=snap.model_error)
        return out

    async def list_engines(self, request: Request) -> Response:
        return json_response({"engines": [self.engine_json(e) for e in self.gateway.engines]})

    async def list_models(self, request: Request) -> Response:
        return json_response({"models": [p.describe() for p in self.gateway.pools]})

    async def add_engine(self, request: Request) -> Response:
        values = parse_json(request.body, max_depth=self.config.requests.max_json_depth)
        block_size = self.config.block_size_tokens
        if self.config.several_models:
            values = dict(values)
            if values.get("model") is None:  # discovered: the one model it serves
                values["model"] = await self._discover(values.get("url"))
            model = next(
                (m for m in self.config.models if m.upstream_name == values["model"]), None
            )
            if model is not None:
                block_size = model.block_size_tokens
        engine = engine_from_mapping(values, default_block_size=block_size, where="engine")
        self.gateway.add_engine(engine)
        return json_response(self.engine_json(engine.engine_id), 201)

    async def _discover(self, url: object) -> str:
        if not isinstance(url, str):
            raise InvalidInput("engine.url", url, "is required")
        timeout_s = self.config.monitor.health_timeout_s
        ids = await served_models(self.gateway.client, url.rstrip("/"), timeout_s)
        try:
            if ids is None:
                raise ValueError(f"GET {url}/v1/models gave no model list")
            return single_model(url, ids)
        except ValueError as exc:
            raise InvalidInput(
                "engine.model", None, f"not given and not discovered: {exc}"
            ) from None

    async def drain(self, request: Request) -> Response:
        engine_id = request.path_params["engine_id"]
        self.gateway.set_draining(engine_id, True)
        return json_response(self.engine_json(engine_id))

    async def resume(self, request: Request) -> Response:
        engine_id = request.path_params["engine_id"]
        self.gateway.set_draining(engine_id, False)
        return json_response(self.engine_json(engine_id))

    async def remove(self, request: Request) -> Response:
        engine_id = request.path_params["engine_id"]
        lost = self.gateway.remove_engine(engine_id)
        return json_response({"removed": engine_id, "inflight_requests_on_it": lost})
