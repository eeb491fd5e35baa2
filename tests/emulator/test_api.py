"""The emulator over real HTTP (conductor.web on 127.0.0.1): vLLM's OpenAI API shapes, usage,
metrics, the P/D ``kv_transfer_params`` flow and JSON errors."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from conductor.emulator.api import MAX_BODY_BYTES
from conductor.emulator.config import EmulatorConfig
from conductor.emulator.tokenizer import ByteTokenizer, output_tokens
from tests.emulator.helpers import EmulatorThread, metric, running_emulator

PROMPT = "The quick brown fox jumps over the lazy dog. " * 3  # 135 bytes = 135 tokens


@pytest.fixture(scope="module")
def emu() -> Iterator[EmulatorThread]:
    with running_emulator(EmulatorConfig(instant=True, model_name="tiny", seed=5)) as server:
        yield server


@pytest.fixture
def client(emu: EmulatorThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=emu.base_url, timeout=10.0) as c:
        yield c


def sse(response: httpx.Response) -> list[Any]:
    """The ``data:`` payloads of an SSE body, ``[DONE]`` as the string."""
    assert response.headers["content-type"].startswith("text/event-stream")
    out: list[Any] = []
    for block in response.text.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def expected_text(prompt: str, n: int, seed: int = 5) -> str:
    tok = ByteTokenizer()
    return "".join(output_tokens(tok, seed, tok.encode(prompt), n)[1])


def test_health_models_version(client: httpx.Client) -> None:
    assert client.get("/health").status_code == 200
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert models["data"][0]["max_model_len"] == 8192
    assert "version" in client.get("/version").json()
    info = client.get("/emulator/info").json()
    assert (info["role"], info["block_size"], info["tokenizer"]) == ("both", 32, "bytes")


def test_completion_non_streaming(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 7})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-") and body["model"] == "tiny"
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert choice["text"] == expected_text(PROMPT, 7)
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        135,
        7,
        142,
    )
    assert body["kv_transfer_params"] is None


def test_completion_is_deterministic_and_seedable(client: httpx.Client) -> None:
    def text(**extra: object) -> str:
        body = {"prompt": "same prompt", "max_tokens": 12, **extra}
        return str(client.post("/v1/completions", json=body).json()["choices"][0]["text"])

    assert text() == text(temperature=1.5, top_p=0.3) == expected_text("same prompt", 12)
    assert text(seed=1) == expected_text("same prompt", 12, seed=1) != text()


def test_completion_streaming_with_usage(client: httpx.Client) -> None:
    body = {
        "prompt": PROMPT,
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = sse(client.post("/v1/completions", json=body))
    assert chunks[-1] == "[DONE]"
    tokens, usage_chunk = chunks[:-2], chunks[-2]
    assert len(tokens) == 5
    assert all(c["object"] == "text_completion" for c in tokens)
    assert len({c["id"] for c in chunks[:-1]}) == 1
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 4 + ["length"]
    assert "".join(c["choices"][0]["text"] for c in tokens) == expected_text(PROMPT, 5)
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 5
    assert usage_chunk["usage"]["prompt_tokens"] == 135


def test_streamed_bytes(client: httpx.Client) -> None:
    """The exact SSE body: compact JSON, vLLM's field order, the usage event, ``[DONE]``."""
    prompt = "a prompt no other test sends, so nothing of it is cached"  # 56 tokens
    body = {
        "prompt": prompt,
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    raw = client.post("/v1/completions", json=body).content
    first = json.loads(raw.split(b"\n\n", 1)[0][len(b"data: ") :])
    head = {"id": first["id"], "object": "text_completion", "created": first["created"]}
    head["model"] = "tiny"
    texts = output_tokens(ByteTokenizer(), 5, list(prompt.encode()), 3)[1]
    events = [
        {
            **head,
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": None if k < 2 else "length",
                    "stop_reason": None,
                }
            ],
        }
        for k, text in enumerate(texts)
    ]
    usage = {
        "prompt_tokens": 56,
        "total_tokens": 59,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    events.append({**head, "choices": [], "usage": usage})
    compact = [json.dumps(e, separators=(",", ":"), ensure_ascii=False) for e in events]
    want = "".join(f"data: {e}\n\n" for e in compact) + "data: [DONE]\n\n"
    assert raw == want.encode()


def test_streaming_without_usage_and_with_continuous_usage(client: httpx.Client) -> None:
    chunks = sse(
        client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": True})
    )
    assert len(chunks) == 3 and all("usage" not in c for c in chunks[:-1])
    body = {
        "prompt": "hi",
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"continuous_usage_stats": True},
    }
    chunks = sse(client.post("/v1/completions", json=body))
    assert [c["usage"]["completion_tokens"] for c in chunks[:-1]] == [1, 2, 3]


def test_token_id_prompts(client: httpx.Client) -> None:
    ids = list(PROMPT.encode())
    for prompt in (ids, [ids], [PROMPT]):
        r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == 135


def test_chat_completion(client: httpx.Client) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "there"}],
        },
    ]
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_completion_tokens": 4})
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "length"
    rendered = "<|system|>\nbe brief\n<|user|>\nhello there\n<|assistant|>\n"
    assert choice["message"]["content"] == expected_text(rendered, 4)
    assert body["usage"]["prompt_tokens"] == len(rendered)
    assert body["usage"]["completion_tokens"] == 4


def test_chat_streaming(client: httpx.Client) -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = sse(client.post("/v1/chat/completions", json=body))
    assert chunks[-1] == "[DONE]"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks[:-1])
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"]["content"] for c in chunks[1:4]]
    assert "".join(deltas) == expected_text("<|user|>\nhi\n<|assistant|>\n", 3)
    assert chunks[3]["choices"][0]["finish_reason"] == "length"
    assert chunks[4]["usage"]["total_tokens"] == chunks[4]["usage"]["prompt_tokens"] + 3


def test_prefix_cache_hits_rise_on_a_repeated_prompt(client: httpx.Client) -> None:
    prompt = "a fresh prompt for the cache test, long enough for several blocks " * 2  # 132
    queries0 = metric(client, "vllm:prefix_cache_queries_total")
    hits0 = metric(client, "vllm:prefix_cache_hits_total")
    prompt0 = metric(client, "vllm:prompt_tokens_total")
    first = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1}).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert metric(client, "vllm:prefix_cache_hits_total") == hits0
    second = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1}).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 128
    assert metric(client, "vllm:prefix_cache_hits_total") == hits0 + 128
    assert metric(client, "vllm:prefix_cache_queries_total") == queries0 + 2 * 132
    assert metric(client, "vllm:prompt_tokens_total") == prompt0 + 2 * 132


def test_metrics_exposition(client: httpx.Client) -> None:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:external_prefix_cache_hits_total",
    ):
        assert metric(client, name) >= 0
    assert "# TYPE vllm:prefix_cache_hits counter" in r.text
    assert "# TYPE vllm:num_requests_running gauge" in r.text
    assert 'model_name="tiny"' in r.text
    assert metric(client, "vllm:num_requests_running") == 0  # idle between tests
    assert metric(client, "vllm:kv_cache_usage_perc") == 0
    assert 'vllm:cache_config_info{model_name="tiny",engine="0",block_size="32"' in r.text


def test_pd_flow_prefill_leg_then_decode_leg(client: httpx.Client, emu: EmulatorThread) -> None:
    prompt = "disaggregated prefill and decode prompt " * 4  # 160 tokens, 4 full blocks
    prefill = client.post(
        "/v1/completions",
        json={
            "prompt": prompt,
            "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
        },
    ).json()
    kv = prefill["kv_transfer_params"]
    assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
    assert kv["remote_engine_id"] == emu.emulator.config.engine_id
    assert kv["remote_request_id"] and kv["remote_port"] == emu.emulator.config.port
    assert len(kv["remote_block_ids"]) == 5  # the KV of all 160 prompt tokens: 5 full blocks
    # The decode leg goes to another engine (a fresh prompt here, so nothing is local).
    ext0 = metric(client, "vllm:external_prefix_cache_hits_total")
    decode_prompt = "another prompt whose prefill happened elsewhere " * 3  # 147 tokens
    decode = client.post(
        "/v1/completions",
        json={"prompt": decode_prompt, "max_tokens": 4, "kv_transfer_params": kv},
    ).json()
    assert decode["kv_transfer_params"] is None
    assert decode["usage"]["completion_tokens"] == 4
    assert metric(client, "vllm:external_prefix_cache_hits_total") == ext0 + 128


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions", {"prompt": "x", "model": "other"}, 404, "model"),
        ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
        ("/v1/completions", {"prompt": ""}, 400, "prompt"),
        ("/v1/completions", {"prompt": 5}, 400, "prompt"),
        ("/v1/completions", {"prompt": [1, 300]}, 400, "prompt"),
        ("/v1/completions", {"prompt": [1, True]}, 400, "prompt"),
        ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "max_tokens": "3"}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 9000}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "n": 2}, 400, "n"),
        ("/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "stream"),
        ("/v1/completions", {"prompt": "x", "echo": True}, 400, "echo"),
        ("/v1/completions", {"prompt": "x", "kv_transfer_params": [1]}, 400, "kv_transfer_params"),
        ("/v1/completions", {"prompt": "x", "stream_options": 1}, 400, "stream_options"),
        ("/v1/completions", {"prompt": "x", "seed": -1}, 400, "seed"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"content": "no role"}]}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, 400, "messages"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            400,
            "messages",
        ),
    ],
)
def test_bad_requests_get_json_errors(
    client: httpx.Client, path: str, body: dict[str, Any], status: int, param: str
) -> None:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == status and error["param"] == param and error["message"]
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")


def test_malformed_bodies_and_routes(client: httpx.Client) -> None:
    r = client.post("/v1/completions", content=b"{not json")
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = client.post("/v1/completions", content=b"[1, 2]")
    assert r.status_code == 400 and r.json()["error"]["message"] == "the body must be a JSON object"
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == 404
    r = client.get("/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == 405
    assert metric(client, "vllm:num_requests_running") == 0


def test_oversized_body_gets_a_json_413(emu: EmulatorThread) -> None:
    """Declared over the limit, with ``Expect: 100-continue``: refused before the body."""
    port = emu.emulator.config.port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nexpect: 100-continue\r\n\r\n" % (MAX_BODY_BYTES + 1)
        )
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ")
    assert b"content-type: application/json" in head.lower()
    assert json.loads(body) == {
        "error": {
            "message": f"request body of {MAX_BODY_BYTES + 1} bytes exceeds the limit of "
            f"{MAX_BODY_BYTES}",
            "type": "RequestTooLargeError",
            "param": None,
            "code": 413,
        }
    }


def test_reset_prefix_cache_when_idle(client: httpx.Client) -> None:
    client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
    assert metric(client, "conductor_emulator_cached_blocks") > 0
    assert client.post("/reset_prefix_cache").status_code == 200
    assert metric(client, "conductor_emulator_cached_blocks") == 0
