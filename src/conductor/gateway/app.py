"""The HTTP surface: a Starlette app around a :class:`~conductor.gateway.service.Gateway`.

OpenAI endpoints (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``), ``/health``,
``/metrics`` and the admin API (``/admin/engines``...), which needs ``Authorization: Bearer
<token>``. Every error leaves as JSON ``{"error": {...}}``; nothing escapes as a traceback.
The app's lifespan runs the gateway's background tasks.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from conductor.core.errors import InvalidInput
from conductor.gateway.config import engine_from_mapping
from conductor.gateway.errors import (
    BadRequest,
    Forbidden,
    GatewayError,
    PayloadTooLarge,
    Unauthorized,
    error_body,
)
from conductor.gateway.metrics import CONTENT_TYPE
from conductor.gateway.openai_api import Kind, parse_json
from conductor.gateway.service import Gateway

log = logging.getLogger(__name__)
Endpoint = Callable[[Request], Awaitable[Response]]


async def read_limited(request: Request, limit: int) -> bytes:
    """The request body, or :class:`PayloadTooLarge` as soon as it exceeds ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise BadRequest(f"bad Content-Length header {declared!r}") from None
        if size > limit:
            raise PayloadTooLarge(f"request body of {size} bytes exceeds the limit of {limit}")
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(gateway: Gateway) -> Starlette:
    cfg = gateway.config

    def generation(kind: Kind, endpoint: str) -> Endpoint:
        async def handler(request: Request) -> Response:
            try:
                raw = await read_limited(request, cfg.max_body_bytes)
                response = await gateway.generate(kind, raw)
            except GatewayError as exc:
                response = exc.response()
            except ClientDisconnect:
                response = Response(status_code=499)
            except Exception:
                log.exception("unexpected error in %s", endpoint)
                response = JSONResponse(
                    error_body(500, "internal error in the gateway", "server_error"), 500
                )
            gateway.metrics.child(
                gateway.metrics.responses, endpoint, str(response.status_code)
            ).inc()
            return response

        return handler

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": cfg.model_name,
                        "object": "model",
                        "created": int(gateway.started_at_wall_s),
                        "owned_by": "conductor",
                        "max_model_len": cfg.max_model_len,
                    }
                ],
            }
        )

    async def health(request: Request) -> Response:
        snaps = gateway.snapshot()
        healthy = sum(1 for s in snaps if s.healthy)
        ok = gateway.can_serve()
        body = {
            "status": "ok" if ok else "unavailable",
            "engines": len(snaps),
            "healthy_engines": healthy,
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    async def metrics(request: Request) -> Response:
        return Response(gateway.metrics.exposition(), media_type=CONTENT_TYPE)

    def authorize(request: Request) -> None:
        token = cfg.admin_token
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

    def admin(fn: Endpoint) -> Endpoint:
        async def handler(request: Request) -> Response:
            try:
                authorize(request)
                return await fn(request)
            except GatewayError as exc:
                return exc.response()
            except InvalidInput as exc:
                return BadRequest(str(exc), param=exc.field).response()

        return handler

    def engine_json(engine_id: str) -> dict[str, object]:
        handle = gateway.handle(engine_id)
        out = handle.config.to_json()
        snap = next((s for s in gateway.snapshot() if s.engine_id == engine_id), None)
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
        return out

    async def list_engines(request: Request) -> Response:
        return JSONResponse({"engines": [engine_json(e) for e in gateway.engines]})

    async def add_engine(request: Request) -> Response:
        raw = await read_limited(request, cfg.max_body_bytes)
        values = parse_json(raw)
        engine = engine_from_mapping(
            values, default_block_size=cfg.block_size_tokens, where="engine"
        )
        gateway.add_engine(engine)
        return JSONResponse(engine_json(engine.engine_id), status_code=201)

    async def drain(request: Request) -> Response:
        engine_id = request.path_params["engine_id"]
        gateway.set_draining(engine_id, True)
        return JSONResponse(engine_json(engine_id))

    async def resume(request: Request) -> Response:
        engine_id = request.path_params["engine_id"]
        gateway.set_draining(engine_id, False)
        return JSONResponse(engine_json(engine_id))

    async def remove(request: Request) -> Response:
        engine_id = request.path_params["engine_id"]
        lost = gateway.remove_engine(engine_id)
        return JSONResponse({"removed": engine_id, "inflight_requests_on_it": lost})

    async def engines_root(request: Request) -> Response:
        return await (add_engine if request.method == "POST" else list_engines)(request)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kinds = {404: "not_found_error", 405: "invalid_request_error"}
        body = error_body(exc.status_code, str(exc.detail), kinds.get(exc.status_code, "error"))
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.error("unhandled error: %r", exc)
        return JSONResponse(error_body(500, "internal error in the gateway", "server_error"), 500)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with gateway.running():
            yield

    routes = [
        Route("/v1/completions", generation("completion", "completions"), methods=["POST"]),
        Route("/v1/chat/completions", generation("chat", "chat_completions"), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/admin/engines", admin(engines_root), methods=["GET", "POST"]),
        Route("/admin/engines/{engine_id}", admin(remove), methods=["DELETE"]),
        Route("/admin/engines/{engine_id}/drain", admin(drain), methods=["POST"]),
        Route("/admin/engines/{engine_id}/resume", admin(resume), methods=["POST"]),
    ]
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error, Exception: server_error},
    )


def dumps(value: object) -> str:
    """Compact JSON (for logs and tests)."""
    return json.dumps(value, separators=(",", ":"))
