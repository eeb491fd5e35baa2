"""Maps ``(method, path)`` to a handler; paths may have ``{name}`` segments."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from urllib.parse import unquote

from conductor.web.messages import AnyResponse, Handler, Request, Response

ErrorFactory = Callable[[int, str, Mapping[str, str] | None], Response]
"""``(status, message, headers) -> Response``: how the application words its errors."""

_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def plain_error(status: int, message: str, headers: Mapping[str, str] | None) -> Response:
    return Response(message.encode(), status, headers, "text/plain; charset=utf-8")


def _compile(path: str) -> re.Pattern[str]:
    parts = _PARAM.split(path)  # literal, name, literal, name, ..., literal
    pattern = "".join(
        re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts)
    )
    return re.compile(f"^{pattern}$")


class Router:
    """The application the server calls. ``HEAD`` is answered by the ``GET`` handler (the
    server drops the body); an unknown path gets 404, a known one with another method 405
    with ``Allow``."""

    def __init__(self, error: ErrorFactory = plain_error) -> None:
        self.error = error
        self._exact: dict[str, dict[str, Handler]] = {}
        self._patterns: list[tuple[re.Pattern[str], dict[str, Handler]]] = []

    def add(self, methods: str | tuple[str, ...], path: str, handler: Handler) -> None:
        names = (methods,) if isinstance(methods, str) else methods
        if "{" in path:
            regex = _compile(path)
            table = next((t for r, t in self._patterns if r.pattern == regex.pattern), None)
            if table is None:
                table = {}
                self._patterns.append((regex, table))
        else:
            table = self._exact.setdefault(path, {})
        for method in names:
            table[method.upper()] = handler

    def resolve(self, request: Request) -> Handler | Response:
        """The handler for ``request`` (``path_params`` filled in), or an error response."""
        table = self._exact.get(request.path)
        if table is None:
            for regex, candidate in self._patterns:
                match = regex.match(request.path)
                if match is not None:
                    request.path_params = {k: unquote(v) for k, v in match.groupdict().items()}
                    table = candidate
                    break
            else:
                return self.error(404, f"no route for {request.path}", None)
        method = request.method
        handler = table.get("GET" if method == "HEAD" else method)
        if handler is None:
            allow = ", ".join(sorted(table))
            return self.error(
                405, f"method {method} is not allowed on {request.path}", {"Allow": allow}
            )
        return handler

    async def __call__(self, request: Request) -> AnyResponse:
        handler = self.resolve(request)
        if isinstance(handler, Response):
            return handler
        return await handler(request)
