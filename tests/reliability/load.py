"""Bounded streamed load through the gateway, every request classified: completed, ended
with a clear error (an SSE error event, or a JSON error status), or hung (no answer within
the client's timeout, which is longer than the gateway's request deadline)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable

import httpx

from tests.reliability.cluster import MODEL

CLIENT_TIMEOUT_S = 30.0
"""Longer than the suite's ``request_timeout_s`` (20 s): a request still open then hangs."""


def classify(status: int, text: str) -> str:
    if status == 200:
        events = [e.removeprefix("data: ") for e in text.split("\n\n") if e.strip()]
        if events and events[-1] == "[DONE]" and not any('"error"' in e for e in events):
            return "ok"
        if any(json.loads(e).get("error") for e in events[:-1] if e.startswith("{")):
            return "stream_error"
        return "truncated"
    body = json.loads(text)
    assert body["error"]["code"] == status, text
    return f"http_{status}"


async def one(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> tuple[str, str]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    try:
        resp = await client.post("/v1/completions", json=body)
    except httpx.TimeoutException:
        return "hang", ""
    except httpx.TransportError as exc:
        return f"broken:{type(exc).__name__}", ""
    return classify(resp.status_code, resp.text), resp.headers.get("x-conductor-prefill", "")


async def run_load(
    url: str,
    *,
    seconds: float,
    concurrency: int,
    max_tokens: int = 24,
    events: list[tuple[float, Callable[[], None]]] = (),  # type: ignore[assignment]
) -> Counter[str]:
    """``concurrency`` workers send requests back to back for ``seconds``; ``events`` run
    (in a thread) at their offsets. Outcomes counted by kind."""
    outcomes: Counter[str] = Counter()
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S, limits=limits) as c:

        async def worker(w: int) -> None:
            i = 0
            while time.monotonic() - t0 < seconds:
                kind, _ = await one(c, f"worker {w} request {i} says hello", max_tokens)
                outcomes[kind] += 1
                i += 1

        async def scheduled(at: float, fn: Callable[[], None]) -> None:
            await asyncio.sleep(at)
            await asyncio.to_thread(fn)

        await asyncio.gather(
            *(worker(w) for w in range(concurrency)),
            *(scheduled(at, fn) for at, fn in events),
        )
    return outcomes
