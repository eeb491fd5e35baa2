"""One client connection's reading side: request framing (``httptools`` callbacks), bounded
bodies, ``Expect: 100-continue``, pipelined requests answered in order, keep-alive."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from typing import TYPE_CHECKING, cast

import httptools

from conductor.web.messages import Request
from conductor.web.responding import Responder

if TYPE_CHECKING:
    from conductor.web.server import HttpServer

MAX_PIPELINED = 64
"""Reading pauses while this many pipelined requests wait for their turn."""


class HttpProtocol(Responder, asyncio.Protocol):
    """One client connection; :class:`~conductor.web.responding.Responder` writes its answers.

    Invariants: ``task`` is the one task answering this connection's requests, ``None`` while
    none is in progress; requests arriving meanwhile wait in ``pending`` (``keep_alive`` holds
    each one's keep-alive flag, so both have the same length) and are answered in arrival
    order by that task; reading is paused only while ``pending`` is long; once ``broken`` no
    more requests are parsed and ``final_error``, if set, is the connection's last answer;
    the idle timer runs only while no request is in progress or waiting."""

    def __init__(self, server: HttpServer) -> None:
        super().__init__(server)
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.body_size = 0
        self.too_large = False
        self.declared_size: int | None = None
        self.pending: deque[Request] = deque()
        self.keep_alive: deque[bool] = deque()
        self.task: asyncio.Task[None] | None = None
        self.reading_paused = False
        self.idle_timer: asyncio.TimerHandle | None = None
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

    # -- the answering task ---------------------------------------------------------------
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
        self.close()

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
            self.close()

    def close_if_idle(self) -> bool:
        if self.task is None and self.transport is not None:
            self.close()
            return True
        return False
