"""One client connection's reading side: request framing (``httptools`` callbacks), bounded
heads and bodies, deadlines, ``Expect: 100-continue``, pipelined requests answered in
order, keep-alive while idle.

The limits (:class:`~conductor.web.limits.ServerLimits`): a head over ``max_header_bytes``
or ``max_headers`` gets 431; a head or a body that does not complete within its deadline
gets 408 (bytes trickling in never extend a deadline: a slowloris client is cut);
HTTP/1.1 without exactly one ``Host`` gets 400, ``Transfer-Encoding`` on HTTP/1.0 gets 400
(RFC 9112 6.1: the framing is faulty), ``TRACE`` and ``CONNECT`` get 405. Each of those
answers closes the connection. An ``Upgrade`` we do not speak (``h2c``, websockets) is
ignored: the request is served as HTTP/1.1, body included, and the connection then closes.
"""

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
REFUSED_METHODS = frozenset({"TRACE", "CONNECT"})
_UPGRADE_HEADERS = frozenset({"upgrade", "http2-settings"})


class _Stop(Exception):
    """Raised from a parser callback once the request was rejected: parse no further."""


class HttpProtocol(Responder, asyncio.Protocol):
    """One client connection; :class:`~conductor.web.responding.Responder` writes its answers.

    Invariants: ``task`` is the one task answering this connection's requests, ``None`` while
    none is in progress; requests arriving meanwhile wait in ``pending`` (``keep_alive`` holds
    each one's keep-alive flag, so both have the same length) and are answered in arrival
    order by that task; reading is paused only while ``pending`` is long; once ``broken`` no
    more requests are parsed and ``final_error``, if set, is the connection's last answer.
    ``phase`` is where the parser is in the current request (``idle`` between requests);
    ``timer`` is the one deadline running: the head's (``head``), the body's (``body``) or,
    while nothing is in progress or waiting, the keep-alive's (``idle``)."""

    def __init__(self, server: HttpServer) -> None:
        super().__init__(server)
        self.limits = server.limits
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.header_list: list[tuple[str, str]] = []
        self.headers: dict[str, str] = {}
        self.head_bytes = 0
        self.raw_head_bytes = 0
        self.body: list[bytes] = []
        self.body_size = 0
        self.too_large = False
        self.declared_size: int | None = None
        self.pending: deque[Request] = deque()
        self.keep_alive: deque[bool] = deque()
        self.task: asyncio.Task[None] | None = None
        self.reading_paused = False
        self.phase = "idle"
        self.received_any = False
        self.timer: asyncio.TimerHandle | None = None
        self.timer_kind = ""
        self.timer_gen = 0
        self.final_error: tuple[int, str, dict[str, str] | None] | None = None
        self.broken = False
        """No more requests are read (a parse error, a limit, a deadline)."""
        self.refused = False
        self.upgrade_head: bytes | None = None
        self.close_after = False
        self.messages_done = 0

    # -- connection events ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        server = self.server
        if len(server.connections) >= self.limits.max_connections:
            self.refused = True
            self.broken = True
            server.counters["refused_connections"] += 1
            self.final_error = (
                503,
                f"too many connections (limit {self.limits.max_connections}); retry later",
                {"Retry-After": "1"},
            )
            self._finish()
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        server.connections.add(self)
        # idle until its first byte (as between requests; a starved client may connect
        # well before it writes), then the head deadline runs from that byte
        self._arm("idle", self.limits.keep_alive_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self._disarm()
        self.pending.clear()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self._wake_writer()

    def data_received(self, data: bytes) -> None:
        if self.broken:
            return
        self.received_any = True
        in_head = self.phase == "head"
        done = self.messages_done
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._upgrade(data, int(exc.args[0]) if exc.args else len(data))
            return
        except httptools.HttpParserCallbackError as exc:
            if not self.broken:
                self._bad(f"malformed HTTP request: {exc.__context__ or exc}")
            return
        except httptools.HttpParserError as exc:
            self._bad(f"malformed HTTP request: {exc}")
            return
        if self.phase == "head" and (in_head or done == self.messages_done):
            # all of ``data`` belongs to this head (but leading blank lines)
            self.raw_head_bytes += len(data)
            if self.raw_head_bytes > self.limits.max_header_bytes:
                self._head_too_large()

    def _upgrade(self, data: bytes, offset: int) -> None:
        """An ``Upgrade`` request: parse it again without its upgrade headers, so that it is
        served as plain HTTP/1.1 with its body (``curl --http2`` sends one on a POST)."""
        head, self.upgrade_head = self.upgrade_head, None
        if head is None or self.broken:  # CONNECT was refused; nothing else upgrades
            self.broken = True
            return
        self.close_after = True
        self.parser = httptools.HttpRequestParser(self)
        self.data_received(head + data[offset:])

    def _bad(self, message: str) -> None:
        self.server.counters["bad_requests"] += 1
        self._reject(400, message)

    def _head_too_large(self) -> None:
        self.server.counters["headers_too_large"] += 1
        self._reject(
            431, f"request head exceeds {self.limits.max_header_bytes} bytes (max_header_bytes)"
        )

    # -- parser callbacks -----------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url = b""
        self.header_list = []
        self.headers = {}
        self.head_bytes = 0
        self.raw_head_bytes = 0
        self.body = []
        self.body_size = 0
        if self.phase == "idle" and self.timer_kind != "head":
            self._arm("head", self.limits.head_timeout_s)
        self.phase = "head"

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.head_bytes += len(url)
        if self.head_bytes > self.limits.max_header_bytes:
            self._head_too_large()
            raise _Stop

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value) + 4
        if self.head_bytes > self.limits.max_header_bytes:
            self._head_too_large()
            raise _Stop
        if len(self.header_list) >= self.limits.max_headers:
            self.server.counters["headers_too_large"] += 1
            self._reject(
                431, f"request has more than {self.limits.max_headers} headers (max_headers)"
            )
            raise _Stop
        self.header_list.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def _collect_headers(self) -> int:
        """``headers`` from ``header_list`` (repeats joined with ", ", in linear time);
        returns how many ``Host`` headers there were."""
        joined: dict[str, list[str]] = {}
        for key, text in self.header_list:
            joined.setdefault(key, []).append(text)
        self.headers = {k: v[0] if len(v) == 1 else ", ".join(v) for k, v in joined.items()}
        return len(joined.get("host", ()))

    def on_headers_complete(self) -> None:
        if self.broken:
            raise _Stop
        hosts = self._collect_headers()
        self.phase = "body"
        self._arm("body", self.limits.body_timeout_s)
        method = self.parser.get_method().decode("ascii", "replace")
        version = self.parser.get_http_version()
        problem = None
        if method in REFUSED_METHODS:
            self.server.counters["bad_requests"] += 1
            self._reject(405, f"method {method} is not allowed", {"Allow": self.server.allow})
            raise _Stop
        if version == "1.1" and hosts != 1:
            problem = "missing Host header" if hosts == 0 else "more than one Host header"
        elif hosts > 1:
            problem = "more than one Host header"
        elif version == "1.0" and "transfer-encoding" in self.headers:
            problem = "Transfer-Encoding is not allowed in an HTTP/1.0 request"
        if problem is not None:
            self._bad(problem)
            raise _Stop
        if self.parser.should_upgrade():
            self.upgrade_head = self._plain_head(method, version)
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

    def _plain_head(self, method: str, version: str) -> bytes:
        """This request's head without its upgrade headers (see :meth:`_upgrade`)."""
        lines = [f"{method} {self.url.decode('latin-1')} HTTP/{version}"]
        for key, text in self.header_list:
            if key in _UPGRADE_HEADERS:
                continue
            if key == "connection":
                kept = [t for t in text.split(",") if t.strip().lower() not in _UPGRADE_HEADERS]
                if not kept:
                    continue
                text = ",".join(kept)
            lines.append(f"{key}: {text}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

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
        self.phase = "idle"
        self.messages_done += 1
        if self.timer_kind in ("head", "body"):
            self._disarm()
        if self.broken:
            return
        if self.too_large:  # the body was read and dropped, so the client sees the answer
            self._reject(413, self._too_large_message())
            return
        if self.upgrade_head is not None:
            return  # parsed again, body and all, once the parser reports the upgrade
        parsed = httptools.parse_url(self.url)
        path = parsed.path.decode("latin-1")
        query = parsed.query.decode("latin-1") if parsed.query else ""
        method = self.parser.get_method().decode("ascii")
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        request = Request(method, path, query, self.headers, body)
        keep = self.parser.should_keep_alive() and not self.server.stopping
        keep = keep and not self.close_after
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
            elif self.phase == "idle":
                self._arm("idle", self.limits.keep_alive_s)
            return

    def _reject(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        """An error answer to a request we will not hand to the application; the connection
        reads nothing more and closes after it (requests before it are answered first)."""
        self.broken = True
        self._disarm()
        self.final_error = (status, message, headers)
        if self.task is None:
            self._finish()

    def _finish(self) -> None:
        """Writes the pending error answer, if any, and closes the connection."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.final_error is None:
            self.close()
            return
        status, message, headers = self.final_error
        self.final_error = None
        response = self.server.error(status, message, headers)
        self._write(self._head(response, len(response.body), False) + response.body)
        self._flush()
        # A lingering close: closing with unread input would reset the connection and
        # could destroy the answer before the client reads it. Stop sending, discard what
        # still arrives (``broken``), close when the client does or after ``linger_s``.
        self.broken = True
        if transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(self.limits.linger_s, self.close)
        else:
            self.close()

    def eof_received(self) -> bool | None:
        return False  # the client stopped sending: close (after what is queued)

    # -- deadlines and keep-alive ---------------------------------------------------------
    def _arm(self, kind: str, delay_s: float) -> None:
        self._disarm()
        self.timer_kind = kind
        self.timer = self.loop.call_later(delay_s, self._expired, self.timer_gen, 2)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.timer_kind = ""
        self.timer_gen += 1

    def _expired(self, gen: int, hops: int) -> None:
        """A deadline passed. Acted on after the loop polled for input once more (libuv runs
        timers, then ``call_soon`` callbacks, then polls: two hops), so bytes that arrived
        while the loop was stalled are read first; re-arming meanwhile voids it (``gen``)."""
        if gen != self.timer_gen:
            return
        if hops:
            self.loop.call_soon(self._expired, gen, hops - 1)
            return
        kind = self.timer_kind
        self.timer = None
        self.timer_kind = ""
        if self.transport is None or self.closed or self.broken:
            return
        if kind == "idle" or (kind == "head" and not self.received_any):
            if self.task is None and not self.pending:
                self.close()  # nothing asked: just close
            return
        limit = self.limits.head_timeout_s if kind == "head" else self.limits.body_timeout_s
        self.server.counters[f"{kind}_timeouts"] += 1
        self._reject(408, f"request {kind} not received within {limit:g} s ({kind}_timeout_s)")

    def close_if_idle(self) -> bool:
        if self.task is None and self.transport is not None:
            self.close()
            return True
        return False
