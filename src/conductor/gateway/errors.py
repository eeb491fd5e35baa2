"""The gateway's errors and their one mapping to HTTP: OpenAI's error shape
(:func:`conductor.web.errors.error_body`, ``param`` left out when there is none) with OpenAI's
type names and the status the error carries."""

from __future__ import annotations

from collections.abc import Mapping

from conductor.core.errors import ConductorError
from conductor.web import errors as web_errors
from conductor.web.messages import Response


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
        return web_errors.error_body(self.status, self.message, self.error_type, param=self.param)

    def response(self) -> Response:
        return web_errors.error_response(
            self.status,
            self.message,
            self.error_type,
            param=self.param,
            headers=self.headers or None,
        )


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


ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
}
"""OpenAI's type names of the HTTP layer's own errors; any other status is ``error``."""

error_response = web_errors.status_error_factory(ERROR_TYPES, "error")
"""How the HTTP layer words its own errors (no route, wrong method, body too large, malformed
request, an unexpected failure): the same JSON shape as every other error."""
