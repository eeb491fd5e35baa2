"""One keep-alive HTTP/1.1 connection of :class:`~conductor.web.client.RawHttpClient` and
the answer read from it.

Each :class:`Connection` is an ``asyncio.Protocol`` feeding ``httptools``' response parser:
body bytes are queued as they arrive and a reader takes everything queued at once (pieces that
arrived together leave together), waiting with one timer instead of a timeout context per
read. Failures raise the httpx exception classes (``ReadTimeout``, ``ReadError``,
``RemoteProtocolError``); :class:`Stale` says a reused connection was closed before any
answer byte (the request may be sent again).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import httptools
import httpx

MAX_BUFFERED_BYTES = 1 << 20
"""Reading from an engine pauses while this much of its answer waits for the client."""


class Stale(Exception):
    """The connection was closed before the engine answered anything."""


class Pool:
    """Connections to one ``host:port``: idle ones kept for reuse, at most ``limit`` open."""

    def __init__(self, host: str, port: int, limit: int, max_idle: int) -> None:
        self.host = host
        self.port = port
        self.idle: list[Connection] = []
        self.max_idle = max_idle
        self.slots = asyncio.Semaphore(limit)
        self.host_header = f"{host}:{port}".encode("latin-1")


class Connection(asyncio.Protocol):
    """One keep-alive connection to an engine; answers one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.response: RawResponse | None = None
        self.head: asyncio.Future[RawResponse] | None = None
        self._headers: dict[str, str] = {}
        self._answered = False
        self._read_timeout_s = 0.0
        self._pool: Pool | None = None

    # -- transport events -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        head, self.head = self.head, None
        if head is not None and not head.done():
            if not self._answered:
                head.set_exception(Stale())
            elif exc is not None:
                head.set_exception(httpx.ReadError(f"reading from the engine: {exc}"))
            else:
                head.set_exception(
                    httpx.RemoteProtocolError("the engine closed the connection mid-head")
                )
        response = self.response
        if response is not None:
            response._connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"bad answer from the engine: {exc}"))

    def _fail(self, error: Exception) -> None:
        head, self.head = self.head, None
        if head is not None and not head.done():
            head.set_exception(error)
        if self.response is not None:
            self.response._error(error)
        self.close()

    # -- parser callbacks -----------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._headers = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = self._headers.get(key)
        self._headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            return  # an interim answer (100 Continue): the real one follows
        head, self.head = self.head, None
        if head is None or head.done() or self._pool is None:
            self.close()  # an answer nobody asked for (or asks any more): drop the connection
            return
        response = RawResponse(self, self._pool, status, self._headers, self._read_timeout_s)
        self.response = response
        head.set_result(response)

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response._feed(body)

    def on_message_complete(self) -> None:
        response = self.response
        if response is not None and response.status_code >= 200:
            keep = self.parser.should_keep_alive()
            self.response = None
            response._complete(keep)

    # -- requests -------------------------------------------------------------------------
    def usable(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def exchange(
        self, pool: Pool, request: bytes, read_timeout_s: float, deadline: float | None
    ) -> RawResponse:
        """Sends ``request`` and returns once the answer's head arrived (``ReadTimeout``
        after the read timeout, ``TimeoutError`` past ``deadline``)."""
        assert self.transport is not None and self.response is None
        self._pool = pool
        self._answered = False
        self._read_timeout_s = read_timeout_s
        head: asyncio.Future[RawResponse] = self.loop.create_future()
        self.head = head
        self.transport.write(request)
        timer = read_timer(self.loop, head, read_timeout_s, deadline, "the engine did not answer")
        try:
            return await head
        except BaseException:  # a timeout, a failure or the caller's cancellation
            self.head = None
            self.close()
            raise
        finally:
            timer.cancel()


def _expire(waiter: asyncio.Future[Any], message: str) -> None:
    if not waiter.done():
        waiter.set_exception(httpx.ReadTimeout(message))


def _deadline(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


def read_timer(
    loop: asyncio.AbstractEventLoop,
    waiter: asyncio.Future[Any],
    read_timeout_s: float,
    deadline: float | None,
    message: str,
) -> asyncio.TimerHandle:
    """Fails ``waiter`` with ``ReadTimeout(message)`` after ``read_timeout_s``, or with
    ``TimeoutError`` at ``deadline`` if that comes first."""
    if deadline is not None and deadline - loop.time() < read_timeout_s:
        return loop.call_at(deadline, _deadline, waiter)
    return loop.call_later(read_timeout_s, _expire, waiter, message)


class RawResponse:
    """One answer on a pooled connection; the connection goes back to the pool once the body
    was read to its end (and the engine allows keep-alive), else it is closed."""

    def __init__(
        self,
        conn: Connection,
        pool: Pool,
        status_code: int,
        headers: dict[str, str],
        read_timeout_s: float,
    ) -> None:
        self._conn: Connection | None = conn
        self._pool = pool
        self.status_code = status_code
        self.headers: Mapping[str, str] = headers
        self._read_timeout_s = read_timeout_s
        self._parts: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._done = False
        self._failure: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        te = headers.get("transfer-encoding", "").lower()
        self._until_close = (
            "chunked" not in te
            and "content-length" not in headers
            and status_code not in (204, 304)
        )

    # -- fed by the connection ------------------------------------------------------------
    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _feed(self, data: bytes) -> None:
        self._parts.append(data)
        self._buffered += len(data)
        conn = self._conn
        if self._buffered > MAX_BUFFERED_BYTES and not self._paused and conn is not None:
            self._paused = True
            assert conn.transport is not None
            conn.transport.pause_reading()
        self._wake()

    def _complete(self, keep_alive: bool) -> None:
        self._done = True
        self._release(keep_alive)
        self._wake()

    def _connection_lost(self, exc: Exception | None) -> None:
        if self._done:
            return
        if self._until_close and exc is None:
            self._done = True  # the body ends with the connection
        elif exc is not None:
            self._failure = httpx.ReadError(f"reading from the engine: {exc}")
        else:
            self._failure = httpx.RemoteProtocolError("the engine closed the connection mid-body")
        self._drop()
        self._wake()

    def _error(self, error: Exception) -> None:
        if not self._done and self._failure is None:
            self._failure = error
        self._drop()
        self._wake()

    # -- the connection's fate ------------------------------------------------------------
    def _release(self, keep_alive: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._pool.slots.release()
        if self._paused and conn.transport is not None:
            conn.transport.resume_reading()
        if keep_alive and conn.usable() and len(self._pool.idle) < self._pool.max_idle:
            self._pool.idle.append(conn)
        else:
            conn.close()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.response = None
            self._pool.slots.release()
            conn.close()

    # -- the reader's side ----------------------------------------------------------------
    async def _next(self, deadline: float | None = None) -> bytes | None:
        """Everything that arrived since the last call, or None at the body's end; waits at
        most the read timeout, and (``TimeoutError``) not past ``deadline``."""
        while True:
            if self._parts:
                parts, self._parts = self._parts, []
                self._buffered = 0
                if self._paused and self._conn is not None and self._conn.transport is not None:
                    self._paused = False
                    self._conn.transport.resume_reading()
                return parts[0] if len(parts) == 1 else b"".join(parts)
            if self._failure is not None:
                raise self._failure
            if self._done:
                return None
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiter = waiter
            timer = read_timer(
                loop, waiter, self._read_timeout_s, deadline, "the engine stopped sending"
            )
            try:
                await waiter
            except (httpx.ReadTimeout, TimeoutError):
                self._drop()
                raise
            finally:
                timer.cancel()
                self._waiter = None

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self._next()
            if chunk is None:
                return
            yield chunk

    async def chunks(self, deadline: float) -> AsyncIterator[bytes]:
        while True:
            chunk = await self._next(deadline)
            if chunk is None:
                return
            yield chunk

    async def aread(self) -> bytes:
        parts = [chunk async for chunk in self.aiter_raw()]
        return b"".join(parts)

    async def aclose(self) -> None:
        if not self._done:
            self._drop()
