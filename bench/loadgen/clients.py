"""One streamed completion, sent and timed by a Python client: a minimal raw HTTP/1.1
keep-alive connection (cheap per request) or httpx."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx

from .spec import MODEL, LoadSpec, Samples, prompt_for


async def one_httpx(client: httpx.AsyncClient, i: int, spec: LoadSpec, out: Samples) -> None:
    body = {
        "model": MODEL,
        "prompt": prompt_for(i, spec),
        "max_tokens": spec.max_tokens,
        "stream": True,
    }
    start = time.perf_counter()
    first: float | None = None
    chunks = 0
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")[:200]
                raise RuntimeError(f"HTTP {r.status_code}: {text}")
            done = False
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                if first is None:
                    first = time.perf_counter()
                chunks += 1
            if not done or first is None:
                raise RuntimeError(f"stream ended early after {chunks} chunks")
    except (httpx.HTTPError, RuntimeError) as exc:
        out.errors += 1
        if len(out.error_examples) < 5:
            out.error_examples.append(f"{type(exc).__name__}: {exc}")
        return
    end = time.perf_counter()
    out.ttft_s.append(first - start)
    out.e2e_s.append(end - start)
    out.tokens += chunks


class RawConnection:
    """A minimal HTTP/1.1 keep-alive client for one connection: much cheaper per request than
    httpx (which costs a few ms of CPU per streamed request), so that the load generator is
    not what limits the measurement. Understands chunked and Content-Length bodies."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.reader is None or self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            sock = self.writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.reader, self.writer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def post_stream(self, path: str, body: bytes) -> tuple[float | None, int]:
        """POST and read an SSE body; returns (time of the first data event, data events)."""
        reader, writer = await self._connect()
        writer.write(
            b"POST %s HTTP/1.1\r\nhost: %s:%d\r\ncontent-type: application/json\r\n"
            b"accept: text/event-stream\r\ncontent-length: %d\r\n\r\n%s"
            % (path.encode(), self.host.encode(), self.port, len(body), body)
        )
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError("connection closed before the response")
        status = int(status_line.split(b" ", 2)[1])
        chunked, length, close = False, None, False
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value:
                chunked = True
            elif name == b"content-length":
                length = int(value)
            elif name == b"connection" and value == b"close":
                close = True
        first: float | None = None
        events = 0
        done = False
        pending = b""
        if chunked:
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await reader.readline()
                    break
                data = await reader.readexactly(size + 2)
                if status != 200:
                    pending += data[:-2]
                    continue
                pending += data[:-2]
                *complete, pending = pending.split(b"\n\n")
                for event in complete:
                    if event.startswith(b"data: [DONE]"):
                        done = True
                    elif event.startswith(b"data: "):
                        if first is None:
                            first = time.perf_counter()
                        events += 1
        else:
            pending = await reader.readexactly(length or 0)
        if close:
            self.close()
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {pending[:200].decode(errors='replace')}")
        if not done:
            raise RuntimeError(f"stream ended without [DONE] after {events} events")
        return first, events


async def one_raw(conn: RawConnection, i: int, spec: LoadSpec, out: Samples) -> None:
    body = json.dumps(
        {
            "model": MODEL,
            "prompt": prompt_for(i, spec),
            "max_tokens": spec.max_tokens,
            "stream": True,
        }
    ).encode()
    start = time.perf_counter()
    try:
        first, events = await conn.post_stream("/v1/completions", body)
    except (OSError, RuntimeError, ValueError, IndexError, asyncio.IncompleteReadError) as exc:
        conn.close()
        out.errors += 1
        if len(out.error_examples) < 5:
            out.error_examples.append(f"{type(exc).__name__}: {exc}")
        return
    end = time.perf_counter()
    if first is None:
        out.errors += 1
        return
    out.ttft_s.append(first - start)
    out.e2e_s.append(end - start)
    out.tokens += events
