"""The emulator's HTTP routes: the subset of vLLM's OpenAI server a gateway talks to.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream`` true: SSE
``data: {...}`` chunks then ``data: [DONE]``; false: one JSON body with ``usage``),
``GET /v1/models``, ``GET /health``, ``GET /metrics``, ``GET /version``,
``POST /reset_prefix_cache`` (vLLM's dev endpoint; publishes ``AllBlocksCleared``) and
``GET /emulator/info`` (the emulator's settings, for tests and tools).

The request fields used are :mod:`~conductor.emulator.parsing`'s, the answers' shapes
:mod:`~conductor.emulator.shaping`'s.

P/D flow (vLLM's NIXL proxy protocol): a request with ``kv_transfer_params.do_remote_decode``
is a prefill leg; its (non-streaming) response carries ``kv_transfer_params`` with
``do_remote_prefill: true`` and the remote ids (``remote_block_ids`` are the engine's hashes
of the blocks it computed). A request with ``do_remote_prefill`` is a decode leg: the full
prompt blocks it does not have locally are counted as external prefix-cache hits and paid as
a KV transfer. The emulated prefill engine does not hold the blocks for the decode engine.

Errors are JSON ``{"error": {"message", "type", "param", "code"}}`` with a 4xx status
(:mod:`conductor.emulator.errors`; its ``error_factory`` words the server's own: 404, 405,
413, 400 for malformed HTTP, 500).

Served by :mod:`conductor.web` (:mod:`conductor.emulator.server`); :meth:`Emulator.running
<conductor.emulator.service.Emulator.running>` is the lifespan that runs the engine.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from conductor.core.errors import InvalidInput
from conductor.emulator import metrics
from conductor.emulator.errors import ApiError, error_factory
from conductor.emulator.parsing import json_body, parse
from conductor.emulator.service import Emulator
from conductor.emulator.shaping import (
    SSE_HEADERS,
    SSE_TYPE,
    Shape,
    SseBody,
    full_body,
    kv_transfer_out,
    stream_events,
)
from conductor.web.messages import AnyResponse, Request, Response, StreamResponse, json_response
from conductor.web.router import Router

MAX_BODY_BYTES = 32 * 1024 * 1024
"""Larger request bodies get 413 (the server's ``max_body_bytes``)."""
EMULATED_VLLM_VERSION = "0.32.0+conductor-emulator"


async def _generate(em: Emulator, request: Request, *, chat: bool) -> AnyResponse:
    body = json_body(request)
    parsed = parse(em, body, chat=chat)
    try:
        req = em.new_request(
            parsed.prompt_ids,
            parsed.max_tokens,
            seed=parsed.seed,
            remote_prefill=parsed.remote_prefill,
        )
        queue = em.loop.submit(req)
    except InvalidInput as exc:
        raise ApiError(exc.why, param=exc.field) from None
    shape = Shape(chat, em.config.model_name, req.request_id)
    if parsed.stream:
        events = SseBody(stream_events(req, queue, parsed, shape), lambda: em.loop.abort(req))
        return StreamResponse(events, 200, SSE_HEADERS, SSE_TYPE)
    finished = False
    try:
        while not finished:
            out = await queue.get()
            if out is None:
                raise ApiError("the request was aborted", status=500)
            finished = out.finished
    finally:
        if not finished:
            em.loop.abort(req)
    body_bytes = full_body(shape, req, kv_transfer_out(em.config, req, parsed))
    return Response(body_bytes, 200, None, "application/json")


_Endpoint = Callable[[Request], Awaitable[AnyResponse]]


def _answering_api_errors(endpoint: _Endpoint) -> _Endpoint:
    async def handler(request: Request) -> AnyResponse:
        try:
            return await endpoint(request)
        except ApiError as exc:
            return exc.response()

    return handler


def build_app(em: Emulator) -> Router:
    """The routes serving ``em``. Serve with ``error=``:func:`error_factory`,
    ``max_body_bytes=``:data:`MAX_BODY_BYTES` and ``em.running()`` as the lifespan (it runs
    the engine): :mod:`conductor.emulator.server` does."""

    async def completions(request: Request) -> AnyResponse:
        return await _generate(em, request, chat=False)

    async def chat_completions(request: Request) -> AnyResponse:
        return await _generate(em, request, chat=True)

    async def models(request: Request) -> AnyResponse:
        cfg = em.config
        card = {
            "id": cfg.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": cfg.model_name,
            "parent": None,
            "max_model_len": cfg.max_model_len,
        }
        return json_response({"object": "list", "data": [card]})

    async def health(request: Request) -> AnyResponse:
        return Response()

    async def version(request: Request) -> AnyResponse:
        return json_response({"version": EMULATED_VLLM_VERSION})

    async def prometheus(request: Request) -> AnyResponse:
        text = metrics.render(
            em.core,
            model_name=em.config.model_name,
            publisher=em.publisher.stats if em.publisher is not None else None,
        )
        return Response(text.encode(), 200, None, metrics.CONTENT_TYPE)

    async def reset_prefix_cache(request: Request) -> AnyResponse:
        if not em.loop.reset_prefix_cache():
            raise ApiError("requests are running; the prefix cache was not reset", status=409)
        em.loop.flush_events()
        return Response()

    async def info(request: Request) -> AnyResponse:
        cfg = em.config
        return json_response(
            {
                "engine_id": cfg.engine_id,
                "model": cfg.model_name,
                "role": cfg.role.value,
                "preset": None if cfg.cost is not None else cfg.preset,
                "cost_model": em.cost.name,
                "speedup": cfg.speedup,
                "instant": cfg.instant,
                "block_size": cfg.block_size_tokens,
                "cache_blocks": cfg.cache_blocks,
                "max_model_len": cfg.max_model_len,
                "tokenizer": em.tokenizer.name,
                "kv_events_port": cfg.kv_events_port,
                "replay_port": cfg.replay_port,
                "kv_topic": cfg.kv_topic,
                "seed": cfg.seed,
            }
        )

    router = Router(error=error_factory)
    for method, path, endpoint in (
        ("POST", "/v1/completions", completions),
        ("POST", "/v1/chat/completions", chat_completions),
        ("GET", "/v1/models", models),
        ("GET", "/health", health),
        ("GET", "/version", version),
        ("GET", "/metrics", prometheus),
        ("POST", "/reset_prefix_cache", reset_prefix_cache),
        ("GET", "/emulator/info", info),
    ):
        router.add(method, path, _answering_api_errors(endpoint))
    return router
