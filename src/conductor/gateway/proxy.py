"""Upstream legs: open a call to an engine, relay its answer, and classify failures.

A failure *before the client was sent anything* (connection refused or reset before or
after the response headers, a stream that breaks before its first body byte) raises
:class:`NotStarted`: the caller may schedule the request again elsewhere (the client saw
nothing). A timeout is not a failure of the engine (a busy engine is slow, not dead): its
``reason`` is ``timeout`` and the caller fails that request only. A failure after the
first byte reached the client is final: an SSE error event ends the stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping

import httpx

from conductor.gateway import json_codec
from conductor.gateway.errors import UpstreamError, UpstreamTimeout
from conductor.gateway.flight import Flight, Outcome, StreamTokens
from conductor.gateway.stream_tbt import TokenGaps
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


async def read_body(
    resp: UpstreamResponse, flight: Flight, *, deadline: float, engine_id: str = ""
) -> bytes:
    """The whole body of ``resp`` (then closed). A timeout closes the flight and raises
    :class:`UpstreamTimeout`; a broken connection raises :class:`NotStarted` (nothing
    reached the client yet, so the request may go elsewhere)."""
    try:
        async with asyncio.timeout_at(deadline):
            return await resp.aread()
    except TimeoutError:
        flight.close(Outcome.TIMEOUT)
        raise UpstreamTimeout("the engine did not answer in time") from None
    except httpx.TimeoutException as exc:
        flight.close(Outcome.TIMEOUT)
        raise UpstreamTimeout(f"the engine stopped answering: {failure_reason(exc)}") from None
    except _RETRYABLE as exc:
        raise NotStarted(engine_id or flight.plan.prefill, failure_reason(exc)) from exc
    except httpx.HTTPError as exc:
        flight.close(Outcome.UPSTREAM_ERROR)
        raise UpstreamError(f"the engine failed mid-answer: {failure_reason(exc)}") from None
    finally:
        await close_quietly(resp)


async def first_chunk(
    resp: UpstreamResponse, engine_id: str, *, deadline: float
) -> tuple[bytes, AsyncIterator[bytes]]:
    """The stream's first body bytes and the rest of its chunks: the request is committed to
    this engine only once it produced something (vLLM sends a stream's headers at once, so a
    death before the first token would otherwise lose the request). :class:`NotStarted` if
    the connection breaks (or the stream ends) first; the response is then closed."""
    chunks = resp.chunks(deadline).__aiter__()
    try:
        while True:
            chunk = await anext(chunks)
            if chunk:
                return chunk, chunks
    except StopAsyncIteration:
        await close_quietly(resp)
        raise NotStarted(engine_id, "empty_stream") from None
    except httpx.TimeoutException as exc:
        await close_quietly(resp)
        raise NotStarted(engine_id, "timeout") from exc
    except _RETRYABLE as exc:
        await close_quietly(resp)
        raise NotStarted(engine_id, failure_reason(exc)) from exc
    except BaseException:
        await close_quietly(resp)
        raise


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
    first: tuple[bytes, AsyncIterator[bytes]] | None = None,
) -> StreamResponse:
    """The engine's SSE stream relayed to the client. The flight always ends and the upstream
    response is always closed, also when the client goes away before or while the body
    streams (the server then cancels the sending and runs ``on_close``)."""

    async def on_close() -> None:
        flight.close(Outcome.CLIENT_DISCONNECT)  # no-op if the relay closed it
        await close_quietly(upstream)

    body = relay(upstream, flight, deadline=deadline, first=first)
    return StreamResponse(body, 200, headers, "text/event-stream", on_close)


async def _chained(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for chunk in rest:
        yield chunk


async def relay(
    resp: UpstreamResponse,
    flight: Flight,
    *,
    deadline: float,
    first: tuple[bytes, AsyncIterator[bytes]] | None = None,
) -> AsyncGenerator[bytes, None]:
    """Pass the engine's SSE bytes through (``first``: the bytes already read and the rest
    of the chunks, see :func:`first_chunk`); the first bytes mark the first token. A broken
    or stalled stream ends with an SSE error event and ``[DONE]``.

    Bookkeeping that the client need not wait for (the first token's and the end's effects
    on the scheduler and the metrics) runs on the loop's next pass, after the bytes left."""
    loop = asyncio.get_running_loop()
    at_boundary = True
    error: bytes | None = None
    counted = StreamTokens()
    gaps = flight.token_gaps = TokenGaps()
    clock = flight.clock
    chunks = resp.chunks(deadline) if first is None else _chained(*first)
    try:
        async for chunk in chunks:
            if chunk:
                seen_s = clock()
                gaps.mark(seen_s, counted.feed(chunk))
                flight.output_tokens = counted.tokens
                at_boundary = chunk.endswith(b"\n\n")
                first_token = not flight.first_token_seen
                yield chunk
                if first_token:
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
