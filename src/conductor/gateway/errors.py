"""The gateway's errors and their one mapping to HTTP: ``{"error": {message, type, param?,
code}}`` with the status the error carries (OpenAI's error shape; ``code`` is the status)."""

from __future__ import annotations

from collections.abc import Mapping

from conductor.core.errors import ConductorError
from conductor.web.messages import Response, json_response


class GatewayError(ConductorError):
    """An error a client sees: HTTP ``status``, OpenAI-style ``error_type`` and ``param``."""

    status: int = 500
    error_type: str = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = dict(headers or {})

    def body(self) -> dict[str, object]:
        err: dict[str, object] = {"message": self.message, "type": self.error_type}
        if self.param is not None:
            err["param"] = self.param
        err["code"] = self.status
        return {"error": err}

    def response(self) -> Response:
        return json_response(self.body(), self.status, self.headers or None)


class BadRequest(GatewayError):
    status = 400
    error_type = "invalid_request_error"


class Unauthorized(GatewayError):
    status = 401
    error_type = "authentication_error"


class Forbidden(GatewayError):
    status = 403
    error_type = "permission_error"


class NotFound(GatewayError):
    status = 404
    error_type = "not_found_error"


class Conflict(GatewayError):
    status = 409
    error_type = "conflict_error"


class Overloaded(GatewayError):
    """The scheduler rejected the request (SLO or KV capacity): try again later."""

    status = 429
    error_type = "rate_limit_error"


class UpstreamError(GatewayError):
    """An engine failed or answered something unusable."""

    status = 502
    error_type = "upstream_error"


class NoEngine(GatewayError):
    """No engine can take the request now (none healthy, or every attempt failed)."""

    status = 503
    error_type = "service_unavailable"


class UpstreamTimeout(GatewayError):
    status = 504
    error_type = "upstream_timeout"


def error_body(status: int, message: str, error_type: str) -> dict[str, object]:
    """The error shape for statuses that come from elsewhere (e.g. an engine's 4xx)."""
    return {"error": {"message": message, "type": error_type, "code": status}}


ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
}


def error_response(status: int, message: str, headers: Mapping[str, str] | None) -> Response:
    """How the HTTP layer words its own errors (no route, wrong method, body too large,
    malformed request, an unexpected failure): the same JSON shape as every other error."""
    return json_response(
        error_body(status, message, ERROR_TYPES.get(status, "error")), status, headers
    )
