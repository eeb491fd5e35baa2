"""A lean HTTP/1.1 server: ``asyncio.Protocol`` + ``httptools``, keep-alive, pipelining,
chunked streaming, bounded bodies, graceful shutdown.

Why not uvicorn + Starlette: the gateway relays every token of every stream, and the ASGI
layers (message dicts, middleware stack, ``receive``/``send`` coroutines, a task group per
streamed response) cost more CPU per request than the scheduling decision itself
(``bench/gateway_load.py``; docs/gateway.md has the profile). This server calls the
application with a :class:`~conductor.web.messages.Request` whose body is read, and writes
the :class:`~conductor.web.messages.Response` or streams the
:class:`~conductor.web.messages.StreamResponse` it returns.

Semantics a client can rely on:

- HTTP/1.1 keep-alive (HTTP/1.0 only with ``Connection: keep-alive``), pipelined requests
  answered in order, ``Expect: 100-continue``, chunked request bodies, ``HEAD``.
- A body over ``max_body_bytes`` gets 413 (at once when ``Content-Length`` says so) and the
  connection is closed; a malformed request gets 400 and the connection is closed.
- When the client goes away, the task handling its request is cancelled (an upstream call
  it waits on is abandoned) and a stream's ``on_close`` runs.
- An exception escaping the application is logged and answered with 500.
- :meth:`HttpServer.shutdown` stops accepting, closes idle connections, lets requests in
  progress finish for a grace period, then cancels them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any, cast

import httptools

from conductor.web.messages import (
    AnyResponse,
    Request,
    Response,
    StreamResponse,
    header_lines,
    status_line,
)
from conductor.web.router import ErrorFactory, plain_error

log = logging.getLogger(__name__)

App = Callable[[Request], Awaitable[AnyResponse]]
DEFAULT_MAX_BODY_BYTES = 1 << 20
KEEP_ALIVE_S = 75.0
"""Idle keep-alive connections are closed after this long (longer than common clients'
pool idle times, so they close first)."""
MAX_PIPELINED = 64
"""Reading pauses while this many pipelined requests wait for their turn."""
SERVER_HEADER = b"server: conductor\r\n"


class _DateHeader:
    """``date: ...\\r\\n``, recomputed at most once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._line = b""

    def line(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            stamp = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(now))
            self._line = f"date: {stamp}\r\n".encode("latin-1")
        return self._line


class _ClientGone(Exception):
    """The connection closed while a response was being written."""


class HttpProtocol(asyncio.Protocol):
    """One client connection."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.app = server.app
        self.loop = server.loop
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.body_size = 0
        self.too_large = False
        self.declared_size: int | None = None
        self.pending: deque[Request] = deque()
        self.keep_alive: deque[bool] = deque()
        self.task: asyncio.Task[None] | None = None
        self.write_paused = False
        self.drain_waiter: asyncio.Future[None] | None = None
        self.reading_paused = False
        self.idle_timer: asyncio.TimerHandle | None = None
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.closed = False
        self.final_error: tuple[int, str] | None = None
        self.broken = False
        """No more requests are read (a parse error, an oversize body, an upgrade)."""

    # -- connection events ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = self.transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.connections.add(self)
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self._disarm_idle()
        self.pending.clear()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self._wake_writer()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_writer()

    def _wake_writer(self) -> None:
        waiter, self.drain_waiter = self.drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.broken:
            return
        self._disarm_idle()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # An Upgrade we do not speak: answer the request as plain HTTP/1.1, then close.
            self.broken = True
        except httptools.HttpParserError as exc:
            self._reject(400, f"malformed HTTP request: {exc}")
            return
        if self.task is None and not self.pending and not self.closed:
            self._arm_idle()

    # -- parser callbacks -----------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.body = []
        self.body_size = 0

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = self.headers.get(key)
        self.headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        if self.broken:
            return
        declared = self.headers.get("content-length")
        expects = self.headers.get("expect", "").lower() == "100-continue"
        if (
            declared is not None
            and declared.isdigit()
            and int(declared) > self.server.max_body_bytes
        ):
            self.too_large = True
            self.declared_size = int(declared)
            if expects:  # the client waits for our word before sending the body: refuse now
                self._reject(413, self._too_large_message())
            return
        if expects and self.task is None:  # (not in the middle of an earlier answer)
            self._write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _too_large_message(self) -> str:
        limit = self.server.max_body_bytes
        if self.declared_size is not None:
            return f"request body of {self.declared_size} bytes exceeds the limit of {limit}"
        return f"request body exceeds the limit of {limit} bytes"

    def on_body(self, body: bytes) -> None:
        if self.too_large:
            return
        self.body_size += len(body)
        if self.body_size > self.server.max_body_bytes:
            self.too_large = True
            self.body = []
            return
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.broken:
            return
        if self.too_large:  # the body was read and dropped, so the client sees the answer
            self._reject(413, self._too_large_message())
            return
        parsed = httptools.parse_url(self.url)
        path = parsed.path.decode("latin-1")
        query = parsed.query.decode("latin-1") if parsed.query else ""
        method = self.parser.get_method().decode("ascii")
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        request = Request(method, path, query, self.headers, body)
        keep = self.parser.should_keep_alive() and not self.server.stopping
        if self.task is None:
            self.task = self.loop.create_task(self._serve(request, keep))
        else:
            self.pending.append(request)
            self.keep_alive.append(keep)
            if len(self.pending) >= MAX_PIPELINED and self.transport and not self.reading_paused:
                self.reading_paused = True
                self.transport.pause_reading()

    # -- output ---------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        """Queues ``data``; everything queued while the loop runs the current callbacks leaves
        in one send (on loopback each send also runs the receiver's network stack, so a
        streamed answer whose pieces are ready together costs one send, not one per piece)."""
        self.out.append(data)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        out = self.out
        if not out:
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def _close(self) -> None:
        """Sends what is queued, then closes."""
        self._flush()
        if self.transport is not None:
            self.transport.close()

    # -- answering ------------------------------------------------------------------------
    def _reject(self, status: int, message: str) -> None:
        """An error answer to a request we will not hand to the application; the connection
        reads nothing more and closes after it (requests before it are answered first)."""
        self.broken = True
        self.final_error = (status, message)
        if self.task is None:
            self._finish()

    def _finish(self) -> None:
        """Writes the pending error answer, if any, and closes the connection."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.final_error is not None:
            status, message = self.final_error
            self.final_error = None
            response = self.server.error(status, message, None)
            self._write(self._head(response, len(response.body), False) + response.body)
        self._close()

    def _head(self, response: Response | StreamResponse, length: int | None, keep: bool) -> bytes:
        parts = [status_line(response.status), SERVER_HEADER, self.server.date.line()]
        if response.media_type is not None:
            parts.append(b"content-type: %s\r\n" % response.media_type.encode("latin-1"))
        if response.headers:
            parts.append(header_lines(response.headers))
        if length is None:
            parts.append(b"transfer-encoding: chunked\r\n")
        else:
            parts.append(b"content-length: %d\r\n" % length)
        parts.append(b"\r\n" if keep else b"connection: close\r\n\r\n")
        return b"".join(parts)

    async def _serve(self, request: Request, keep: bool) -> None:
        while True:
            keep = await self._answer(request, keep)
            if self.closed:
                return
            if keep and self.pending:
                request, keep = self.pending.popleft(), self.keep_alive.popleft()
                if self.reading_paused and len(self.pending) < MAX_PIPELINED // 2:
                    self.reading_paused = False
                    assert self.transport is not None
                    self.transport.resume_reading()
                continue
            self.task = None
            if not keep or self.broken:
                self._finish()
            else:
                self._arm_idle()
            return

    def _cancelled_by_us(self) -> bool:
        """Whether a cancellation came from us (the client left, the server stops); it is
        then consumed: the task ends normally."""
        if self.closed or self.server.stopping:
            _uncancel()
            return True
        return False

    async def _answer(self, request: Request, keep: bool) -> bool:
        """Runs the application and writes its answer; whether the connection stays open."""
        try:
            response = await self.app(request)
        except asyncio.CancelledError:
            if self._cancelled_by_us():
                return False
            raise
        except Exception:
            log.exception("unhandled error answering %s %s", request.method, request.path)
            response = self.server.error(500, "internal server error", None)
        transport = self.transport
        assert transport is not None
        if self.closed or transport.is_closing():
            if isinstance(response, StreamResponse):
                await _close_stream(response)
            return False
        head_only = request.method == "HEAD"
        if isinstance(response, Response):
            body = response.body
            try:
                head = self._head(response, len(body), keep)
            except ValueError:
                log.exception("bad response headers for %s %s", request.method, request.path)
                response = self.server.error(500, "internal server error", None)
                body = response.body
                head = self._head(response, len(body), keep)
            self._write(head if head_only else head + body)
            return keep
        return await self._stream(response, keep, head_only)

    async def _stream(self, response: StreamResponse, keep: bool, head_only: bool) -> bool:
        transport = self.transport
        assert transport is not None
        try:
            try:
                self._write(self._head(response, None, keep))
            except ValueError:
                log.exception("bad stream response headers")
                self._close()
                return False
            if head_only:  # the head says chunked; a HEAD answer carries no body at all
                return keep
            async for chunk in response.body:
                if not chunk:
                    continue
                if self.closed or transport.is_closing():
                    raise _ClientGone
                self._write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                if self.write_paused:
                    await self._drain()
            if self.closed or transport.is_closing():
                return False
            self._write(b"0\r\n\r\n")
            return keep
        except _ClientGone:
            return False
        except asyncio.CancelledError:
            if self._cancelled_by_us():
                return False
            raise
        except Exception:
            # headers are out: all we can do is end the connection without the last chunk,
            # so the client sees an incomplete body instead of a truncated "complete" one
            log.exception("stream body failed")
            self._close()
            return False
        finally:
            await _close_stream(response)

    async def _drain(self) -> None:
        if self.closed:
            raise _ClientGone
        waiter = self.loop.create_future()
        self.drain_waiter = waiter
        await waiter
        if self.closed:
            raise _ClientGone

    # -- keep-alive -----------------------------------------------------------------------
    def _arm_idle(self) -> None:
        self._disarm_idle()
        self.idle_timer = self.loop.call_later(self.server.keep_alive_s, self._idle_close)

    def _disarm_idle(self) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None

    def _idle_close(self) -> None:
        self.idle_timer = None
        if self.task is None and not self.pending and self.transport is not None:
            self._close()

    def close_if_idle(self) -> bool:
        if self.task is None and self.transport is not None:
            self._close()
            return True
        return False


def _uncancel() -> None:
    """We stop the task on purpose (the client left): the cancellation is consumed."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


async def _close_stream(response: StreamResponse) -> None:
    """Closes the body iterator and runs ``on_close``. Runs after the reason to stop (a
    cancellation included) was delivered; asyncio does not cancel the awaits that follow."""
    aclose = getattr(response.body, "aclose", None)
    try:
        if aclose is not None:
            await aclose()
    except asyncio.CancelledError:
        pass  # cancelled again while closing: on_close still runs
    except Exception as exc:
        log.warning("closing a stream body failed: %r", exc)
    if response.on_close is not None:
        try:
            await response.on_close()
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("a stream's on_close failed")


class HttpServer:
    """Serves ``app`` on one listening socket in the running loop."""

    def __init__(
        self,
        app: App,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        keep_alive_s: float = KEEP_ALIVE_S,
        error: ErrorFactory = plain_error,
    ) -> None:
        if max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be > 0, got {max_body_bytes}")
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.keep_alive_s = keep_alive_s
        self.error = error
        self.date = _DateHeader()
        self.connections: set[HttpProtocol] = set()
        self.stopping = False
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the server is not started"
        return self._loop

    async def start(
        self, host: str = "127.0.0.1", port: int = 0, *, sock: socket.socket | None = None
    ) -> None:
        self._loop = asyncio.get_running_loop()
        if sock is not None:
            self._server = await self._loop.create_server(
                lambda: HttpProtocol(self), sock=sock, backlog=2048
            )
        else:
            self._server = await self._loop.create_server(
                lambda: HttpProtocol(self), host=host, port=port, backlog=2048, reuse_address=True
            )

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Stops accepting; requests in progress get ``grace_s`` to finish, then are cut."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + grace_s
        while True:
            busy = [c for c in list(self.connections) if not c.close_if_idle()]
            if not busy or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            if conn.task is not None and not conn.task.done():
                conn.task.cancel()
            if conn.transport is not None:
                conn._close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=1.0)


async def serve_until_stopped(
    server: HttpServer,
    *,
    host: str,
    port: int,
    lifespan: AbstractAsyncContextManager[Any] | None = None,
    stop: asyncio.Event | None = None,
    grace_s: float = 10.0,
    on_ready: Callable[[HttpServer], None] | None = None,
) -> None:
    """Runs ``lifespan`` (entered before listening), serves until ``stop`` is set or
    SIGINT/SIGTERM arrives, then shuts down gracefully."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    try:
        async with contextlib.AsyncExitStack() as stack:
            if lifespan is not None:
                await stack.enter_async_context(lifespan)
            await server.start(host, port)
            if on_ready is not None:
                on_ready(server)
            try:
                await stop.wait()
            finally:
                await server.shutdown(grace_s)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Runs ``main()`` on uvloop when it is installed, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        asyncio.run(main())
        return
    uvloop.run(main())


@contextlib.asynccontextmanager
async def running(
    app: App,
    *,
    sock: socket.socket | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    error: ErrorFactory = plain_error,
    lifespan: AbstractAsyncContextManager[Any] | None = None,
    grace_s: float = 2.0,
) -> AsyncIterator[HttpServer]:
    """``app`` served in this loop for the duration of the block (tests, embedding)."""
    server = HttpServer(app, max_body_bytes=max_body_bytes, error=error)
    async with contextlib.AsyncExitStack() as stack:
        if lifespan is not None:
            await stack.enter_async_context(lifespan)
        await server.start(host, port, sock=sock)
        try:
            yield server
        finally:
            await server.shutdown(grace_s)
