"""One streamed OpenAI completion, timed: the client side of ``conductor profile`` and
``conductor replay``.

:func:`stream_completion` POSTs a JSON body (``"stream": true``) with
:class:`~conductor.web.client.RawHttpClient` and reads the server-sent events as they arrive,
stamping each ``data:`` event with ``time.perf_counter()`` when its bytes came in (events that
arrived in one read share a stamp). A non-200 answer, a stream without ``data: [DONE]`` or a
transport error comes back as :attr:`StreamResult.error`, never as an exception, so a load
generator can count it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from conductor.web.client import RawHttpClient

ERROR_BODY_CHARS = 300
"""How much of an error answer's body :attr:`StreamResult.error` keeps."""


@dataclass(slots=True)
class StreamResult:
    """What one streamed completion did (times from ``time.perf_counter()``).

    ``token_times_s``: the arrival of each ``data:`` event carrying generated output (one per
    token for vLLM and the emulator); ``token_counts``: the ``completion_tokens`` each of
    those events reported, when the server streams usage with every event
    (``stream_options.continuous_usage_stats``); ``usage``: the last event's ``usage``
    object, if the server sent one (``stream_options.include_usage``); ``headers``: the
    answer's headers.
    """

    sent_s: float
    status: int = 0
    token_times_s: list[float] = field(default_factory=list)
    token_counts: list[int] = field(default_factory=list)
    usage: Mapping[str, Any] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    error: str | None = None
    done_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def first_token_s(self) -> float | None:
        return self.token_times_s[0] if self.token_times_s else None

    @property
    def cached_tokens(self) -> int | None:
        """``usage.prompt_tokens_details.cached_tokens`` when the server reported it."""
        details = (self.usage or {}).get("prompt_tokens_details")
        if isinstance(details, Mapping):
            cached = details.get("cached_tokens")
            if isinstance(cached, int):
                return cached
        return None


def _is_token(event: Mapping[str, Any]) -> bool:
    """An event of generated output: it has a choice (its text may be empty while a
    multi-byte character is incomplete); the usage-only last event has none."""
    choices = event.get("choices")
    return isinstance(choices, list) and bool(choices)


async def stream_completion(
    client: RawHttpClient,
    url: str,
    body: Mapping[str, Any],
    *,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
) -> StreamResult:
    """POST ``body`` to ``url`` and time the streamed answer (see the module docstring);
    the whole exchange may take ``timeout_s`` at most."""
    payload = json.dumps(body).encode()
    sent = time.perf_counter()
    result = StreamResult(sent_s=sent)
    deadline = asyncio.get_running_loop().time() + timeout_s
    try:
        response = await client.post(url, payload, headers, deadline)
    except (httpx.HTTPError, TimeoutError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.status = response.status_code
    result.headers = dict(response.headers)
    try:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            result.error = f"HTTP {response.status_code}: {text[:ERROR_BODY_CHARS]}"
            return result
        await _read_events(response.chunks(deadline), result)
    except (httpx.HTTPError, TimeoutError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        await response.aclose()
    return result


async def _read_events(chunks: AsyncIterator[bytes], result: StreamResult) -> None:
    pending = b""
    done = False
    async for chunk in chunks:
        now = time.perf_counter()
        pending += chunk
        *events, pending = pending.split(b"\n\n")
        for raw in events:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                result.done_s = now
                continue
            try:
                event = json.loads(data)
            except ValueError:
                result.error = f"not JSON: {data[:80]!r}"
                return
            if not isinstance(event, dict):
                continue
            if "error" in event:
                result.error = f"stream error: {json.dumps(event['error'])[:ERROR_BODY_CHARS]}"
                return
            usage = event.get("usage")
            if isinstance(usage, dict):
                result.usage = usage
            if _is_token(event):
                result.token_times_s.append(now)
                count = usage.get("completion_tokens") if isinstance(usage, dict) else None
                if isinstance(count, int):
                    result.token_counts.append(count)
    if not done:
        result.error = f"stream ended without [DONE] after {len(result.token_times_s)} tokens"
