"""The lean upstream client: Content-Length bodies, chunked bodies, keep-alive reuse, and
one resend when a reused idle connection was closed by the server."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from conductor.gateway.upstream import RawHttpClient, Timeouts, parse_head

pytestmark = pytest.mark.anyio

TIMEOUTS = Timeouts(connect_s=2.0, read_s=2.0, pool_s=2.0)


async def _server(answers: list[bytes], close_after: bool) -> tuple[asyncio.Server, list[int]]:
    """Answers each request with the next canned answer; counts connections."""
    conns = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns[0] += 1
        while answers:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            writer.write(answers.pop(0))
            await writer.drain()
            if close_after:
                break
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, conns


async def test_bodies_and_keep_alive_reuse() -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: application/json\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    ]
    server, conns = await _server(answers, close_after=False)
    port = server.sockets[0].getsockname()[1]
    client = RawHttpClient(TIMEOUTS)
    async with server:
        r1 = await client.post(f"http://127.0.0.1:{port}/v1/x", b"{}", {"X-Request-Id": "a"})
        assert r1.status_code == 200
        assert r1.headers.get("content-type") == "application/json"
        assert await r1.aread() == b"hello"
        r2 = await client.post(f"http://127.0.0.1:{port}/v1/x", b"{}", None)
        assert b"".join([c async for c in r2.aiter_raw()]) == b"abcde"
        await client.aclose()
    assert conns[0] == 1


async def test_stale_idle_connection_is_resent_on_a_fresh_one() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    server, conns = await _server([ok, ok], close_after=True)  # closes after each answer
    port = server.sockets[0].getsockname()[1]
    client = RawHttpClient(TIMEOUTS)
    async with server:
        for _ in range(2):
            resp = await client.post(f"http://127.0.0.1:{port}/", b"{}", None)
            assert await resp.aread() == b"ok"
        await client.aclose()
    assert conns[0] == 2


async def test_refused_connection_raises_connect_error() -> None:
    sock_server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = sock_server.sockets[0].getsockname()[1]
    sock_server.close()
    await sock_server.wait_closed()
    with pytest.raises(httpx.ConnectError):
        await RawHttpClient(TIMEOUTS).post(f"http://127.0.0.1:{port}/", b"{}", None)


def test_parse_head() -> None:
    status, headers = parse_head(b"HTTP/1.1 404 Not Found\r\nA: 1\r\na: 2\r\n\r\n")
    assert status == 404
    assert headers == {"a": "1, 2"}
    with pytest.raises(ValueError):
        parse_head(b"garbage\r\n\r\n")
