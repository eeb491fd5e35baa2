"""Which generation a request body asks for: the completions and chat bodies checked into a
:class:`Parsed` request, or an :class:`~conductor.emulator.errors.ApiError` naming the field.

Fields used: ``model`` (optional; must name the served model), ``prompt`` (string, token ids,
or a one-element list of either), ``messages`` (chat; ``content`` a string or text parts),
``max_tokens`` / ``max_completion_tokens`` (default :data:`DEFAULT_MAX_TOKENS`: the emulator
has no end-of-sequence token), ``stream``, ``stream_options.include_usage`` /
``continuous_usage_stats``, ``seed`` (the completion's seed; default the engine's), ``n``
(must be 1) and ``kv_transfer_params``. Sampling fields (temperature, top_p, stop, ...) are
accepted and ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from conductor.emulator.errors import ApiError
from conductor.emulator.service import Emulator
from conductor.emulator.tokenizer import chat_ids
from conductor.web.messages import Request

DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True, slots=True)
class Parsed:
    """A validated generation request."""

    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    seed: int | None
    kv_params: Mapping[str, Any] | None

    @property
    def remote_decode(self) -> bool:
        return bool(self.kv_params and self.kv_params.get("do_remote_decode"))

    @property
    def remote_prefill(self) -> bool:
        return bool(self.kv_params and self.kv_params.get("do_remote_prefill"))


def json_body(request: Request) -> dict[str, Any]:
    """The body as a JSON object (its size is bounded by the server)."""
    try:
        body = msgspec.json.decode(request.body)
    except msgspec.DecodeError as exc:
        raise ApiError(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError("the body must be a JSON object")
    return body


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _opt_int(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise ApiError(f"{name} must be an integer, got {value!r}", param=name)
    return int(value)


def _opt_bool(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(f"{name} must be a boolean, got {value!r}", param=name)
    return value


def _check_model(em: Emulator, body: Mapping[str, Any]) -> None:
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise ApiError(f"model must be a string, got {model!r}", param="model")
    if model != em.config.model_name:
        raise ApiError(f"The model `{model}` does not exist.", status=404, param="model")


def _token_ids(em: Emulator, value: list[Any]) -> list[int]:
    vocab = em.tokenizer.vocab_size
    for i, t in enumerate(value):
        if not _is_int(t):
            raise ApiError(
                f"prompt[{i}] must be a token id (an integer), got {t!r}", param="prompt"
            )
        if not 0 <= t < vocab:
            raise ApiError(
                f"token id {t} at prompt[{i}] is out of vocabulary (size {vocab})", param="prompt"
            )
    return [int(t) for t in value]


def _prompt_ids(em: Emulator, prompt: object) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str):
        return em.tokenizer.encode(prompt)
    if isinstance(prompt, list) and all(_is_int(t) for t in prompt):
        return _token_ids(em, prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        raise ApiError("the emulator serves one prompt per request", param="prompt")
    raise ApiError("prompt must be a string or a list of token ids", param="prompt")


def _message_text(content: object, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                parts.append(part["text"])
            else:
                raise ApiError(
                    f"messages[{index}].content: only text parts are supported", param="messages"
                )
        return "".join(parts)
    raise ApiError(f"messages[{index}].content must be a string or a list", param="messages")


def _chat_ids(em: Emulator, messages: object) -> list[int]:
    if not isinstance(messages, list) or not messages:
        raise ApiError("messages must be a non-empty list", param="messages")
    rendered: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(f"messages[{i}] must be an object with a role", param="messages")
        rendered.append({"role": m["role"], "content": _message_text(m.get("content"), i)})
    return chat_ids(em.tokenizer, rendered)


def parse(em: Emulator, body: Mapping[str, Any], *, chat: bool) -> Parsed:
    """Validate a completions (or chat) body into a :class:`Parsed` request."""
    _check_model(em, body)
    if chat:
        ids = _chat_ids(em, body.get("messages"))
        max_tokens = _opt_int(body, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = _opt_int(body, "max_tokens")
    else:
        if "prompt" not in body:
            raise ApiError("prompt is required", param="prompt")
        ids = _prompt_ids(em, body["prompt"])
        max_tokens = _opt_int(body, "max_tokens")
        if _opt_bool(body, "echo"):
            raise ApiError("echo is not supported by the emulator", param="echo")
    if not ids:
        raise ApiError("the prompt is empty", param="messages" if chat else "prompt")
    n = _opt_int(body, "n")
    if n is not None and n != 1:
        raise ApiError("the emulator supports only n=1", param="n")
    seed = _opt_int(body, "seed")
    if seed is not None and seed < 0:
        raise ApiError("seed must be >= 0", param="seed")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError("stream_options must be an object", param="stream_options")
    options = options or {}
    kv = body.get("kv_transfer_params")
    if kv is not None and not isinstance(kv, dict):
        raise ApiError("kv_transfer_params must be an object", param="kv_transfer_params")
    return Parsed(
        prompt_ids=ids,
        max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        stream=_opt_bool(body, "stream"),
        include_usage=_opt_bool(options, "include_usage"),
        continuous_usage=_opt_bool(options, "continuous_usage_stats"),
        seed=seed,
        kv_params=kv,
    )
