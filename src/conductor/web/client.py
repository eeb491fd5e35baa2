"""A lean keep-alive HTTP/1.1 client for the upstream request path.

httpx costs a few milliseconds of CPU per streamed request, more than everything else the
gateway does; this client does only what the gateway's upstream legs need: ``POST`` a JSON
body to an engine over a pooled keep-alive connection and expose the answer with the small
part of ``httpx.Response``'s interface the proxy uses (``status_code``, ``headers.get``,
``aread``, ``aiter_raw``, ``aclose``). Bodies may be delimited by ``Content-Length``, chunked
transfer encoding or the connection's end.

Connections and answers are :mod:`conductor.web.client_conn`.

Failures raise the httpx exception classes (``ConnectError``, ``ConnectTimeout``,
``PoolTimeout``, ``ReadTimeout``, ``ReadError``, ``WriteError``, ``RemoteProtocolError``), so
:mod:`conductor.gateway.proxy` classifies it and httpx alike. A request whose *reused*
connection turns out to be closed by the engine before any answer byte is sent once more on a
fresh connection (as httpx does): the engine never saw it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from conductor.web.client_conn import Connection, Pool, RawResponse, Stale


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float
    read_s: float
    pool_s: float


class RawHttpClient:
    """:class:`Upstream` over pooled protocol connections (``http://`` URLs only)."""

    def __init__(
        self, timeouts: Timeouts, *, max_connections_per_host: int = 1024, max_idle: int = 256
    ) -> None:
        self.timeouts = timeouts
        self._limit = max_connections_per_host
        self._max_idle = max_idle
        self._pools: dict[tuple[str, int], Pool] = {}
        self._paths: dict[str, tuple[Pool, bytes]] = {}

    def _target(self, url: str) -> tuple[Pool, bytes]:
        cached = self._paths.get(url)
        if cached is not None:
            return cached
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise httpx.UnsupportedProtocol(f"only http:// URLs are supported: {url!r}")
        host, port = parts.hostname, parts.port or 80
        pool = self._pools.get((host, port))
        if pool is None:
            pool = self._pools[(host, port)] = Pool(host, port, self._limit, self._max_idle)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if len(self._paths) < 4096:
            self._paths[url] = (pool, path.encode("latin-1"))
        return pool, path.encode("latin-1")

    async def _connect(self, pool: Pool) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeouts.connect_s):
                _, conn = await loop.create_connection(
                    lambda: Connection(loop), pool.host, pool.port
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {pool.host}:{pool.port}") from None
        except OSError as exc:
            raise httpx.ConnectError(f"connecting to {pool.host}:{pool.port}: {exc}") from None
        return conn

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str] | None,
        deadline: float | None = None,
    ) -> RawResponse:
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
            async with asyncio.timeout_at(deadline):
                try:
                    async with asyncio.timeout(self.timeouts.pool_s):
                        await pool.slots.acquire()
                except TimeoutError:
                    raise httpx.PoolTimeout("no free connection to the engine") from None
        else:
            await pool.slots.acquire()
        read_s = self.timeouts.read_s
        try:
            while pool.idle:
                conn = pool.idle.pop()
                if not conn.usable():
                    conn.close()
                    continue
                try:
                    return await conn.exchange(pool, request, read_s, deadline)
                except Stale:
                    continue  # closed by the engine while idle: try another
            async with asyncio.timeout_at(deadline):
                conn = await self._connect(pool)
            try:
                return await conn.exchange(pool, request, read_s, deadline)
            except Stale:
                raise httpx.RemoteProtocolError(
                    "the engine closed the connection without answering"
                ) from None
        except BaseException:
            pool.slots.release()
            raise

    async def aclose(self) -> None:
        for pool in self._pools.values():
            for conn in pool.idle:
                conn.close()
            pool.idle.clear()
