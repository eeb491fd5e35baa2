"""The open-loop replay: each request sent at its (scaled) arrival time, streamed and timed.

:class:`Replayer` keeps every finished request in :attr:`Replayer.outcomes` as it finishes,
so a caller interrupted half-way (Ctrl-C) still has them. Times in an :class:`Outcome` are
seconds since the replay started (``time.perf_counter()`` based).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from conductor.core.types import Request
from conductor.replay.config import ReplayConfig
from conductor.web.client import RawHttpClient, Timeouts
from conductor.web.sse_client import stream_completion
from conductor.workload.prompts import DEFAULT_POOL, BlockPrompts

OnDone = Callable[["Outcome"], None]


@dataclass(frozen=True, slots=True)
class Outcome:
    """One replayed request. ``arrival_s``: when it was due; ``sent_s``: when it was sent;
    ``token_times_s``: each streamed token's arrival; ``error``: why it failed (``status``
    429: the endpoint rejected it); ``cached_tokens``: the endpoint's
    ``usage.prompt_tokens_details.cached_tokens``, else its ``x-conductor-cached-tokens``
    header, else None; ``prefill``/``decode``: the gateway's ``x-conductor-*`` headers;
    ``queued_s``/``predicted_ttft_s``: how long the gateway held it before placing it and
    the TTFT it predicted then (``x-conductor-queued-ms``, ``x-conductor-predicted-ttft-ms``;
    None from an endpoint without them)."""

    request_id: str
    arrival_s: float
    sent_s: float
    prompt_tokens: int
    output_tokens: int
    status: int
    token_times_s: tuple[float, ...]
    done_s: float | None
    cached_tokens: int | None
    error: str | None
    prefill: str | None = None
    decode: str | None = None
    queued_s: float | None = None
    predicted_ttft_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.token_times_s)

    @property
    def ttft_s(self) -> float | None:
        """First token minus the due time (open loop: a late send counts)."""
        return self.token_times_s[0] - self.arrival_s if self.ok else None


def _header_int(headers: dict[str, str], name: str) -> int | None:
    value = headers.get(name, "")
    return int(value) if value.isdigit() else None


def _header_ms(headers: dict[str, str], name: str) -> float | None:
    """A header in milliseconds, in seconds (None: absent or not a finite number >= 0)."""
    try:
        ms = float(headers.get(name, ""))
    except ValueError:
        return None
    return ms / 1e3 if math.isfinite(ms) and ms >= 0.0 else None


class Replayer:
    """Replays ``requests`` (arrival-sorted) against ``cfg.url`` serving ``model``."""

    def __init__(
        self,
        cfg: ReplayConfig,
        model: str,
        requests: Sequence[Request],
        outputs: Sequence[int],
        *,
        pool: Sequence[int] = DEFAULT_POOL,
        on_done: OnDone | None = None,
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.requests = list(requests)
        self.outputs = list(outputs)  # the trace's output length of each request
        if len(self.outputs) != len(self.requests):
            raise ValueError("one output length per request")
        self.prompts = BlockPrompts(cfg.tokens_per_block, pool, seed=cfg.seed)
        self.on_done = on_done or (lambda outcome: None)
        self.outcomes: list[Outcome] = []
        self.started_at: float | None = None
        self.client = RawHttpClient(
            Timeouts(connect_s=10.0, read_s=cfg.timeout_s, pool_s=cfg.timeout_s),
            max_connections_per_host=4096,
            max_idle=1024,
        )

    def prompt(self, index: int, request: Request) -> list[int]:
        """The token ids of ``request``: its blocks, padded with blocks of its own (negative
        ids, unique to it) when its hash ids cannot cover the scaled length."""
        n = self.cfg.prompt_tokens(request.prompt_tokens)
        ids = [int(h) for h in request.block_hashes]
        per = self.cfg.tokens_per_block
        missing = -(-n // per) - len(ids)
        if missing > 0:
            ids += [-(index * 1_000_000 + k + 1) for k in range(missing)]
        return self.prompts.prompt(ids, n)

    def elapsed(self) -> float:
        assert self.started_at is not None
        return time.perf_counter() - self.started_at

    async def run(self) -> list[Outcome]:
        """Send every request at its time; returns when all have finished."""
        self.started_at = time.perf_counter()
        origin = self.requests[0].arrival_s if self.requests else 0.0
        tasks: list[asyncio.Task[None]] = []
        try:
            for i, req in enumerate(self.requests):
                due = req.arrival_s - origin
                wait = due - self.elapsed()
                if wait > 0:
                    await asyncio.sleep(wait)
                tasks.append(asyncio.create_task(self.one(i, req, due)))
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await self.client.aclose()
        return self.outcomes

    async def one(self, index: int, req: Request, due: float) -> None:
        prompt = self.prompt(index, req)
        max_tokens = self.cfg.output_tokens(self.outputs[index] or 1)
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        assert self.started_at is not None
        t0 = self.started_at
        r = await stream_completion(
            self.client, f"{self.cfg.url}/v1/completions", body, timeout_s=self.cfg.timeout_s
        )
        headers = dict(r.headers)
        cached = r.cached_tokens
        if cached is None:
            cached = _header_int(headers, "x-conductor-cached-tokens")
        outcome = Outcome(
            request_id=str(req.request_id),
            arrival_s=due,
            sent_s=r.sent_s - t0,
            prompt_tokens=len(prompt),
            output_tokens=max_tokens,
            status=r.status,
            token_times_s=tuple(t - t0 for t in r.token_times_s),
            done_s=None if r.done_s is None else r.done_s - t0,
            cached_tokens=cached,
            error=r.error if r.error is not None or r.token_times_s else "no tokens streamed",
            prefill=headers.get("x-conductor-prefill"),
            decode=headers.get("x-conductor-decode"),
            queued_s=_header_ms(headers, "x-conductor-queued-ms"),
            predicted_ttft_s=_header_ms(headers, "x-conductor-predicted-ttft-ms"),
        )
        self.outcomes.append(outcome)
        self.on_done(outcome)
