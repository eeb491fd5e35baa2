"""The lean upstream client: Content-Length bodies, chunked bodies, keep-alive reuse, and
one resend when a reused idle connection was closed by the server."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from conductor.web.client import RawHttpClient, Timeouts

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


async def test_body_until_close_and_interim_100_continue() -> None:
    answers = [b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\nX-A: 1\r\n\r\nuntil the end"]
    server, conns = await _server(answers, close_after=True)
    port = server.sockets[0].getsockname()[1]
    client = RawHttpClient(TIMEOUTS)
    async with server:
        resp = await client.post(f"http://127.0.0.1:{port}/", b"{}", None)
        assert resp.status_code == 200
        assert resp.headers.get("x-a") == "1"
        assert await resp.aread() == b"until the end"
        await client.aclose()
    assert conns[0] == 1


async def test_connection_closed_mid_body_is_a_protocol_error() -> None:
    answers = [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"]
    server, _ = await _server(answers, close_after=True)
    port = server.sockets[0].getsockname()[1]
    client = RawHttpClient(TIMEOUTS)
    async with server:
        resp = await client.post(f"http://127.0.0.1:{port}/", b"{}", None)
        with pytest.raises(httpx.RemoteProtocolError, match="mid-body"):
            await resp.aread()
        await client.aclose()


async def test_garbage_answer_is_a_protocol_error() -> None:
    server, _ = await _server([b"SMTP ready\r\n\r\n"], close_after=True)
    port = server.sockets[0].getsockname()[1]
    async with server:
        with pytest.raises(httpx.RemoteProtocolError, match="bad answer"):
            await RawHttpClient(TIMEOUTS).post(f"http://127.0.0.1:{port}/", b"{}", None)


async def test_silent_engine_times_out_and_frees_the_slot() -> None:
    finished: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(1 << 16):  # never answers; until the client gives up
            pass
        writer.close()
        await writer.wait_closed()
        finished.append(1)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    timeouts = Timeouts(connect_s=1.0, read_s=0.2, pool_s=0.2)
    client = RawHttpClient(timeouts, max_connections_per_host=1)
    async with server:
        for _ in range(2):  # the second would be a PoolTimeout if the first kept its slot
            with pytest.raises(httpx.ReadTimeout, match="did not answer"):
                await client.post(f"http://127.0.0.1:{port}/", b"{}", None)
        deadline = asyncio.get_running_loop().time() + 0.05  # before the read timeout
        with pytest.raises(TimeoutError):
            await client.post(f"http://127.0.0.1:{port}/", b"{}", None, deadline)
        async with asyncio.timeout(5):
            while len(finished) < 3:  # every connection was closed by the client
                await asyncio.sleep(0.01)


async def test_chunks_stop_at_the_deadline_and_drop_the_connection() -> None:
    finished: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n")
        while await reader.read(1 << 16):  # then silence, until the client gives up
            pass
        writer.close()
        await writer.wait_closed()
        finished.append(1)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = RawHttpClient(TIMEOUTS, max_connections_per_host=1)
    async with server:
        resp = await client.post(f"http://127.0.0.1:{port}/", b"{}", None)
        got: list[bytes] = []
        deadline = asyncio.get_running_loop().time() + 0.2  # well before the read timeout
        with pytest.raises(TimeoutError):
            async for chunk in resp.chunks(deadline):
                got.append(chunk)
        assert got == [b"hi"]
        again = await asyncio.wait_for(  # the slot was freed: a new request gets through
            client.post(f"http://127.0.0.1:{port}/", b"{}", None), 2
        )
        assert again.status_code == 200
        await again.aclose()
        await client.aclose()
        async with asyncio.timeout(5):
            while len(finished) < 2:
                await asyncio.sleep(0.01)
