"""The server's limits and deadlines (:class:`conductor.web.limits.ServerLimits`) over real
sockets: 431 for big or many headers, 408 for a head or body past its deadline (a trickling
client is cut, not kept alive), a connection cap, Host rules, TRACE/CONNECT, and the body
of an ``Upgrade`` request kept."""

from __future__ import annotations

import asyncio
import re

import pytest

from conductor.core.errors import InvalidInput
from conductor.web.limits import ServerLimits
from conductor.web.messages import Request, Response, json_response
from conductor.web.router import Router
from conductor.web.server import running

pytestmark = pytest.mark.anyio

DATE = re.compile(rb"date: [^\r]+\r\n")


def router() -> Router:
    r = Router()

    async def echo(request: Request) -> Response:
        return json_response({"body": request.body.decode(), "x": request.headers.get("x")})

    async def hello(request: Request) -> Response:
        return Response(b"hi", media_type="text/plain")

    r.add("POST", "/echo", echo)
    r.add("GET", "/hello", hello)
    return r


def answer(status: bytes, message: bytes, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 %b\r\nserver: conductor\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"%bcontent-length: %d\r\nconnection: close\r\n\r\n%b"
        % (status, extra, len(message), message)
    )


async def exchange(port: int, *pieces: bytes, gap_s: float = 0.0) -> bytes:
    """Sends ``pieces`` (``gap_s`` apart); everything answered until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            if gap_s:
                await asyncio.sleep(gap_s)
        async with asyncio.timeout(5):
            data = await reader.read(-1)
    except ConnectionResetError:
        data = b""
    finally:
        writer.close()
    return DATE.sub(b"", data)


async def test_header_count_over_the_limit_is_431() -> None:
    limits = ServerLimits(max_headers=10)
    async with running(router(), limits=limits) as server:
        ok = b"".join(b"x-%d: v\r\n" % i for i in range(8))  # + Host + Connection = 10
        good = await exchange(
            server.port, b"GET /hello HTTP/1.1\r\nHost: h\r\n%bConnection: close\r\n\r\n" % ok
        )
        many = b"".join(b"x-%d: v\r\n" % i for i in range(11))
        bad = await exchange(server.port, b"GET /hello HTTP/1.1\r\nHost: h\r\n%b\r\n" % many)
        assert server.counters["headers_too_large"] == 1
    assert good.endswith(b"hi")
    assert bad == answer(
        b"431 Request Header Fields Too Large", b"request has more than 10 headers (max_headers)"
    )


@pytest.mark.parametrize("pieces", [1, 64], ids=["one-send", "trickled"])
async def test_head_over_the_size_limit_is_431(pieces: int) -> None:
    limits = ServerLimits(max_header_bytes=4096)
    async with running(router(), limits=limits) as server:
        big = b"GET /hello HTTP/1.1\r\nHost: h\r\nx: " + b"a" * 100_000
        step = len(big) // pieces + 1
        parts = [big[i : i + step] for i in range(0, len(big), step)]
        data = await exchange(server.port, *parts)
    assert data == answer(
        b"431 Request Header Fields Too Large",
        b"request head exceeds 4096 bytes (max_header_bytes)",
    )


async def test_duplicate_headers_are_joined_in_order() -> None:
    async with running(router()) as server:
        data = await exchange(
            server.port,
            b"POST /echo HTTP/1.1\r\nHost: h\r\nX: 1\r\nX: 2\r\nx: 3\r\nContent-Length: 2\r\n"
            b"Connection: close\r\n\r\nab",
        )
    assert data.endswith(b'{"body":"ab","x":"1, 2, 3"}')


async def test_a_trickling_head_gets_408_at_its_deadline() -> None:
    limits = ServerLimits(head_timeout_s=0.3)
    async with running(router(), limits=limits) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /hello HTTP/1.1\r\n")
        for _ in range(8):  # one byte each 0.1 s: every byte would re-arm a per-byte timer
            await asyncio.sleep(0.1)
            writer.write(b"X")
        async with asyncio.timeout(5):
            data = DATE.sub(b"", await reader.read(-1))
        writer.close()
        assert server.counters["head_timeouts"] == 1
    assert data == answer(
        b"408 Request Timeout", b"request head not received within 0.3 s (head_timeout_s)"
    )


async def test_a_slow_body_gets_408_and_a_silent_connection_is_closed() -> None:
    limits = ServerLimits(body_timeout_s=0.2, head_timeout_s=0.2, keep_alive_s=0.2)
    async with running(router(), limits=limits) as server:
        slow = await exchange(
            server.port, b"POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc"
        )
        silent = await exchange(server.port)  # connects, sends nothing
        assert server.counters["body_timeouts"] == 1
    assert slow == answer(
        b"408 Request Timeout", b"request body not received within 0.2 s (body_timeout_s)"
    )
    assert silent == b""


async def test_keep_alive_lasts_while_idle_only() -> None:
    limits = ServerLimits(keep_alive_s=0.2, head_timeout_s=5.0)
    async with running(router(), limits=limits) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /hello HTTP/1.1\r\nHost: h\r\n\r\n")
        async with asyncio.timeout(5):
            first = await reader.readuntil(b"hi")
            rest = await reader.read(-1)  # closed after 0.2 s idle
        writer.close()
    assert first.startswith(b"HTTP/1.1 200 OK")
    assert rest == b""


async def test_connections_over_the_cap_get_503() -> None:
    limits = ServerLimits(max_connections=2)
    async with running(router(), limits=limits) as server:
        held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
        await asyncio.sleep(0.05)
        refused = await exchange(server.port, b"GET /hello HTTP/1.1\r\nHost: h\r\n\r\n")
        for _, w in held:
            w.close()
        await asyncio.sleep(0.05)
        again = await exchange(
            server.port, b"GET /hello HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
        )
        assert server.counters["refused_connections"] == 1
    assert refused == answer(
        b"503 Service Unavailable",
        b"too many connections (limit 2); retry later",
        b"retry-after: 1\r\n",
    ) or refused == answer(
        b"503 Service Unavailable",
        b"too many connections (limit 2); retry later",
        b"Retry-After: 1\r\n",
    )
    assert again.endswith(b"hi")


@pytest.mark.parametrize(
    ("raw", "status", "message"),
    [
        (b"GET /hello HTTP/1.1\r\n\r\n", b"400 Bad Request", b"missing Host header"),
        (
            b"GET /hello HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            b"400 Bad Request",
            b"more than one Host header",
        ),
        (
            b"POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
            b"400 Bad Request",
            b"Transfer-Encoding is not allowed in an HTTP/1.0 request",
        ),
    ],
)
async def test_host_and_framing_rules(raw: bytes, status: bytes, message: bytes) -> None:
    async with running(router()) as server:
        data = await exchange(server.port, raw)
    assert data == answer(status, message)


@pytest.mark.parametrize(
    "raw",
    [b"TRACE /hello HTTP/1.1\r\nHost: h\r\n\r\n", b"CONNECT h:443 HTTP/1.1\r\nHost: h\r\n\r\n"],
    ids=["TRACE", "CONNECT"],
)
async def test_trace_and_connect_are_405_with_allow(raw: bytes) -> None:
    async with running(router()) as server:
        data = await exchange(server.port, raw)
    method = raw.split(b" ")[0]
    assert data == answer(
        b"405 Method Not Allowed",
        b"method %b is not allowed" % method,
        b"Allow: GET, HEAD, POST, DELETE\r\n",
    )


async def test_an_upgrade_request_keeps_its_body() -> None:
    async with running(router()) as server:
        data = await exchange(
            server.port,
            b"POST /echo HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, HTTP2-Settings\r\n"
            b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\nContent-Length: 5\r\n"
            b"\r\nhello",
        )
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"connection: close\r\n" in data
    assert data.endswith(b'{"body":"hello","x":null}')


def test_limits_are_checked() -> None:
    with pytest.raises(InvalidInput, match="max_headers"):
        ServerLimits(max_headers=0)
    with pytest.raises(InvalidInput, match="head_timeout_s"):
        ServerLimits(head_timeout_s=0.0)
