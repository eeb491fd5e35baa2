"""Writing answers on one connection: running the application, the response head, coalesced
sends, chunked streaming with back-pressure, and closing a stream's body."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from conductor.web.messages import Request, Response, StreamResponse, header_lines, status_line

if TYPE_CHECKING:
    from conductor.web.server import HttpServer

log = logging.getLogger("conductor.web.server")  # the server's one logger
SERVER_HEADER = b"server: conductor\r\n"


class DateHeader:
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


class Responder:
    """The writing half of a connection (:class:`~conductor.web.connection.HttpProtocol`
    inherits it; the reading half decides what to answer and when).

    Invariants: everything written goes through :meth:`_write`, so bytes leave in the order
    they were queued; ``out`` holds bytes only while a flush is scheduled; ``drain_waiter`` is
    set only while a stream waits for the transport to take more (``write_paused``); once
    ``closed`` (the transport is gone) nothing is written and a waiting stream is woken to
    stop."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.app = server.app
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.write_paused = False
        self.drain_waiter: asyncio.Future[None] | None = None
        self.out: list[bytes] = []
        self.flush_scheduled = False

    # -- back-pressure (asyncio.Protocol callbacks) ---------------------------------------
    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_writer()

    def _wake_writer(self) -> None:
        waiter, self.drain_waiter = self.drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _drain(self) -> None:
        if self.closed:
            raise _ClientGone
        waiter = self.loop.create_future()
        self.drain_waiter = waiter
        await waiter
        if self.closed:
            raise _ClientGone

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

    def close(self) -> None:
        """Sends what is queued, then closes."""
        self._flush()
        if self.transport is not None:
            self.transport.close()

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

    # -- answering ------------------------------------------------------------------------
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
                self.close()
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
            self.close()
            return False
        finally:
            await _close_stream(response)


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
