"""The HTTP server's limits and timeouts, each defined once (the gateway's config holds one
:class:`ServerLimits`; ``conductor serve`` exposes every field as a TOML key and a flag).

Defaults follow mature proxies: Envoy allows 60 KiB and 100 headers per request head;
nginx gives a request head 60 s (``client_header_timeout``), we give 10 s; Node gives 300 s
for a whole request (``requestTimeout``), we give a body 60 s after its head.
"""

from __future__ import annotations

from dataclasses import dataclass

from conductor.core.checks import check_at_least, check_positive


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What one client connection may cost the server.

    A request head over ``max_header_bytes`` (request line and headers) or with more than
    ``max_headers`` header lines gets 431; a head not complete ``head_timeout_s`` after its
    first byte gets 408, and so does a body not complete ``body_timeout_s`` after its head.
    A connection is kept open ``keep_alive_s`` while idle only (before its first request
    and between requests): received bytes never extend a deadline. Beyond
    ``max_connections`` open connections, a new one is answered 503 and closed.
    Every answer above closes the connection, lingering ``linger_s`` at most (the server
    stops sending and discards input, so that the client reads the answer before the
    close)."""

    max_header_bytes: int = 60 * 1024
    max_headers: int = 100
    head_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keep_alive_s: float = 75.0
    max_connections: int = 1000
    linger_s: float = 2.0

    def __post_init__(self) -> None:
        check_at_least("max_header_bytes", self.max_header_bytes, 1024)
        check_at_least("max_headers", self.max_headers, 4)
        check_at_least("max_connections", self.max_connections, 1)
        for name in ("head_timeout_s", "body_timeout_s", "keep_alive_s", "linger_s"):
            check_positive(name, getattr(self, name))
