"""Requests and responses of :mod:`conductor.web` (plain objects; no I/O here)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import Any

import msgspec

_JSON = msgspec.json.Encoder()


class Request:
    """One HTTP request, its body already read (the server bounds its size).

    ``headers`` maps lower-cased names to values (repeated headers joined with ``", "``).
    """

    __slots__ = ("body", "headers", "method", "path", "path_params", "query")

    def __init__(
        self,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body: bytes,
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.path_params: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"Request({self.method} {self.path})"


class Response:
    """A whole response. ``headers`` must not hold ``content-length`` or ``content-type``
    (given by ``body`` and ``media_type``)."""

    __slots__ = ("body", "headers", "media_type", "status")

    def __init__(
        self,
        body: bytes = b"",
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
    ) -> None:
        self.body = body
        self.status = status
        self.headers = headers
        self.media_type = media_type


def json_response(
    value: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """``value`` as compact UTF-8 JSON."""
    return Response(_JSON.encode(value), status, headers, "application/json")


class StreamResponse:
    """A response whose body is produced piece by piece (sent with chunked transfer
    encoding). The server always calls ``on_close`` once the response is over, whether the
    body ran to its end, failed, or the client went away (the sending is then cancelled)."""

    __slots__ = ("body", "headers", "media_type", "on_close", "status")

    def __init__(
        self,
        body: AsyncIterator[bytes],
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.body = body
        self.status = status
        self.headers = headers
        self.media_type = media_type
        self.on_close = on_close


AnyResponse = Response | StreamResponse
Handler = Callable[[Request], Awaitable[AnyResponse]]


def status_line(status: int) -> bytes:
    """``HTTP/1.1 <status> <reason>\\r\\n`` (cached for the known codes)."""
    line = _STATUS_LINES.get(status)
    if line is None:
        if not 100 <= status <= 999:
            raise ValueError(f"bad HTTP status {status}")
        line = b"HTTP/1.1 %d \r\n" % status
    return line


_STATUS_LINES = {
    s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode("latin-1")) for s in HTTPStatus
}
_STATUS_LINES[499] = b"HTTP/1.1 499 Client Closed Request\r\n"


def header_lines(headers: Mapping[str, str]) -> bytes:
    """``name: value\\r\\n`` lines; ``ValueError`` for a CR or LF (header injection)."""
    out = []
    for name, value in headers.items():
        line = f"{name}: {value}\r\n"
        if line.count("\n") != 1 or line.count("\r") != 1:
            raise ValueError(f"header {name!r} holds a line break")
        out.append(line)
    return "".join(out).encode("latin-1")
