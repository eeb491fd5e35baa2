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

Errors are JSON ``{"error": {"message", "type", "param", "code"}}`` with a 4xx status
(:func:`error_factory` words the server's own: 404, 405, 413, 400 for malformed HTTP, 500).

Served by :mod:`conductor.web` (:mod:`conductor.emulator.server`); :meth:`Emulator.running
<conductor.emulator.service.Emulator.running>` is the lifespan that runs the engine.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from conductor.core.errors import ConductorError, InvalidInput
from conductor.emulator import metrics
from conductor.emulator.engine import EngineRequest
from conductor.emulator.loop import TokenQueue
from conductor.emulator.service import Emulator
from conductor.web.messages import AnyResponse, Request, Response, StreamResponse, json_response
from conductor.web.router import Router

DEFAULT_MAX_TOKENS = 16
MAX_BODY_BYTES = 32 * 1024 * 1024
"""Larger request bodies get 413 (the server's ``max_body_bytes``)."""
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


def error_response(
    message: str,
    status: int,
    param: str | None = None,
    kind: str = "",
    headers: Mapping[str, str] | None = None,
) -> Response:
    body = {
        "error": {
            "message": message,
            "type": kind or _ERROR_TYPES.get(status, "BadRequestError"),
            "param": param,
            "code": status,
        }
    }
    return Response(_JSON.encode(body), status, headers, "application/json")


def error_factory(status: int, message: str, headers: Mapping[str, str] | None) -> Response:
    """The server's and the router's errors (404, 405, 413, ...) in the API's JSON shape."""
    return error_response(message, status, headers=headers)


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


def _json_body(request: Request) -> dict[str, Any]:
    """The body as a JSON object (its size is bounded by the server)."""
    try:
        body = msgspec.json.decode(request.body)
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


_TEXT_MARK = "\x00conductor-emulator-token-text\x00"
_TEXT_MARK_JSON = _JSON.encode(_TEXT_MARK)


class _Shape:
    """Names and field layout of the completions vs chat responses."""

    def __init__(self, chat: bool, model: str, request_id: str) -> None:
        self.chat = chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"
        self.model = model
        self.created = int(time.time())
        self._token_template: tuple[bytes, bytes] | None = None

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

    def token_event(self, text: str) -> bytes:
        """``_sse(self.chunk(text, None))``: the event of a token that does not finish the
        completion, spliced into a template of the request's chunk (the JSON of ``text``
        where the template has the JSON of a marker string; same bytes, less work)."""
        template = self._token_template
        if template is None:
            parts = _sse(self.chunk(_TEXT_MARK, None)).split(_TEXT_MARK_JSON)
            if len(parts) != 2:  # the marker in the model name? no template then
                return _sse(self.chunk(text, None))
            template = self._token_template = (parts[0], parts[1])
        return template[0] + _JSON.encode(text) + template[1]

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


async def _stream(
    req: EngineRequest,
    queue: TokenQueue,
    parsed: Parsed,
    shape: _Shape,
) -> AsyncGenerator[bytes, None]:
    """The SSE events of one request, one piece per token (the last token's event, the
    usage event and ``[DONE]`` in one); stops quietly if the request is aborted."""
    if shape.chat:
        yield _sse(shape.chunk(None, None, first=True))
    continuous = parsed.continuous_usage
    while True:
        out = await queue.get()
        if out is None:
            return
        text = req.out_texts[out.index]
        if not out.finished:
            if continuous:
                chunk = shape.chunk(text, None)
                chunk["usage"] = _usage(req, out.index + 1)
                yield _sse(chunk)
            else:
                yield shape.token_event(text)
            continue
        chunk = shape.chunk(text, req.finish_reason)
        if continuous:
            chunk["usage"] = _usage(req, out.index + 1)
        last = [_sse(chunk)]
        if parsed.include_usage:
            usage = _usage(req, req.emitted)
            last.append(_sse({**shape.head(shape.chunk_object), "choices": [], "usage": usage}))
        last.append(_DONE)
        yield b"".join(last)
        return


class _SseBody:
    """A streamed response's body: the events of :func:`_stream`. Closing it (the server
    always does, however the response ended, the client going away included) aborts the
    request if it still runs (a no-op once it finished). Doing that here rather than in an
    ``on_close`` spares the server a second shielded task per response."""

    __slots__ = ("_abort", "_events")

    def __init__(self, events: AsyncGenerator[bytes, None], abort: Callable[[], None]) -> None:
        self._events = events
        self._abort = abort

    def __aiter__(self) -> _SseBody:
        return self

    def __anext__(self) -> Awaitable[bytes]:
        return self._events.__anext__()

    async def aclose(self) -> None:
        try:
            await self._events.aclose()
        finally:
            self._abort()


_SSE_HEADERS = {"cache-control": "no-cache"}
_SSE_TYPE = "text/event-stream; charset=utf-8"


async def _generate(em: Emulator, request: Request, *, chat: bool) -> AnyResponse:
    body = _json_body(request)
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
        events = _SseBody(_stream(req, queue, parsed, shape), lambda: em.loop.abort(req))
        return StreamResponse(events, 200, _SSE_HEADERS, _SSE_TYPE)
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
    return Response(_JSON.encode(result), 200, None, "application/json")


# -- the app -------------------------------------------------------------------------------

_Endpoint = Callable[[Request], Awaitable[AnyResponse]]


def _answering_api_errors(endpoint: _Endpoint) -> _Endpoint:
    async def handler(request: Request) -> AnyResponse:
        try:
            return await endpoint(request)
        except ApiError as exc:
            return error_response(exc.message, exc.status, exc.param, exc.kind)

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
