"""The gateway's errors and their one mapping to HTTP: ``{"error": {message, type, param?,
code}}`` with the status the error carries (OpenAI's error shape; ``code`` is the status)."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.responses import JSONResponse

from conductor.core.errors import ConductorError


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

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


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


class PayloadTooLarge(GatewayError):
    status = 413
    error_type = "invalid_request_error"


class UnsupportedMediaType(GatewayError):
    status = 415
    error_type = "invalid_request_error"


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
