"""The demo's load: a few conversations that share system prompts and grow turn by turn,
sent as streaming chat completions through the gateway, a few at a time."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import httpx

from conductor.hf.words import WORDS

SYSTEM_PROMPTS = (
    "You are a scheduling assistant for a large serving cluster. ",
    "You answer questions about caches, networks and latency. ",
)


@dataclass(frozen=True, slots=True)
class Outcome:
    conversation: int
    turn: int
    status: int
    prefill: str
    decode: str
    cached_tokens: int
    prompt_tokens: int
    ttft_ms: float
    total_ms: float
    error: str = ""


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def conversations(n: int, turns: int, seed: int) -> list[list[list[dict[str, str]]]]:
    """For each conversation, the message list of every turn (history grows)."""
    rng = random.Random(seed)
    out = []
    for c in range(n):
        system = SYSTEM_PROMPTS[c % len(SYSTEM_PROMPTS)] + " ".join(
            _sentence(random.Random(c % len(SYSTEM_PROMPTS)), 12) for _ in range(30)
        )
        history: list[dict[str, str]] = [{"role": "system", "content": system}]
        per_turn = []
        for _ in range(turns):
            history = [*history, {"role": "user", "content": _sentence(rng, 25)}]
            per_turn.append(list(history))
            history = [*history, {"role": "assistant", "content": _sentence(rng, 15)}]
        out.append(per_turn)
    return out


async def _one(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    conv: int,
    turn: int,
    msgs: list[dict[str, str]],
) -> Outcome:
    body = {
        "model": model,
        "messages": msgs,
        "max_tokens": 24,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
    }
    t0 = time.perf_counter()
    ttft = 0.0
    prompt_tokens = 0
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")[:200]
                return Outcome(
                    conv,
                    turn,
                    r.status_code,
                    "-",
                    "-",
                    0,
                    0,
                    0.0,
                    (time.perf_counter() - t0) * 1e3,
                    text,
                )
            async for line in r.aiter_lines():
                if line.startswith("data: ") and not ttft:
                    ttft = (time.perf_counter() - t0) * 1e3
                if '"prompt_tokens"' in line:
                    import json

                    usage = json.loads(line[6:]).get("usage") or {}
                    prompt_tokens = int(usage.get("prompt_tokens", 0))
            h = r.headers
            return Outcome(
                conv,
                turn,
                200,
                h.get("x-conductor-prefill", "?"),
                h.get("x-conductor-decode", "?"),
                int(h.get("x-conductor-cached-tokens", "0")),
                prompt_tokens,
                ttft,
                (time.perf_counter() - t0) * 1e3,
            )
    except httpx.HTTPError as exc:
        return Outcome(
            conv, turn, 0, "-", "-", 0, 0, 0.0, (time.perf_counter() - t0) * 1e3, str(exc)
        )


async def run_load(url: str, model: str, n_conv: int, turns: int, seed: int) -> list[Outcome]:
    """Conversations run concurrently; each sends its turns in order."""
    convs = conversations(n_conv, turns, seed)
    async with httpx.AsyncClient(timeout=60.0) as client:

        async def conversation(i: int) -> list[Outcome]:
            res = []
            for t, msgs in enumerate(convs[i]):
                res.append(await _one(client, url, model, i, t, msgs))
            return res

        done = await asyncio.gather(*(conversation(i) for i in range(n_conv)))
    return sorted((o for c in done for o in c), key=lambda o: (o.turn, o.conversation))
