"""A raw HTTP/1.1 client for hostile requests: send bytes as they are, read the answer,
tell whether the server closed the connection."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool
    """The server closed the connection after the answer."""

    def json(self) -> object:
        return json.loads(self.body)


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def read_answer(sock: socket.socket, timeout_s: float = 10.0) -> Answer:
    """One answer (``content-length`` framed) and whether the connection closes after it."""
    sock.settimeout(timeout_s)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before an answer: {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    body, extra = rest[:length], rest[length:]
    closed = headers.get("connection") == "close"
    if closed:  # the server must then really close
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            extra += chunk
    return Answer(status, headers, body, closed)


def send(url: str, raw: bytes, timeout_s: float = 10.0) -> Answer:
    """Sends ``raw`` on a new connection (then half-closes it only if the server wants to
    close); the first answer."""
    with socket.create_connection(address(url), timeout=timeout_s) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(raw)  # (the server may refuse early; its answer is then waiting)
        return read_answer(sock, timeout_s)
