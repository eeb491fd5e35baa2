"""Upstream legs: open a call to an engine, relay its answer, and classify failures.

A failure *before the engine answered with response headers* (connection refused, reset,
timed out) raises :class:`NotStarted`: the engine did not start the request, so the caller
may schedule it again elsewhere. A failure after that (a broken stream) is final: the
client gets an error response, or an SSE error event if streaming had begun.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Mapping

import httpx

from conductor.gateway import json_codec
from conductor.gateway.errors import UpstreamError, UpstreamTimeout
from conductor.gateway.flight import Flight, Outcome, StreamTokens
from conductor.gateway.upstream import Upstream, UpstreamResponse
from conductor.web.errors import error_body
from conductor.web.messages import Response, StreamResponse

log = logging.getLogger(__name__)

_RETRYABLE = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.ReadError,
    httpx.ReadTimeout,
    httpx.WriteError,
    httpx.WriteTimeout,
    httpx.RemoteProtocolError,
)


class NotStarted(Exception):
    """The engine did not start the request (no response headers): retry elsewhere.
    ``engine_at_fault`` is False when the cause is ours (our connection pool was full)."""

    def __init__(self, engine_id: str, reason: str) -> None:
        super().__init__(f"engine {engine_id} did not start the request: {reason}")
        self.engine_id = engine_id
        self.reason = reason
        self.engine_at_fault = reason != "pool_timeout"


def failure_reason(exc: BaseException) -> str:
    """A short label for metrics: connect_error, timeout, protocol_error, read_error, ..."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return "connect_error"
    if isinstance(exc, httpx.PoolTimeout):
        return "pool_timeout"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "protocol_error"
    if isinstance(exc, httpx.NetworkError):
        return "network_error"
    return type(exc).__name__


def encode_body(body: Mapping[str, object]) -> bytes:
    """Compact UTF-8 JSON for an engine (the body came from strict JSON: no NaN)."""
    return bytes(json_codec.encode(body))


async def open_upstream(
    client: Upstream,
    engine_id: str,
    url: str,
    body: Mapping[str, object],
    *,
    deadline: float,
    headers: Mapping[str, str] | None = None,
) -> UpstreamResponse:
    """POST ``body`` and return once response headers arrived (the body is left to read).
    Raises :class:`NotStarted` or, when the request's deadline passes, ``TimeoutError``."""
    content = encode_body(body)
    try:
        return await client.post(url, content, headers, deadline)
    except _RETRYABLE as exc:
        raise NotStarted(engine_id, failure_reason(exc)) from exc


async def close_quietly(resp: UpstreamResponse) -> None:
    """Close ``resp``. Called from cleanup code after a cancellation was delivered: asyncio
    does not cancel the awaits that follow."""
    try:
        await resp.aclose()
    except (httpx.HTTPError, OSError) as exc:
        log.debug("closing upstream response: %r", exc)


async def read_body(resp: UpstreamResponse, flight: Flight, *, deadline: float) -> bytes:
    """The whole body of ``resp`` (then closed); on failure the flight is closed and an
    :class:`UpstreamError` or :class:`UpstreamTimeout` raised."""
    try:
        async with asyncio.timeout_at(deadline):
            return await resp.aread()
    except TimeoutError:
        flight.close(Outcome.TIMEOUT)
        raise UpstreamTimeout("the engine did not answer in time") from None
    except httpx.TimeoutException as exc:
        flight.close(Outcome.TIMEOUT)
        raise UpstreamTimeout(f"the engine stopped answering: {failure_reason(exc)}") from None
    except httpx.HTTPError as exc:
        flight.close(Outcome.UPSTREAM_ERROR)
        raise UpstreamError(f"the engine failed mid-answer: {failure_reason(exc)}") from None
    finally:
        await close_quietly(resp)


def passthrough(status: int, content: bytes, headers: Mapping[str, str]) -> Response:
    """An engine's error answer, as is when it is JSON, else wrapped in our error shape."""
    try:
        json.loads(content)
    except ValueError:
        text = content.decode(errors="replace")[:500] or f"engine answered {status}"
        content = json.dumps(error_body(status, text, "upstream_error")).encode()
    return Response(content, status, headers, "application/json")


def sse_error(message: str, status: int, error_type: str) -> bytes:
    payload = json.dumps(error_body(status, message, error_type))
    return f"data: {payload}\n\ndata: [DONE]\n\n".encode()


def tracked_stream(
    flight: Flight,
    upstream: UpstreamResponse,
    *,
    deadline: float,
    headers: Mapping[str, str],
) -> StreamResponse:
    """The engine's SSE stream relayed to the client. The flight always ends and the upstream
    response is always closed, also when the client goes away before or while the body
    streams (the server then cancels the sending and runs ``on_close``)."""

    async def on_close() -> None:
        flight.close(Outcome.CLIENT_DISCONNECT)  # no-op if the relay closed it
        await close_quietly(upstream)

    body = relay(upstream, flight, deadline=deadline)
    return StreamResponse(body, 200, headers, "text/event-stream", on_close)


async def relay(
    resp: UpstreamResponse, flight: Flight, *, deadline: float
) -> AsyncGenerator[bytes, None]:
    """Pass the engine's SSE bytes through; the first bytes mark the first token. A broken
    or stalled stream ends with an SSE error event and ``[DONE]``.

    Bookkeeping that the client need not wait for (the first token's and the end's effects
    on the scheduler and the metrics) runs on the loop's next pass, after the bytes left."""
    loop = asyncio.get_running_loop()
    at_boundary = True
    error: bytes | None = None
    counted = StreamTokens()
    try:
        async for chunk in resp.chunks(deadline):
            if chunk:
                counted.feed(chunk)
                flight.output_tokens = counted.tokens
                at_boundary = chunk.endswith(b"\n\n")
                if flight.first_token_seen:
                    yield chunk
                else:
                    seen_s = flight.clock()
                    yield chunk
                    loop.call_soon(flight.first_token, seen_s)
        flight.close(Outcome.COMPLETED, soon=loop)
    except (TimeoutError, httpx.TimeoutException):
        flight.close(Outcome.TIMEOUT)
        error = sse_error("the engine stopped streaming in time", 504, "upstream_timeout")
    except httpx.HTTPError as exc:
        flight.close(Outcome.UPSTREAM_ERROR)
        log.warning("request %s: stream broke: %s", flight.request_id, failure_reason(exc))
        error = sse_error(
            f"the engine failed mid-stream ({failure_reason(exc)})", 502, "upstream_error"
        )
    finally:
        flight.close(Outcome.CLIENT_DISCONNECT)  # cancelled or closed early: no-op otherwise
    if error is not None:
        yield error if at_boundary else b"\n\n" + error


def upstream_body(body: Mapping[str, object], model: str) -> dict[str, object]:
    """The client's body for an engine, under the engine's model name."""
    out = dict(body)
    out["model"] = model
    return out
