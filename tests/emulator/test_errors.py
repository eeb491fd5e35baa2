"""The emulator's errors, byte for byte: vLLM's type names and ``"param": null``."""

from __future__ import annotations

from conductor.emulator.errors import ApiError, error_factory


def test_a_refused_request_names_its_field() -> None:
    r = ApiError("n must be 1", param="n").response()
    assert (r.status, r.media_type, r.headers) == (400, "application/json", None)
    assert r.body == (
        b'{"error":{"message":"n must be 1","type":"BadRequestError","param":"n","code":400}}'
    )


def test_param_is_null_when_no_field_is_at_fault() -> None:
    r = ApiError("busy", status=409).response()
    assert r.body == b'{"error":{"message":"busy","type":"ConflictError","param":null,"code":409}}'


def test_the_servers_own_errors_take_the_same_shape() -> None:
    r = error_factory(405, "method not allowed", {"allow": "GET"})
    assert (r.status, r.headers) == (405, {"allow": "GET"})
    assert r.body == (
        b'{"error":{"message":"method not allowed","type":"MethodNotAllowedError",'
        b'"param":null,"code":405}}'
    )
    other = error_factory(431, "headers too large", None)
    assert b'"type":"BadRequestError"' in other.body and b'"code":431' in other.body
