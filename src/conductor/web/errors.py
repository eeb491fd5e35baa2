"""OpenAI-shaped error bodies, written once for every shell: ``{"error": {"message", "type",
"param", "code"}}`` with ``code`` the HTTP status, and the JSON response carrying one.

Each shell brings its own ``type`` names (the gateway OpenAI's, ``invalid_request_error``...;
the emulator vLLM's, ``BadRequestError``...) and says whether ``param`` is written when there
is none: OpenAI leaves it out, vLLM writes ``null``.
"""

from __future__ import annotations

from collections.abc import Mapping

from conductor.web.messages import Response, json_response
from conductor.web.router import ErrorFactory


def error_body(
    status: int,
    message: str,
    error_type: str,
    *,
    param: str | None = None,
    null_param: bool = False,
) -> dict[str, object]:
    """``{"error": {message, type, param?, code}}`` in that key order; ``param`` is left out
    when None unless ``null_param``."""
    err: dict[str, object] = {"message": message, "type": error_type}
    if param is not None or null_param:
        err["param"] = param
    err["code"] = status
    return {"error": err}


def error_response(
    status: int,
    message: str,
    error_type: str,
    *,
    param: str | None = None,
    null_param: bool = False,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """:func:`error_body` as a JSON response with ``status``."""
    body = error_body(status, message, error_type, param=param, null_param=null_param)
    return json_response(body, status, headers)


def status_error_factory(
    types: Mapping[int, str], default_type: str, *, null_param: bool = False
) -> ErrorFactory:
    """How a shell words the HTTP layer's own errors (no route, wrong method, body too large,
    malformed request, an unexpected failure): ``type`` from ``types`` by status, else
    ``default_type``; no ``param``."""

    def factory(status: int, message: str, headers: Mapping[str, str] | None) -> Response:
        error_type = types.get(status, default_type)
        return error_response(status, message, error_type, null_param=null_param, headers=headers)

    return factory
