"""The emulator's HTTP API: the subset of vLLM's OpenAI server a gateway talks to.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream`` true: SSE
``data: {...}`` chunks then ``data: [DONE]``; false: one JSON body with ``usage``),
``GET /v1/models``, ``GET /health``, ``GET /metrics``, ``GET /version``,
``POST /reset_prefix_cache`` (vLLM's dev endpoint; publishes ``AllBlocksCleared``) and
``GET /emulator/info`` (the emulator's settings, for tests and tools).

Request fields used: ``model`` (optional; must name the served model), ``prompt`` (string,
token ids, or a one-element list of either), ``messages`` (chat; ``content`` a string or
text parts), ``max_tokens`` / ``max_completion_tokens`` (default
:data:`DEFAULT_MAX_TOKENS`: the emulator has no end-of-sequence token), ``stream``,
``stream_options.include_usage`` / ``continuous_usage_stats``, ``seed`` (the completion's
seed; default the engine's), ``n`` (must be 1) and ``kv_transfer_params``. Sampling fields
(temperature, top_p, stop, ...) are accepted and ignored.

P/D flow (vLLM's NIXL proxy protocol): a request with ``kv_transfer_params.do_remote_decode``
is a prefill leg; its (non-streaming) response carries ``kv_transfer_params`` with
``do_remote_prefill: true`` and the remote ids (``remote_block_ids`` are the engine's hashes
of the blocks it computed). A request with ``do_remote_prefill`` is a decode leg: the full
prompt blocks it does not have locally are counted as external prefix-cache hits and paid as
a KV transfer. The emulated prefill engine does not hold the blocks for the decode engine.

Errors are JSON ``{"error": {"message", "type", "param", "code"}}`` with a 4xx status.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from conductor.core.errors import ConductorError, InvalidInput
from conductor.emulator import metrics
from conductor.emulator.engine import EngineRequest, TokenOutput
from conductor.emulator.service import Emulator

DEFAULT_MAX_TOKENS = 16
MAX_BODY_BYTES = 32 * 1024 * 1024
EMULATED_VLLM_VERSION = "0.32.0+conductor-emulator"
_JSON = msgspec.json.Encoder()
_DONE = b"data: [DONE]\n\n"


class ApiError(ConductorError):
    """A request the API refuses; mapped to a JSON error with ``status``."""

    def __init__(
        self, message: str, *, status: int = 400, param: str | None = None, kind: str = ""
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.kind = kind or _ERROR_TYPES.get(status, "BadRequestError")


_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    409: "ConflictError",
    413: "RequestTooLargeError",
    500: "InternalServerError",
}


def error_response(message: str, status: int, param: str | None = None, kind: str = "") -> Response:
    body = {
        "error": {
            "message": message,
            "type": kind or _ERROR_TYPES.get(status, "BadRequestError"),
            "param": param,
            "code": status,
        }
    }
    return Response(_JSON.encode(body), status_code=status, media_type="application/json")


@dataclass(frozen=True, slots=True)
class Parsed:
    """A validated generation request."""

    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    seed: int | None
    kv_params: Mapping[str, Any] | None

    @property
    def remote_decode(self) -> bool:
        return bool(self.kv_params and self.kv_params.get("do_remote_decode"))

    @property
    def remote_prefill(self) -> bool:
        return bool(self.kv_params and self.kv_params.get("do_remote_prefill"))


# -- parsing -------------------------------------------------------------------------------


async def _json_body(request: Request) -> dict[str, Any]:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise ApiError(f"request body over {MAX_BODY_BYTES} bytes", status=413)
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(f"request body over {MAX_BODY_BYTES} bytes", status=413)
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise ApiError(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError("the body must be a JSON object")
    return body


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _opt_int(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise ApiError(f"{name} must be an integer, got {value!r}", param=name)
    return int(value)


def _opt_bool(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(f"{name} must be a boolean, got {value!r}", param=name)
    return value


def _check_model(em: Emulator, body: Mapping[str, Any]) -> None:
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise ApiError(f"model must be a string, got {model!r}", param="model")
    if model != em.config.model_name:
        raise ApiError(f"The model `{model}` does not exist.", status=404, param="model")


def _token_ids(em: Emulator, value: list[Any]) -> list[int]:
    vocab = em.tokenizer.vocab_size
    for i, t in enumerate(value):
        if not _is_int(t):
            raise ApiError(
                f"prompt[{i}] must be a token id (an integer), got {t!r}", param="prompt"
            )
        if not 0 <= t < vocab:
            raise ApiError(
                f"token id {t} at prompt[{i}] is out of vocabulary (size {vocab})", param="prompt"
            )
    return [int(t) for t in value]


def _prompt_ids(em: Emulator, prompt: object) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str):
        return em.tokenizer.encode(prompt)
    if isinstance(prompt, list) and all(_is_int(t) for t in prompt):
        return _token_ids(em, prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        raise ApiError("the emulator serves one prompt per request", param="prompt")
    raise ApiError("prompt must be a string or a list of token ids", param="prompt")


def _message_text(content: object, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                parts.append(part["text"])
            else:
                raise ApiError(
                    f"messages[{index}].content: only text parts are supported", param="messages"
                )
        return "".join(parts)
    raise ApiError(f"messages[{index}].content must be a string or a list", param="messages")


def _chat_ids(em: Emulator, messages: object) -> list[int]:
    if not isinstance(messages, list) or not messages:
        raise ApiError("messages must be a non-empty list", param="messages")
    rendered: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(f"messages[{i}] must be an object with a role", param="messages")
        rendered.append({"role": m["role"], "content": _message_text(m.get("content"), i)})
    return em.tokenizer.render_chat(rendered)


def parse(em: Emulator, body: Mapping[str, Any], *, chat: bool) -> Parsed:
    """Validate a completions (or chat) body into a :class:`Parsed` request."""
    _check_model(em, body)
    if chat:
        ids = _chat_ids(em, body.get("messages"))
        max_tokens = _opt_int(body, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = _opt_int(body, "max_tokens")
    else:
        if "prompt" not in body:
            raise ApiError("prompt is required", param="prompt")
        ids = _prompt_ids(em, body["prompt"])
        max_tokens = _opt_int(body, "max_tokens")
        if _opt_bool(body, "echo"):
            raise ApiError("echo is not supported by the emulator", param="echo")
    if not ids:
        raise ApiError("the prompt is empty", param="messages" if chat else "prompt")
    n = _opt_int(body, "n")
    if n is not None and n != 1:
        raise ApiError("the emulator supports only n=1", param="n")
    seed = _opt_int(body, "seed")
    if seed is not None and seed < 0:
        raise ApiError("seed must be >= 0", param="seed")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError("stream_options must be an object", param="stream_options")
    options = options or {}
    kv = body.get("kv_transfer_params")
    if kv is not None and not isinstance(kv, dict):
        raise ApiError("kv_transfer_params must be an object", param="kv_transfer_params")
    return Parsed(
        prompt_ids=ids,
        max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        stream=_opt_bool(body, "stream"),
        include_usage=_opt_bool(options, "include_usage"),
        continuous_usage=_opt_bool(options, "continuous_usage_stats"),
        seed=seed,
        kv_params=kv,
    )


# -- responses -----------------------------------------------------------------------------


def _usage(req: EngineRequest, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": req.prompt_tokens,
        "total_tokens": req.prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": req.cached_tokens},
    }


def _kv_out(em: Emulator, req: EngineRequest, parsed: Parsed) -> dict[str, Any] | None:
    if not parsed.remote_decode:
        return None
    cfg = em.config
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": list(req.final_hashes),
        "remote_engine_id": cfg.engine_id,
        "remote_request_id": req.request_id,
        "remote_host": cfg.host,
        "remote_port": cfg.port,
        "tp_size": 1,
    }


class _Shape:
    """Names and field layout of the completions vs chat responses."""

    def __init__(self, chat: bool, model: str, request_id: str) -> None:
        self.chat = chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"
        self.model = model
        self.created = int(time.time())

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def chunk(self, text: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
            }
            if finish is not None:
                choice["stop_reason"] = None
            return {**self.head(self.chunk_object), "choices": [choice]}
        return {
            **self.head(self.chunk_object),
            "choices": [
                {
                    "index": 0,
                    "text": text or "",
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                }
            ],
        }

    def full(self, text: str, finish: str | None) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "refusal": None,
                    "tool_calls": [],
                    "reasoning_content": None,
                },
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
            return {**self.head("chat.completion"), "choices": [choice]}
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
            "prompt_logprobs": None,
        }
        return {**self.head("text_completion"), "choices": [choice]}


def _sse(obj: object) -> bytes:
    return b"data: " + _JSON.encode(obj) + b"\n\n"


class SseResponse(Response):
    """A ``text/event-stream`` response written straight to the ASGI ``send`` (Starlette's
    StreamingResponse costs a task group per response). A watcher task waits for the
    client's ``http.disconnect`` and then calls ``on_close``, which aborts the request if it
    is still running (ending ``chunks``); ``on_close`` is called again however the response
    ends, so a cancelled response never leaves its request running."""

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncGenerator[bytes, None], on_close: Callable[[], None]) -> None:
        # No Response.__init__: it would add "content-length: 0".
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
        ]
        self.chunks = chunks
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            self.on_close()

        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            await self.chunks.aclose()
            self.on_close()


async def _stream(
    req: EngineRequest,
    queue: asyncio.Queue[TokenOutput | None],
    parsed: Parsed,
    shape: _Shape,
) -> AsyncGenerator[bytes, None]:
    """The SSE chunks of one request; stops quietly if the request is aborted."""
    if shape.chat:
        yield _sse(shape.chunk(None, None, first=True))
    while True:
        out = await queue.get()
        if out is None:
            return
        done = out.finished
        chunk = shape.chunk(req.out_texts[out.index], req.finish_reason if done else None)
        if parsed.continuous_usage:
            chunk["usage"] = _usage(req, out.index + 1)
        yield _sse(chunk)
        if done:
            break
    if parsed.include_usage:
        usage = {**shape.head(shape.chunk_object), "choices": [], "usage": _usage(req, req.emitted)}
        yield _sse(usage)
    yield _DONE


async def _generate(em: Emulator, request: Request, *, chat: bool) -> Response:
    body = await _json_body(request)
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
    shape = _Shape(chat, em.config.model_name, req.request_id)
    if parsed.stream:
        return SseResponse(_stream(req, queue, parsed, shape), lambda: em.loop.abort(req))
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
    result = shape.full("".join(req.out_texts[: req.emitted]), req.finish_reason)
    result["usage"] = _usage(req, req.emitted)
    if chat:
        result["prompt_logprobs"] = None
    result["kv_transfer_params"] = _kv_out(em, req, parsed)
    return Response(_JSON.encode(result), media_type="application/json")


# -- the app -------------------------------------------------------------------------------


def build_app(em: Emulator) -> Starlette:
    """The Starlette app serving ``em``; its lifespan runs the engine."""

    async def completions(request: Request) -> Response:
        return await _generate(em, request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await _generate(em, request, chat=True)

    async def models(request: Request) -> Response:
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
        return JSONResponse({"object": "list", "data": [card]})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def version(request: Request) -> Response:
        return JSONResponse({"version": EMULATED_VLLM_VERSION})

    async def prometheus(request: Request) -> Response:
        text = metrics.render(
            em.core,
            model_name=em.config.model_name,
            publisher=em.publisher.stats if em.publisher is not None else None,
        )
        return Response(text, media_type=metrics.CONTENT_TYPE)

    async def reset_prefix_cache(request: Request) -> Response:
        if not em.loop.reset_prefix_cache():
            raise ApiError("requests are running; the prefix cache was not reset", status=409)
        await em.loop.flush_events()
        return Response(status_code=200)

    async def info(request: Request) -> Response:
        cfg = em.config
        return JSONResponse(
            {
                "engine_id": cfg.engine_id,
                "model": cfg.model_name,
                "role": cfg.role.value,
                "preset": cfg.preset,
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

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc.message, exc.status, exc.param, exc.kind)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error_response(str(exc.detail), exc.status_code)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with em.running():
            yield

    handlers: dict[Any, Callable[[Request, Exception], Any]] = {
        ApiError: on_api_error,
        HTTPException: on_http_error,
    }
    return Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/version", version, methods=["GET"]),
            Route("/metrics", prometheus, methods=["GET"]),
            Route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"]),
            Route("/emulator/info", info, methods=["GET"]),
        ],
        exception_handlers=handlers,
        lifespan=lifespan,
    )
