"""Request validation over real HTTP: every bad input gets its exact status and JSON error,
and never reaches an engine."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.gateway.harness import MAX_MODEL_LEN, client_for, engine, make_gateway

pytestmark = pytest.mark.anyio

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def err(message: str, param: str | None = None, status: int = 400) -> dict[str, object]:
    body: dict[str, object] = {"message": message, "type": "invalid_request_error"}
    if param is not None:
        body["param"] = param
    body["code"] = status
    return {"error": body}


def ok_transport(seen: list[httpx.Request]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method != "POST":  # health checks and load polls
            return httpx.Response(200, text="")
        seen.append(request)
        return httpx.Response(200, json={"choices": [{"text": "ok"}], "usage": {}})

    return httpx.MockTransport(handler)


CASES: list[tuple[str, str, object, int, dict[str, object]]] = [
    (
        "malformed_json",
        COMPLETIONS,
        b'{"model": "tiny",',
        400,
        err("request body is not valid JSON: Input data was truncated"),
    ),
    (
        "nan_is_not_json",
        COMPLETIONS,
        b'{"model": "tiny", "prompt": "hi", "temperature": NaN}',
        400,
        err("request body is not valid JSON: JSON is malformed: invalid character (byte 49)"),
    ),
    ("empty_body", COMPLETIONS, b"", 400, err("request body is empty; expected a JSON object")),
    (
        "not_object",
        COMPLETIONS,
        b"[1, 2]",
        400,
        err("request body must be a JSON object, got array"),
    ),
    ("not_utf8", COMPLETIONS, b"\xff\xfe{", 400, err("request body is not UTF-8 text")),
    ("missing_model", COMPLETIONS, {"prompt": "hi"}, 400, err("'model' is required", "model")),
    (
        "model_type",
        COMPLETIONS,
        {"model": 7, "prompt": "hi"},
        400,
        err("'model' must be a non-empty string, got number", "model"),
    ),
    ("missing_prompt", COMPLETIONS, {"model": "tiny"}, 400, err("'prompt' is required", "prompt")),
    (
        "prompt_type",
        COMPLETIONS,
        {"model": "tiny", "prompt": {"text": "hi"}},
        400,
        err("'prompt' must be a string or an array of token ids, got object", "prompt"),
    ),
    (
        "empty_prompt",
        COMPLETIONS,
        {"model": "tiny", "prompt": ""},
        400,
        err("'prompt' must not be empty", "prompt"),
    ),
    (
        "batched_prompts",
        COMPLETIONS,
        {"model": "tiny", "prompt": ["a", "b"]},
        400,
        err(
            "batched prompts (a list of several prompts) are not supported; send one request "
            "per prompt",
            "prompt",
        ),
    ),
    (
        "negative_token_id",
        COMPLETIONS,
        {"model": "tiny", "prompt": [5, -1]},
        400,
        err("'prompt' token ids must be >= 0", "prompt"),
    ),
    (
        "token_id_out_of_vocab",
        COMPLETIONS,
        {"model": "tiny", "prompt": [5, 5000]},
        400,
        err("token id 5000 in 'prompt' is out of the vocabulary (size 1200)", "prompt"),
    ),
    (
        "max_tokens_type",
        COMPLETIONS,
        {"model": "tiny", "prompt": "hi", "max_tokens": "5"},
        400,
        err("'max_tokens' must be an integer, got string", "max_tokens"),
    ),
    (
        "max_tokens_zero",
        COMPLETIONS,
        {"model": "tiny", "prompt": "hi", "max_tokens": 0},
        400,
        err("'max_tokens' must be >= 1, got 0", "max_tokens"),
    ),
    (
        "stream_type",
        COMPLETIONS,
        {"model": "tiny", "prompt": "hi", "stream": "yes"},
        400,
        err("'stream' must be a boolean, got string", "stream"),
    ),
    (
        "stream_options_without_stream",
        COMPLETIONS,
        {"model": "tiny", "prompt": "hi", "stream_options": {"include_usage": True}},
        400,
        err("'stream_options' is only allowed when 'stream' is true", "stream_options"),
    ),
    (
        "temperature_negative",
        COMPLETIONS,
        {"model": "tiny", "prompt": "hi", "temperature": -1},
        400,
        err("'temperature' must be in [0, inf], got -1", "temperature"),
    ),
    (
        "top_p_zero",
        COMPLETIONS,
        {"model": "tiny", "prompt": "hi", "top_p": 0},
        400,
        err("'top_p' must be in (0, 1], got 0", "top_p"),
    ),
    (
        "n_type",
        COMPLETIONS,
        {"model": "tiny", "prompt": "hi", "n": 1.5},
        400,
        err("'n' must be an integer, got number", "n"),
    ),
    (
        "prompt_too_long",
        COMPLETIONS,
        {"model": "tiny", "prompt": "x" * MAX_MODEL_LEN},
        400,
        err(
            f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your "
            f"request has {MAX_MODEL_LEN + 1} input tokens. Please reduce the length of the "
            "input.",
            "prompt",
        ),
    ),
    (
        "prompt_plus_max_tokens_too_long",
        COMPLETIONS,
        {"model": "tiny", "prompt": "x" * 199, "max_tokens": 100},
        400,
        err(
            f"'max_tokens' is too large: 100. This model's maximum context length is "
            f"{MAX_MODEL_LEN} tokens and your request has 200 input tokens (100 > "
            f"{MAX_MODEL_LEN} - 200).",
            "max_tokens",
        ),
    ),
    (
        "unknown_model",
        COMPLETIONS,
        {"model": "gpt-4", "prompt": "hi"},
        404,
        {
            "error": {
                "message": "The model `gpt-4` does not exist.",
                "type": "not_found_error",
                "param": "model",
                "code": 404,
            }
        },
    ),
    ("missing_messages", CHAT, {"model": "tiny"}, 400, err("'messages' is required", "messages")),
    (
        "messages_type",
        CHAT,
        {"model": "tiny", "messages": "hello"},
        400,
        err("'messages' must be an array, got string", "messages"),
    ),
    (
        "messages_empty",
        CHAT,
        {"model": "tiny", "messages": []},
        400,
        err("'messages' must not be empty", "messages"),
    ),
    (
        "message_not_object",
        CHAT,
        {"model": "tiny", "messages": ["hi"]},
        400,
        err("'messages[0]' must be an object, got string", "messages[0]"),
    ),
    (
        "message_without_role",
        CHAT,
        {"model": "tiny", "messages": [{"content": "hi"}]},
        400,
        err("'messages[0].role' must be a non-empty string", "messages[0].role"),
    ),
    (
        "message_content_type",
        CHAT,
        {"model": "tiny", "messages": [{"role": "user", "content": 5}]},
        400,
        err(
            "'messages[0].content' must be a string or an array of parts, got number",
            "messages[0].content",
        ),
    ),
    (
        "message_image_part",
        CHAT,
        {
            "model": "tiny",
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ],
        },
        400,
        err(
            "'messages[0].content[0]' must be a text part; the gateway serves text-only models",
            "messages[0].content[0]",
        ),
    ),
    (
        "chat_max_completion_tokens_type",
        CHAT,
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": True,
        },
        400,
        err("'max_completion_tokens' must be an integer, got boolean", "max_completion_tokens"),
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "expected"),
    [pytest.param(p, b, s, e, id=name) for name, p, b, s, e in CASES],
)
async def test_bad_request_gets_exact_error(
    path: str, body: object, status: int, expected: dict[str, object]
) -> None:
    seen: list[httpx.Request] = []
    gw = make_gateway([engine("e0", "http://127.0.0.1:9")], transport=ok_transport(seen))
    async with client_for(gw) as client:
        if isinstance(body, bytes):
            resp = await client.post(path, content=body)
        else:
            resp = await client.post(path, json=body)
    assert resp.status_code == status
    assert resp.headers["content-type"] == "application/json"
    assert resp.json() == expected
    assert seen == []
    assert gw.conductor.inflight() == 0


async def test_oversize_body_is_413_by_content_length_and_by_stream() -> None:
    seen: list[httpx.Request] = []
    gw = make_gateway(
        [engine("e0", "http://127.0.0.1:9")], transport=ok_transport(seen), max_body_bytes=2048
    )
    big = json.dumps({"model": "tiny", "prompt": "x" * 4000}).encode()

    async def chunks() -> object:
        for i in range(0, len(big), 512):
            yield big[i : i + 512]

    async with client_for(gw) as client:
        declared = await client.post(COMPLETIONS, content=big)
        streamed = await client.post(COMPLETIONS, content=chunks())  # chunked, no length
    assert declared.status_code == 413
    assert declared.json() == {
        "error": {
            "message": f"request body of {len(big)} bytes exceeds the limit of 2048",
            "type": "invalid_request_error",
            "code": 413,
        }
    }
    assert streamed.status_code == 413
    assert streamed.json()["error"]["message"] == "request body exceeds the limit of 2048 bytes"
    assert seen == []


async def test_unknown_route_and_wrong_method_are_json_errors() -> None:
    gw = make_gateway([engine("e0", "http://127.0.0.1:9")], transport=ok_transport([]))
    async with client_for(gw) as client:
        missing = await client.get("/v2/nothing")
        wrong = await client.get(COMPLETIONS)
    assert missing.status_code == 404
    assert missing.json() == {
        "error": {"message": "no route for /v2/nothing", "type": "not_found_error", "code": 404}
    }
    assert wrong.status_code == 405
    assert wrong.headers["allow"] == "POST"
    assert wrong.json() == {
        "error": {
            "message": "method GET is not allowed on /v1/completions",
            "type": "invalid_request_error",
            "code": 405,
        }
    }


async def test_valid_request_is_forwarded_with_the_engine_model_name() -> None:
    seen: list[httpx.Request] = []
    gw = make_gateway(
        [engine("e0", "http://10.0.0.1:8000", model="served-upstream")],
        transport=ok_transport(seen),
    )
    body = {"model": "tiny", "prompt": "hello there", "max_tokens": 3, "ignore_eos": True}
    async with client_for(gw) as client:
        resp = await client.post(COMPLETIONS, json=body)
        models = await client.get("/v1/models")
    assert resp.status_code == 200, resp.text
    assert [str(r.url) for r in seen] == ["http://10.0.0.1:8000/v1/completions"]
    assert json.loads(seen[0].content) == {**body, "model": "served-upstream"}
    assert models.json()["data"][0]["id"] == "tiny"
    assert models.json()["data"][0]["max_model_len"] == MAX_MODEL_LEN
    assert gw.conductor.inflight() == 0
