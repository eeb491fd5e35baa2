"""conductor.web's HTTP/1.1 server over real sockets: framing, keep-alive, pipelining,
bounded bodies, errors, streaming, client disconnects and graceful shutdown."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import httpx
import pytest

from conductor.web.messages import Request, Response, StreamResponse, json_response
from conductor.web.router import Router
from conductor.web.server import HttpServer, running

pytestmark = pytest.mark.anyio

DATE = re.compile(rb"date: [^\r]+\r\n")


class App:
    """Routes for the tests, recording what happened."""

    def __init__(self) -> None:
        self.router = Router()
        self.closed_streams = 0
        self.cancelled = 0
        self.release = asyncio.Event()
        self.entered = asyncio.Event()
        r = self.router
        r.add("GET", "/hello", self.hello)
        r.add("POST", "/echo", self.echo)
        r.add(("GET", "POST"), "/stream", self.stream)
        r.add("GET", "/boom", self.boom)
        r.add("GET", "/broken-stream", self.broken_stream)
        r.add("GET", "/wait", self.wait)
        r.add("GET", "/items/{item_id}/info", self.item)
        r.add("GET", "/bad-header", self.bad_header)

    async def hello(self, request: Request) -> Response:
        return Response(b"hi", media_type="text/plain")

    async def echo(self, request: Request) -> Response:
        return json_response(
            {"body": request.body.decode(), "query": request.query, "x": request.headers.get("x")}
        )

    async def _pieces(self, n: int) -> AsyncIterator[bytes]:
        for i in range(n):
            yield f"piece {i}\n".encode()
            await asyncio.sleep(0)

    async def stream(self, request: Request) -> StreamResponse:
        async def on_close() -> None:
            self.closed_streams += 1

        return StreamResponse(self._pieces(3), media_type="text/plain", on_close=on_close)

    async def boom(self, request: Request) -> Response:
        raise RuntimeError("boom")

    async def broken_stream(self, request: Request) -> StreamResponse:
        async def body() -> AsyncIterator[bytes]:
            yield b"first"
            raise RuntimeError("broken")

        return StreamResponse(body())

    async def wait(self, request: Request) -> StreamResponse:
        async def body() -> AsyncIterator[bytes]:
            yield b"started"
            self.entered.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            yield b"done"

        async def on_close() -> None:
            self.closed_streams += 1

        return StreamResponse(body(), on_close=on_close)

    async def item(self, request: Request) -> Response:
        return json_response(request.path_params)

    async def bad_header(self, request: Request) -> Response:
        return Response(b"x", headers={"x-evil": "a\r\nset-cookie: b"})


async def exchange(port: int, raw: bytes) -> bytes:
    """Sends ``raw``; everything the server answers until it closes (date lines removed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    async with asyncio.timeout(5):
        data = await reader.read(-1)
    writer.close()
    return DATE.sub(b"", data)


async def test_keep_alive_pipelining_and_framing() -> None:
    app = App()
    async with running(app.router) as server:
        raw = (
            b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
            b"POST /echo?a=1 HTTP/1.1\r\nHost: x\r\nX: y\r\nContent-Length: 3\r\n\r\nabc"
            b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        data = await exchange(server.port, raw)
    echoed = b'{"body":"abc","query":"a=1","x":"y"}'
    assert data == (
        b"HTTP/1.1 200 OK\r\nserver: conductor\r\ncontent-type: text/plain\r\n"
        b"content-length: 2\r\n\r\nhi"
        b"HTTP/1.1 200 OK\r\nserver: conductor\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%b"
        b"HTTP/1.1 200 OK\r\nserver: conductor\r\ncontent-type: text/plain\r\n"
        b"content-length: 2\r\nconnection: close\r\n\r\nhi" % (len(echoed), echoed)
    )


async def test_chunked_stream_and_head() -> None:
    app = App()
    async with running(app.router) as server:
        data = await exchange(
            server.port,
            b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\nHEAD /stream HTTP/1.1\r\nHost: x\r\n\r\n"
            b"HEAD /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
    assert data == (
        b"HTTP/1.1 200 OK\r\nserver: conductor\r\ncontent-type: text/plain\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
        b"8\r\npiece 0\n\r\n8\r\npiece 1\n\r\n8\r\npiece 2\n\r\n0\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nserver: conductor\r\ncontent-type: text/plain\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nserver: conductor\r\ncontent-type: text/plain\r\n"
        b"content-length: 2\r\nconnection: close\r\n\r\n"
    )
    assert app.closed_streams == 2


async def test_http10_closes_after_the_answer() -> None:
    app = App()
    async with running(app.router) as server:
        data = await exchange(server.port, b"GET /hello HTTP/1.0\r\n\r\n")
    assert data.endswith(b"connection: close\r\n\r\nhi")


async def test_chunked_request_body_and_100_continue() -> None:
    app = App()
    async with running(app.router) as server:
        data = await exchange(
            server.port,
            b"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            b"2\r\nab\r\n1\r\nc\r\n0\r\n\r\n",
        )
    assert data.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert data.endswith(b'{"body":"abc","query":"","x":null}')


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n0123456789a",
            b"request body of 11 bytes exceeds the limit of 10",
        ),
        (
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\nExpect: 100-continue\r\n\r\n",
            b"request body of 11 bytes exceeds the limit of 10",
        ),
        (
            b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"6\r\n012345\r\n6\r\n012345\r\n0\r\n\r\n",
            b"request body exceeds the limit of 10 bytes",
        ),
    ],
)
async def test_oversize_body_is_413_and_closes(raw: bytes, message: bytes) -> None:
    app = App()
    async with running(app.router, max_body_bytes=10) as server:
        data = await exchange(server.port, raw)
    assert data == (
        b"HTTP/1.1 413 Request Entity Too Large\r\nserver: conductor\r\n"
        b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n%b" % (len(message), message)
    )


async def test_malformed_request_is_400_after_earlier_answers() -> None:
    app = App()
    async with running(app.router) as server:
        data = await exchange(
            server.port, b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\nNOT HTTP AT ALL\r\n\r\n"
        )
    first, _, rest = data.partition(b"hi")
    assert first.startswith(b"HTTP/1.1 200 OK")
    assert rest.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"malformed HTTP request" in rest


async def test_routing_errors_and_path_params() -> None:
    app = App()
    async with (
        running(app.router) as server,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client,
    ):
        missing = await client.get("/nothing")
        wrong = await client.delete("/hello")
        item = await client.get("/items/a%2Fb/info")
    assert (missing.status_code, missing.text) == (404, "no route for /nothing")
    assert (wrong.status_code, wrong.headers["allow"]) == (405, "GET")
    assert wrong.text == "method DELETE is not allowed on /hello"
    assert item.json() == {"item_id": "a/b"}


async def test_handler_errors_are_500_and_the_connection_survives() -> None:
    app = App()
    async with (
        running(app.router) as server,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client,
    ):
        boom = await client.get("/boom")
        evil = await client.get("/bad-header")
        ok = await client.get("/hello")
    assert (boom.status_code, boom.text) == (500, "internal server error")
    assert (evil.status_code, "set-cookie" in evil.headers) == (500, False)
    assert ok.text == "hi"


async def test_a_stream_that_fails_midway_is_cut_without_its_last_chunk() -> None:
    app = App()
    async with running(app.router) as server:
        data = await exchange(server.port, b"GET /broken-stream HTTP/1.1\r\nHost: x\r\n\r\n")
    assert data.endswith(b"5\r\nfirst\r\n")  # no terminating 0-chunk: the client sees it broke


async def test_client_disconnect_cancels_the_stream_and_runs_on_close() -> None:
    app = App()
    async with running(app.router) as server:
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(5):
            await app.entered.wait()
            writer.close()
            while app.closed_streams == 0:
                await asyncio.sleep(0.01)
    assert (app.cancelled, app.closed_streams) == (1, 1)


async def waiting_stream(
    app: App,
) -> tuple[HttpServer, asyncio.StreamReader, asyncio.StreamWriter]:
    """A started server with one client whose stream waits on ``app.release``."""
    server = HttpServer(app.router)
    await server.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
    async with asyncio.timeout(5):
        await app.entered.wait()
    return server, reader, writer


async def test_shutdown_lets_requests_in_progress_finish() -> None:
    app = App()
    server, reader, writer = await waiting_stream(app)
    async with asyncio.timeout(5):
        stopping = asyncio.create_task(server.shutdown(grace_s=5))
        await asyncio.sleep(0.1)
        assert not stopping.done()  # waits for the stream
        app.release.set()
        await stopping
        data = DATE.sub(b"", await reader.read(-1))
    writer.close()
    assert data.endswith(b"7\r\nstarted\r\n4\r\ndone\r\n0\r\n\r\n")
    assert (app.cancelled, app.closed_streams) == (0, 1)


async def test_shutdown_cuts_requests_after_the_grace_period() -> None:
    app = App()
    server, reader, writer = await waiting_stream(app)
    async with asyncio.timeout(5):
        await server.shutdown(grace_s=0.1)
        await reader.read(-1)
        while app.closed_streams == 0:
            await asyncio.sleep(0.01)
    writer.close()
    assert (app.cancelled, app.closed_streams) == (1, 1)


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="max_body_bytes must be > 0"):
        HttpServer(Router(), max_body_bytes=0)
