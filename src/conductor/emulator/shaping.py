"""What the emulator's responses look like: vLLM's completions and chat bodies, their SSE
chunks (one event per token, the last token's event, the usage event and ``data: [DONE]`` in
one piece) and the prefill leg's ``kv_transfer_params``."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import msgspec

from conductor.emulator.config import EmulatorConfig
from conductor.emulator.engine import EngineRequest
from conductor.emulator.loop import TokenQueue
from conductor.emulator.parsing import Parsed

SSE_HEADERS = {"cache-control": "no-cache"}
SSE_TYPE = "text/event-stream; charset=utf-8"
_JSON = msgspec.json.Encoder()
_DONE = b"data: [DONE]\n\n"


def usage(req: EngineRequest, completion_tokens: int) -> dict[str, Any]:
    """The ``usage`` object after ``completion_tokens`` tokens."""
    return {
        "prompt_tokens": req.prompt_tokens,
        "total_tokens": req.prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": req.cached_tokens},
    }


def kv_transfer_out(
    cfg: EmulatorConfig, req: EngineRequest, parsed: Parsed
) -> dict[str, Any] | None:
    """A prefill leg's answer for the decode engine (vLLM's NIXL connector's fields); None
    for any other request."""
    if not parsed.remote_decode:
        return None
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


class Shape:
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
        """``sse(self.chunk(text, None))``: the event of a token that does not finish the
        completion, spliced into a template of the request's chunk (the JSON of ``text``
        where the template has the JSON of a marker string; same bytes, less work)."""
        template = self._token_template
        if template is None:
            parts = sse(self.chunk(_TEXT_MARK, None)).split(_TEXT_MARK_JSON)
            if len(parts) != 2:  # the marker in the model name? no template then
                return sse(self.chunk(text, None))
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


def sse(obj: object) -> bytes:
    """One server-sent event holding ``obj`` as JSON."""
    return b"data: " + _JSON.encode(obj) + b"\n\n"


async def stream_events(
    req: EngineRequest,
    queue: TokenQueue,
    parsed: Parsed,
    shape: Shape,
) -> AsyncGenerator[bytes, None]:
    """The SSE events of one request, one piece per token (the last token's event, the
    usage event and ``[DONE]`` in one); stops quietly if the request is aborted."""
    if shape.chat:
        yield sse(shape.chunk(None, None, first=True))
    continuous = parsed.continuous_usage
    while True:
        out = await queue.get()
        if out is None:
            return
        text = req.out_texts[out.index]
        if not out.finished:
            if continuous:
                chunk = shape.chunk(text, None)
                chunk["usage"] = usage(req, out.index + 1)
                yield sse(chunk)
            else:
                yield shape.token_event(text)
            continue
        chunk = shape.chunk(text, req.finish_reason)
        if continuous:
            chunk["usage"] = usage(req, out.index + 1)
        last = [sse(chunk)]
        if parsed.include_usage:
            total = usage(req, req.emitted)
            last.append(sse({**shape.head(shape.chunk_object), "choices": [], "usage": total}))
        last.append(_DONE)
        yield b"".join(last)
        return


class SseBody:
    """A streamed response's body: the events of :func:`stream_events`. Closing it (the server
    always does, however the response ended, the client going away included) aborts the
    request if it still runs (a no-op once it finished). Doing that here rather than in an
    ``on_close`` spares the server a second shielded task per response."""

    __slots__ = ("_abort", "_events")

    def __init__(self, events: AsyncGenerator[bytes, None], abort: Callable[[], None]) -> None:
        self._events = events
        self._abort = abort

    def __aiter__(self) -> SseBody:
        return self

    def __anext__(self) -> Awaitable[bytes]:
        return self._events.__anext__()

    async def aclose(self) -> None:
        try:
            await self._events.aclose()
        finally:
            self._abort()


def full_body(shape: Shape, req: EngineRequest, kv_params: dict[str, Any] | None) -> bytes:
    """The JSON body of a finished non-streamed request."""
    result = shape.full("".join(req.out_texts[: req.emitted]), req.finish_reason)
    result["usage"] = usage(req, req.emitted)
    if shape.chat:
        result["prompt_logprobs"] = None
    result["kv_transfer_params"] = kv_params
    return _JSON.encode(result)
