"""Parse and check OpenAI request bodies (``/v1/completions``, ``/v1/chat/completions``).

Only what the gateway needs is checked strictly (model, prompt or messages, lengths, stream
flags, the common sampling numbers); every other field is forwarded untouched and left to the
engine. Each problem raises :class:`~conductor.gateway.errors.BadRequest` naming the field.
Batched prompts (a list of several prompts) are not supported: one request, one schedule.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from conductor.gateway import json_codec
from conductor.gateway.config import DEFAULT_MAX_JSON_DEPTH, RequestLimits
from conductor.gateway.errors import BadRequest

Kind = Literal["completion", "chat"]
COMPLETION_DEFAULT_MAX_TOKENS = 16
"""vLLM's (and OpenAI's) ``max_tokens`` default for ``/v1/completions``."""


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A checked request. ``body`` is the client's JSON, forwarded with ``model`` rewritten.

    Exactly one of ``prompt_text`` / ``prompt_ids`` is set for completions; ``messages`` for
    chat (content parts flattened to text, as vLLM does for string chat templates).
    ``max_tokens`` is the client's explicit output limit (None: the engine's default).
    """

    kind: Kind
    body: dict[str, object]
    model: str
    stream: bool
    max_tokens: int | None
    n: int = 1
    prompt_text: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    messages: tuple[dict[str, object], ...] = ()
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, object] = field(default_factory=dict)
    tools: tuple[object, ...] | None = None
    cache_salt: str | None = None


_STRUCTURE = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')
"""A JSON string (skipped whole) or a bracket."""


def json_depth(raw: bytes, limit: int) -> int:
    """How deeply ``raw`` nests arrays and objects, counted up to ``limit + 1`` (linear; a
    body with few brackets costs two ``bytes.count``)."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return 0
    depth = deepest = 0
    for match in _STRUCTURE.finditer(raw):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif token in (b"]", b"}"):
            depth -= 1
    return deepest


def parse_json(raw: bytes, *, max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> dict[str, object]:
    """The body as a JSON object (one strict parse: no NaN, numbers in range, UTF-8, at most
    ``max_depth`` levels of nesting), or :class:`BadRequest`."""
    if not raw.strip():
        raise BadRequest("request body is empty; expected a JSON object")
    if json_depth(raw, max_depth) > max_depth:
        raise BadRequest(f"request body nests deeper than {max_depth} levels (max_json_depth)")
    try:
        value = json_codec.decode(raw)
    except json_codec.JsonError as exc:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest("request body is not UTF-8 text") from None
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # (the depth check above should have caught it)
        raise BadRequest("request body nests too deeply") from None
    if not isinstance(value, dict):
        raise BadRequest(f"request body must be a JSON object, got {_json_type(value)}")
    return value


def parse_request(
    kind: Kind, body: dict[str, object], limits: RequestLimits | None = None
) -> ParsedRequest:
    limits = limits if limits is not None else RequestLimits()
    return parse_completion(body, limits) if kind == "completion" else parse_chat(body, limits)


def parse_completion(body: dict[str, object], limits: RequestLimits | None = None) -> ParsedRequest:
    common = _common(body, limits or RequestLimits())
    if "prompt" not in body or body["prompt"] is None:
        raise BadRequest("'prompt' is required", param="prompt")
    text, ids = _prompt(body["prompt"])
    return ParsedRequest(
        kind="completion",
        body=body,
        model=common.model,
        stream=common.stream,
        max_tokens=common.max_tokens,
        n=common.n,
        cache_salt=common.cache_salt,
        prompt_text=text,
        prompt_ids=ids,
        add_special_tokens=_opt_bool(body, "add_special_tokens", True),
    )


def parse_chat(body: dict[str, object], limits: RequestLimits | None = None) -> ParsedRequest:
    limits = limits or RequestLimits()
    common = _common(body, limits)
    raw = body.get("messages")
    if raw is None:
        raise BadRequest("'messages' is required", param="messages")
    if not isinstance(raw, list):
        raise BadRequest(f"'messages' must be an array, got {_json_type(raw)}", param="messages")
    if not raw:
        raise BadRequest("'messages' must not be empty", param="messages")
    messages = tuple(_message(m, i) for i, m in enumerate(raw))
    kwargs = _template_kwargs(body, limits.allowed_template_kwargs)
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest(f"'tools' must be an array, got {_json_type(tools)}", param="tools")
    add_generation_prompt = _opt_bool(body, "add_generation_prompt", True)
    continue_final = _opt_bool(body, "continue_final_message", False)
    if add_generation_prompt and continue_final and "add_generation_prompt" in body:
        raise BadRequest(
            "'continue_final_message' and 'add_generation_prompt' cannot both be true",
            param="continue_final_message",
        )
    return ParsedRequest(
        kind="chat",
        body=body,
        model=common.model,
        stream=common.stream,
        max_tokens=common.max_tokens,
        n=common.n,
        cache_salt=common.cache_salt,
        messages=messages,
        add_special_tokens=_opt_bool(body, "add_special_tokens", False),
        add_generation_prompt=add_generation_prompt and not continue_final,
        continue_final_message=continue_final,
        chat_template_kwargs=kwargs,
        tools=None if tools is None else tuple(tools),
    )


def _template_kwargs(body: Mapping[str, object], allowed: tuple[str, ...]) -> dict[str, object]:
    """``chat_template_kwargs``, only with ``allowed`` keys: a client's template (``chat_template``
    here or at the top level) would run arbitrary Jinja in the gateway and in the engine."""
    if body.get("chat_template") is not None:
        raise BadRequest(
            "'chat_template' is not accepted: the model's own template is used",
            param="chat_template",
        )
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise BadRequest(
            f"'chat_template_kwargs' must be an object, got {_json_type(kwargs)}",
            param="chat_template_kwargs",
        )
    for key in kwargs:
        if key not in allowed:
            raise BadRequest(
                f"'chat_template_kwargs.{key}' is not accepted; allowed: {', '.join(allowed)}",
                param=f"chat_template_kwargs.{key}",
            )
    return dict(kwargs)


@dataclass(frozen=True, slots=True)
class _Common:
    model: str
    stream: bool
    max_tokens: int | None
    n: int
    cache_salt: str | None


def _common(body: dict[str, object], limits: RequestLimits) -> _Common:
    model = body.get("model")
    if model is None:
        raise BadRequest("'model' is required", param="model")
    if not isinstance(model, str) or not model:
        raise BadRequest(
            f"'model' must be a non-empty string, got {_json_type(model)}", param="model"
        )
    stream = _opt_bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise BadRequest(
                f"'stream_options' must be an object, got {_json_type(options)}",
                param="stream_options",
            )
        if not stream:
            raise BadRequest(
                "'stream_options' is only allowed when 'stream' is true", param="stream_options"
            )
    max_tokens = _opt_int(body, "max_tokens", minimum=1)
    max_completion = _opt_int(body, "max_completion_tokens", minimum=1)
    if max_completion is not None:
        max_tokens = max_completion if max_tokens is None else min(max_tokens, max_completion)
    n = _opt_int(body, "n", minimum=1)
    if n is not None and n > limits.max_n:
        raise BadRequest(f"'n' must be <= {limits.max_n}, got {n}", param="n")
    _opt_number(body, "temperature", low=0.0)
    _opt_number(body, "top_p", low=0.0, high=1.0, low_open=True)
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise BadRequest(
            f"'cache_salt' must be a non-empty string, got {_json_type(salt)}", param="cache_salt"
        )
    return _Common(model, stream, max_tokens, 1 if n is None else n, salt)


def _prompt(value: object) -> tuple[str | None, tuple[int, ...] | None]:
    if isinstance(value, str):
        if not value:
            raise BadRequest("'prompt' must not be empty", param="prompt")
        return value, None
    if isinstance(value, list):
        if not value:
            raise BadRequest("'prompt' must not be empty", param="prompt")
        if all(_is_int(v) for v in value):
            ids = tuple(int(v) for v in value)
            if any(i < 0 for i in ids):
                raise BadRequest("'prompt' token ids must be >= 0", param="prompt")
            return None, ids
        if len(value) == 1 and isinstance(value[0], str | list):
            return _prompt(value[0])
        if all(isinstance(v, str) for v in value) or all(isinstance(v, list) for v in value):
            raise BadRequest(
                "batched prompts (a list of several prompts) are not supported; "
                "send one request per prompt",
                param="prompt",
            )
    raise BadRequest(
        f"'prompt' must be a string or an array of token ids, got {_json_type(value)}",
        param="prompt",
    )


def _message(value: object, index: int) -> dict[str, object]:
    where = f"messages[{index}]"
    if not isinstance(value, dict):
        raise BadRequest(f"'{where}' must be an object, got {_json_type(value)}", param=where)
    role = value.get("role")
    if not isinstance(role, str) or not role:
        raise BadRequest(f"'{where}.role' must be a non-empty string", param=f"{where}.role")
    content = value.get("content")
    out = dict(value)
    if content is None:
        if role != "assistant" or "tool_calls" not in value:
            raise BadRequest(f"'{where}.content' is required", param=f"{where}.content")
    elif isinstance(content, list):
        out["content"] = _text_parts(content, f"{where}.content")
    elif not isinstance(content, str):
        raise BadRequest(
            f"'{where}.content' must be a string or an array of parts, got {_json_type(content)}",
            param=f"{where}.content",
        )
    return out


def _text_parts(parts: list[object], where: str) -> str:
    texts: list[str] = []
    for i, part in enumerate(parts):
        if not isinstance(part, dict) or part.get("type") != "text":
            raise BadRequest(
                f"'{where}[{i}]' must be a text part; the gateway serves text-only models",
                param=f"{where}[{i}]",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise BadRequest(f"'{where}[{i}].text' must be a string", param=f"{where}[{i}].text")
        texts.append(text)
    return "\n".join(texts)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _opt_bool(body: Mapping[str, object], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"'{key}' must be a boolean, got {_json_type(value)}", param=key)
    return value


def _opt_int(body: Mapping[str, object], key: str, *, minimum: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not _is_int(value):
        raise BadRequest(f"'{key}' must be an integer, got {_json_type(value)}", param=key)
    assert isinstance(value, int)
    if value < minimum:
        raise BadRequest(f"'{key}' must be >= {minimum}, got {value}", param=key)
    return value


def _opt_number(
    body: Mapping[str, object],
    key: str,
    *,
    low: float,
    high: float | None = None,
    low_open: bool = False,
) -> None:
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(f"'{key}' must be a number, got {_json_type(value)}", param=key)
    too_low = value <= low if low_open else value < low
    if too_low or (high is not None and value > high):
        bounds = f"{'(' if low_open else '['}{low:g}, {'inf' if high is None else f'{high:g}'}]"
        raise BadRequest(f"'{key}' must be in {bounds}, got {value}", param=key)


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__
