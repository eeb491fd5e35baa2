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
  connection is closed; a malformed request gets 400 and the connection is closed; the
  head's size, header count, head and body deadlines, keep-alive and the number of
  connections are bounded by :class:`~conductor.web.limits.ServerLimits` (431, 408, 503;
  :mod:`conductor.web.connection` says which answer when). ``counters`` counts each refusal.
- When the client goes away, the task handling its request is cancelled (an upstream call
  it waits on is abandoned) and a stream's ``on_close`` runs.
- An exception escaping the application is logged and answered with 500.
- :meth:`HttpServer.shutdown` stops accepting, closes idle connections, lets requests in
  progress finish for a grace period, then cancels them.

This module is the server's lifecycle (listen, graceful shutdown, run until a signal); a
connection's reading side (framing, pipelining, keep-alive) is :mod:`conductor.web.connection`,
its writing side (heads, streaming, back-pressure) :mod:`conductor.web.responding`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any

from conductor.web.connection import HttpProtocol
from conductor.web.limits import ServerLimits
from conductor.web.messages import AnyResponse, Request
from conductor.web.responding import DateHeader
from conductor.web.router import ErrorFactory, plain_error
from conductor.web.signals import on_stop_signals

App = Callable[[Request], Awaitable[AnyResponse]]
DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_ALLOW = "GET, HEAD, POST, DELETE"
"""The ``Allow`` header of a 405 for ``TRACE`` / ``CONNECT``."""
SHUTDOWN_GRACE_S = 10.0
"""How long requests in progress may run on after a shutdown began."""


class HttpServer:
    """Serves ``app`` on one listening socket in the running loop.

    Invariants: ``connections`` holds every open connection (each adds itself when made and
    removes itself when lost); once ``stopping``, no connection is kept alive after its
    current answer and no new one is accepted."""

    def __init__(
        self,
        app: App,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        limits: ServerLimits | None = None,
        error: ErrorFactory = plain_error,
        allow: str = DEFAULT_ALLOW,
    ) -> None:
        if max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be > 0, got {max_body_bytes}")
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.limits = limits if limits is not None else ServerLimits()
        self.error = error
        self.allow = allow
        self.counters: Counter[str] = Counter()
        """Refusals by reason: refused_connections, head_timeouts, body_timeouts,
        headers_too_large, bad_requests."""
        self.date = DateHeader()
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

    async def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
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
                conn.close()
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
    grace_s: float = SHUTDOWN_GRACE_S,
    on_ready: Callable[[HttpServer], None] | None = None,
    sock: socket.socket | None = None,
) -> None:
    """Runs ``lifespan`` (entered before listening), serves until ``stop`` is set or
    SIGINT/SIGTERM arrives, then shuts down gracefully. ``sock``: an already bound socket
    (e.g. one of several ``SO_REUSEPORT`` workers) instead of ``host``/``port``."""
    stop = stop or asyncio.Event()
    with on_stop_signals(lambda _sig: stop.set()):
        async with contextlib.AsyncExitStack() as stack:
            if lifespan is not None:
                await stack.enter_async_context(lifespan)
            await server.start(host, port, sock=sock)
            if on_ready is not None:
                on_ready(server)
            try:
                await stop.wait()
            finally:
                await server.shutdown(grace_s)


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
    limits: ServerLimits | None = None,
    error: ErrorFactory = plain_error,
    lifespan: AbstractAsyncContextManager[Any] | None = None,
    grace_s: float = 2.0,
) -> AsyncIterator[HttpServer]:
    """``app`` served in this loop for the duration of the block (tests, embedding)."""
    server = HttpServer(app, max_body_bytes=max_body_bytes, limits=limits, error=error)
    async with contextlib.AsyncExitStack() as stack:
        if lifespan is not None:
            await stack.enter_async_context(lifespan)
        await server.start(host, port, sock=sock)
        try:
            yield server
        finally:
            await server.shutdown(grace_s)
