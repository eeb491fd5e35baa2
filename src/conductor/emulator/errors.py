"""The emulator's API errors: what a refused request raises, and its JSON answer in vLLM's
wording (:func:`conductor.web.errors.error_body` with vLLM's type names and ``"param": null``
when no field is at fault)."""

from __future__ import annotations

from conductor.core.errors import ConductorError
from conductor.web import errors as web_errors
from conductor.web.messages import Response

ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    409: "ConflictError",
    413: "RequestTooLargeError",
    500: "InternalServerError",
}
"""vLLM's type name of each status; any other status is :data:`DEFAULT_ERROR_TYPE`."""
DEFAULT_ERROR_TYPE = "BadRequestError"


class ApiError(ConductorError):
    """A request the API refuses; answered by :meth:`response` with ``status``. ``kind`` is
    the error's type name (by default the status's, :data:`ERROR_TYPES`)."""

    def __init__(
        self, message: str, *, status: int = 400, param: str | None = None, kind: str = ""
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.kind = kind or ERROR_TYPES.get(status, DEFAULT_ERROR_TYPE)

    def response(self) -> Response:
        return web_errors.error_response(
            self.status, self.message, self.kind, param=self.param, null_param=True
        )


error_factory = web_errors.status_error_factory(ERROR_TYPES, DEFAULT_ERROR_TYPE, null_param=True)
"""The server's and the router's errors (404, 405, 413, 400 for malformed HTTP, 500) in the
API's JSON shape."""
