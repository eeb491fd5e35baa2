"""A small :mod:`conductor.web` app that answers like a vLLM OpenAI server, for gateway tests.

It records every generation request, streams SSE chunks (``chunk_delay_s`` apart), answers
``/health`` and ``/metrics`` (vLLM gauge names), and can misbehave on demand: ``health_status``
503, ``hang`` (never answer), ``break_after`` (drop the connection after N chunks),
``status`` (answer an error). ``disconnects`` counts streams the client abandoned.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from conductor.web.messages import AnyResponse, Request, Response, StreamResponse, json_response
from conductor.web.router import Router


class BrokenStream(Exception):
    """Raised inside a streaming body: the server drops the connection mid-response."""


@dataclass
class FakeEngine:
    name: str
    tokens: list[str] = field(default_factory=lambda: ["Hello", " world", "!"])
    chunk_delay_s: float = 0.0
    health_status: int = 200
    status: int = 200
    hang: bool = False
    break_after: int | None = None
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    kv_transfer_params: dict[str, object] | None = None
    requests: list[dict[str, object]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    disconnects: int = 0
    completed_streams: int = 0

    def app(self) -> Router:
        router = Router()
        router.add("GET", "/health", self.health)
        router.add("GET", "/metrics", self.metrics)
        router.add("POST", "/v1/completions", self.generate)
        router.add("POST", "/v1/chat/completions", self.generate)
        return router

    async def health(self, request: Request) -> Response:
        return Response(status=self.health_status)

    async def metrics(self, request: Request) -> Response:
        labels = '{engine="0",model_name="tiny"}'
        text = (
            "# HELP vllm:num_requests_running Running requests.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{labels} {self.running}\n"
            "# HELP vllm:num_requests_waiting Waiting requests.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{labels} {self.waiting}\n"
            "# HELP vllm:kv_cache_usage_perc KV usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{labels} {self.kv_usage}\n"
        )
        return Response(text.encode(), media_type="text/plain; charset=utf-8")

    def _usage(self, n: int) -> dict[str, int]:
        return {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}

    async def generate(self, request: Request) -> AnyResponse:
        body = json.loads(request.body)
        self.requests.append(body)
        self.paths.append(request.path)
        if self.hang:
            try:
                await asyncio.Event().wait()  # until the client goes away (then cancelled)
            finally:
                self.disconnects += 1
        if self.status != 200:
            err = {"error": {"message": f"{self.name} refuses", "type": "BadRequestError"}}
            return json_response(err, self.status)
        chat = request.path.endswith("chat/completions")
        max_tokens = body.get("max_tokens") or len(self.tokens)
        tokens = self.tokens[: int(max_tokens)]
        if body.get("stream"):
            return StreamResponse(self._stream(tokens, chat), media_type="text/event-stream")
        text = "".join(tokens)
        choice: dict[str, object] = (
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "length",
            }
            if chat
            else {"index": 0, "text": text, "finish_reason": "length"}
        )
        out: dict[str, object] = {
            "id": f"{self.name}-1",
            "object": "chat.completion" if chat else "text_completion",
            "model": body.get("model"),
            "choices": [choice],
            "usage": self._usage(len(tokens)),
            "served_by": self.name,
        }
        if self.kv_transfer_params is not None:
            out["kv_transfer_params"] = self.kv_transfer_params
        return json_response(out)

    async def _stream(self, tokens: list[str], chat: bool) -> AsyncIterator[bytes]:
        try:
            for i, tok in enumerate(tokens):
                if self.break_after is not None and i >= self.break_after:
                    raise BrokenStream(self.name)
                if self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
                delta: dict[str, object] = (
                    {"delta": {"content": tok}, "index": 0} if chat else {"text": tok, "index": 0}
                )
                chunk = {"id": f"{self.name}-1", "choices": [delta], "served_by": self.name}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            usage = {"id": f"{self.name}-1", "choices": [], "usage": self._usage(len(tokens))}
            yield f"data: {json.dumps(usage)}\n\n".encode()
            yield b"data: [DONE]\n\n"
            self.completed_streams += 1
        except asyncio.CancelledError:
            self.disconnects += 1
            raise
