"""A lean keep-alive HTTP/1.1 client for the upstream request path.

httpx costs a few milliseconds of CPU per streamed request, more than everything else the
gateway does; this client does only what the gateway's upstream legs need: ``POST`` a JSON
body to an engine over a pooled keep-alive connection and expose the answer with the small
part of ``httpx.Response``'s interface the proxy uses (``status_code``, ``headers.get``,
``aread``, ``aiter_raw``, ``aclose``). Bodies may be delimited by ``Content-Length``, chunked
transfer encoding or the connection's end.

Failures raise the httpx exception classes (``ConnectError``, ``ConnectTimeout``,
``PoolTimeout``, ``ReadTimeout``, ``ReadError``, ``WriteError``, ``RemoteProtocolError``), so
:mod:`conductor.gateway.proxy` classifies both clients alike. A request whose *reused*
connection turns out to be closed by the engine before any answer byte is sent once more on a
fresh connection (as httpx does): the engine never saw it.

:class:`HttpxUpstream` wraps an ``httpx.AsyncClient`` (tests inject a transport through it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import httpx

MAX_HEADER_BYTES = 64 * 1024
STREAM_LIMIT = 1 << 20
"""asyncio stream buffer limit (longest line/chunk-size line read at once)."""


class UpstreamResponse(Protocol):
    """What the proxy uses of an upstream answer."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def aread(self) -> bytes: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class Upstream(Protocol):
    """Sends one ``POST`` with a JSON body; returns once the response headers arrived."""

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str] | None
    ) -> UpstreamResponse: ...

    async def aclose(self) -> None: ...


class HttpxUpstream:
    """:class:`Upstream` over an ``httpx.AsyncClient`` (the tests' transport seam)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str] | None
    ) -> UpstreamResponse:
        all_headers = {"content-type": "application/json"}
        if headers:
            all_headers.update(headers)
        request = self.client.build_request("POST", url, content=body, headers=all_headers)
        return await self.client.send(request, stream=True)

    async def aclose(self) -> None:
        return None  # the client belongs to the caller


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float
    read_s: float
    pool_s: float


@dataclass(slots=True)
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class _Pool:
    """Connections to one ``host:port``: idle ones kept for reuse, at most ``limit`` open."""

    def __init__(self, host: str, port: int, limit: int, max_idle: int) -> None:
        self.host = host
        self.port = port
        self.idle: list[_Conn] = []
        self.max_idle = max_idle
        self.slots = asyncio.Semaphore(limit)
        self.host_header = f"{host}:{port}".encode("latin-1")


class RawResponse:
    """One answer on a pooled connection; the connection goes back to the pool once the body
    was read to its end (and the engine allows keep-alive), else it is closed."""

    def __init__(
        self,
        client: RawHttpClient,
        pool: _Pool,
        conn: _Conn,
        status_code: int,
        headers: dict[str, str],
        read_timeout_s: float,
    ) -> None:
        self._client = client
        self._pool = pool
        self._conn: _Conn | None = conn
        self.status_code = status_code
        self.headers: Mapping[str, str] = headers
        self._read_timeout_s = read_timeout_s
        self._keep_alive = headers.get("connection", "").lower() != "close"
        te = headers.get("transfer-encoding", "").lower()
        self._chunked = "chunked" in te
        length = headers.get("content-length")
        self._remaining: int | None = None
        if not self._chunked and length is not None:
            try:
                self._remaining = int(length)
            except ValueError:
                raise httpx.RemoteProtocolError(f"bad Content-Length {length!r}") from None
            if self._remaining < 0:
                raise httpx.RemoteProtocolError(f"bad Content-Length {length!r}")
        elif not self._chunked:
            self._keep_alive = False  # the body ends with the connection
        self._done = status_code in (204, 304) or self._remaining == 0
        if self._done:
            self._release()

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._pool.slots.release()
        if self._keep_alive and conn.usable() and len(self._pool.idle) < self._pool.max_idle:
            self._pool.idle.append(conn)
        else:
            conn.close()

    def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.slots.release()
            conn.close()

    async def _read(self, coro_kind: str, n: int = 0) -> bytes:
        conn = self._conn
        assert conn is not None
        reader = conn.reader
        buf = getattr(reader, "_buffer", None)
        try:
            if buf and (
                (coro_kind == "line" and b"\r\n" in buf)
                or (coro_kind == "exact" and len(buf) >= n)
                or coro_kind == "some"
            ):  # already buffered: completes without waiting, no timer needed
                if coro_kind == "line":
                    return await reader.readuntil(b"\r\n")
                if coro_kind == "exact":
                    return await reader.readexactly(n)
                return await reader.read(n)
            async with asyncio.timeout(self._read_timeout_s):
                if coro_kind == "line":
                    return await reader.readuntil(b"\r\n")
                if coro_kind == "exact":
                    return await reader.readexactly(n)
                return await reader.read(n)
        except TimeoutError:
            self._discard()
            raise httpx.ReadTimeout("the engine stopped sending") from None
        except asyncio.IncompleteReadError:
            self._discard()
            raise httpx.RemoteProtocolError("the engine closed the connection mid-body") from None
        except asyncio.LimitOverrunError:
            self._discard()
            raise httpx.RemoteProtocolError("a chunk-size line is too long") from None
        except OSError as exc:
            self._discard()
            raise httpx.ReadError(f"reading from the engine: {exc}") from None

    async def _next_chunk(self) -> bytes | None:
        """The next piece of the body, or None at its end."""
        if self._done or self._conn is None:
            return None
        if self._chunked:
            line = await self._read("line")
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                self._discard()
                raise httpx.RemoteProtocolError(f"bad chunk size {size_text!r}") from None
            if size == 0:
                while (await self._read("line")) != b"\r\n":  # trailers
                    pass
                self._done = True
                self._release()
                return None
            data = await self._read("exact", size + 2)
            if not data.endswith(b"\r\n"):
                self._discard()
                raise httpx.RemoteProtocolError("a chunk does not end with CRLF")
            return data[:-2]
        if self._remaining is not None:
            data = await self._read("some", min(self._remaining, 65536))
            if not data:
                self._discard()
                raise httpx.RemoteProtocolError("the engine closed the connection mid-body")
            self._remaining -= len(data)
            if self._remaining == 0:
                self._done = True
                self._release()
            return data
        data = await self._read("some", 65536)
        if not data:
            self._done = True
            self._discard()
            return None
        return data

    def _chunk_buffered(self) -> bool:
        """Whether a whole next chunk already sits in the read buffer (so the pieces that
        arrived together leave together: one write to the client instead of several)."""
        conn = self._conn
        buf = getattr(conn.reader, "_buffer", None) if conn is not None else None
        if not buf:
            return False
        end = buf.find(b"\r\n")
        if end < 0:
            return False
        try:
            size = int(bytes(buf[:end]).split(b";", 1)[0].strip(), 16)
        except ValueError:
            return False
        return bool(len(buf) >= end + 2 + size + 2)

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self._next_chunk()
            if chunk is None:
                return
            if self._chunked and self._chunk_buffered():
                parts = [chunk]
                while self._chunk_buffered():
                    more = await self._next_chunk()
                    if more is None:
                        break
                    parts.append(more)
                chunk = b"".join(parts)
            if chunk:
                yield chunk

    async def aread(self) -> bytes:
        parts = [chunk async for chunk in self.aiter_raw()]
        return b"".join(parts)

    async def aclose(self) -> None:
        if not self._done:
            self._discard()


class RawHttpClient:
    """:class:`Upstream` over pooled asyncio streams (``http://`` URLs only)."""

    def __init__(
        self, timeouts: Timeouts, *, max_connections_per_host: int = 1024, max_idle: int = 256
    ) -> None:
        self.timeouts = timeouts
        self._limit = max_connections_per_host
        self._max_idle = max_idle
        self._pools: dict[tuple[str, int], _Pool] = {}
        self._paths: dict[str, tuple[_Pool, bytes]] = {}

    def _target(self, url: str) -> tuple[_Pool, bytes]:
        cached = self._paths.get(url)
        if cached is not None:
            return cached
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise httpx.UnsupportedProtocol(f"only http:// URLs are supported: {url!r}")
        host, port = parts.hostname, parts.port or 80
        pool = self._pools.get((host, port))
        if pool is None:
            pool = self._pools[(host, port)] = _Pool(host, port, self._limit, self._max_idle)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if len(self._paths) < 4096:
            self._paths[url] = (pool, path.encode("latin-1"))
        return pool, path.encode("latin-1")

    async def _connect(self, pool: _Pool) -> _Conn:
        try:
            async with asyncio.timeout(self.timeouts.connect_s):
                reader, writer = await asyncio.open_connection(
                    pool.host, pool.port, limit=STREAM_LIMIT
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {pool.host}:{pool.port}") from None
        except OSError as exc:
            raise httpx.ConnectError(f"connecting to {pool.host}:{pool.port}: {exc}") from None
        return _Conn(reader, writer)

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str] | None
    ) -> UpstreamResponse:
        pool, path = self._target(url)
        head = [
            b"POST ",
            path,
            b" HTTP/1.1\r\nHost: ",
            pool.host_header,
            b"\r\nContent-Type: application/json\r\nContent-Length: ",
            str(len(body)).encode(),
            b"\r\n",
        ]
        if headers:
            for name, value in headers.items():
                head.append(f"{name}: {value}\r\n".encode("latin-1"))
        head.append(b"\r\n")
        request = b"".join(head) + body
        if pool.slots.locked():
            try:
                async with asyncio.timeout(self.timeouts.pool_s):
                    await pool.slots.acquire()
            except TimeoutError:
                raise httpx.PoolTimeout("no free connection to the engine") from None
        else:
            await pool.slots.acquire()
        try:
            while pool.idle:
                conn = pool.idle.pop()
                if not conn.usable():
                    conn.close()
                    continue
                try:
                    return await self._exchange(pool, conn, request)
                except _Stale:
                    continue  # closed by the engine while idle: try another
            conn = await self._connect(pool)
            try:
                return await self._exchange(pool, conn, request)
            except _Stale:
                raise httpx.RemoteProtocolError(
                    "the engine closed the connection without answering"
                ) from None
        except BaseException:
            pool.slots.release()
            raise

    async def _exchange(self, pool: _Pool, conn: _Conn, request: bytes) -> RawResponse:
        """Send ``request`` on ``conn`` and read the response head. Raises :class:`_Stale`
        when the connection was closed before any answer byte (safe to send again)."""
        try:
            return await self._exchange_on(pool, conn, request)
        except BaseException:  # cancelled (the request's deadline) included
            conn.close()
            raise

    async def _exchange_on(self, pool: _Pool, conn: _Conn, request: bytes) -> RawResponse:
        try:
            conn.writer.write(request)
            if conn.writer.transport.get_write_buffer_size() > 0:
                async with asyncio.timeout(self.timeouts.read_s):
                    await conn.writer.drain()
        except TimeoutError:
            conn.close()
            raise httpx.WriteTimeout("writing to the engine") from None
        except (ConnectionResetError, BrokenPipeError):
            conn.close()
            raise _Stale from None
        except OSError as exc:
            conn.close()
            raise httpx.WriteError(f"writing to the engine: {exc}") from None
        try:
            async with asyncio.timeout(self.timeouts.read_s):
                raw = await conn.reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            conn.close()
            raise httpx.ReadTimeout("the engine did not answer") from None
        except asyncio.IncompleteReadError as exc:
            conn.close()
            if not exc.partial:
                raise _Stale from None
            raise httpx.RemoteProtocolError("the engine closed the connection mid-head") from None
        except asyncio.LimitOverrunError:
            conn.close()
            raise httpx.RemoteProtocolError("the response head is too long") from None
        except ConnectionResetError:
            conn.close()
            raise _Stale from None
        except OSError as exc:
            conn.close()
            raise httpx.ReadError(f"reading from the engine: {exc}") from None
        try:
            status, headers = parse_head(raw)
        except ValueError as exc:
            conn.close()
            raise httpx.RemoteProtocolError(str(exc)) from None
        try:
            return RawResponse(self, pool, conn, status, headers, self.timeouts.read_s)
        except BaseException:
            conn.close()
            raise

    async def aclose(self) -> None:
        for pool in self._pools.values():
            for conn in pool.idle:
                conn.close()
            pool.idle.clear()


class _Stale(Exception):
    """The connection was closed before the engine answered anything."""


def parse_head(raw: bytes) -> tuple[int, dict[str, str]]:
    """Status code and (lower-cased) headers of a response head ending in CRLF CRLF."""
    if len(raw) > MAX_HEADER_BYTES:
        raise ValueError("the response head is too long")
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    try:
        status = int(rest[:3])
    except ValueError:
        raise ValueError(f"bad status line {lines[0][:80]!r}") from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"bad header line {line[:80]!r}")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if version == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
        headers.setdefault("connection", "close")
    return status, headers
