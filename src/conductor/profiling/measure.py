"""Timing a live OpenAI-compatible engine: the prefill and decode samples of a profile (see
:mod:`conductor.profiling.config` for the plan).

Every prompt is token ids (:class:`~conductor.workload.prompts.BlockPrompts`): fresh blocks
(ids starting from the clock, so no earlier profile of the same engine sent them) share
nothing with anything sent before, a cached prefix is exactly the blocks sent just before it.
Requests ask for ``ignore_eos`` so the engine generates exactly ``max_tokens``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from conductor.profiling.config import ProfileConfig
from conductor.profiling.handoff import HandoffSample
from conductor.web.client import RawHttpClient, Timeouts
from conductor.web.sse_client import StreamResult, stream_completion
from conductor.workload.prompts import BlockPrompts, FreshBlocks

Step = Callable[[str], None]
"""Called once per measured step with a short label (the CLI's progress bar)."""


DECODE_ATTEMPTS = 3
"""Runs of a decode point before it is given up, each with twice the tokens of the one
before: its window comes out empty when the batch's streams did not overlap (a busy API
server can hand the engine a batch's requests further apart than a short stream lasts)."""


class ProfileError(Exception):
    """A request of the profile failed; the message says which and why."""


@dataclass(frozen=True, slots=True)
class PrefillSample:
    """``prompt_tokens`` of which ``cached_tokens`` were cached: median seconds to the
    first token over ``runs``."""

    kind: str
    prompt_tokens: int
    cached_tokens: int
    seconds: float
    runs: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class DecodeSample:
    """``batch_size`` streams holding ``context_tokens`` tokens together (mid-run): the
    median over ``gaps`` streams of their seconds per token while all of them decoded."""

    batch_size: int
    prompt_tokens: int
    context_tokens: int
    seconds: float
    gaps: int


@dataclass(frozen=True, slots=True)
class Measurements:
    prefill: tuple[PrefillSample, ...]
    decode: tuple[DecodeSample, ...]
    requests: int
    engine_reported_cached: bool
    handoff: tuple[HandoffSample, ...] = ()


def planned_steps(cfg: ProfileConfig) -> int:
    """How many times a profile calls its step callback."""
    per_length = 1 + len(cfg.cached_fractions)
    prefill = len(cfg.prefill_lengths) * cfg.repeats * per_length
    handoff = (cfg.handoff_samples + 1) * len(cfg.handoff_lengths) if cfg.handoff_url else 0
    return cfg.warmup + prefill + len(cfg.batch_sizes) * len(cfg.decode_contexts) + handoff


def cached_prefix(length: int, fraction: float, block: int) -> int:
    """Tokens of a ``length``-token prompt to cache: ``fraction`` of it in whole blocks, at
    least one block and leaving at least one token to compute (0 if impossible)."""
    p = int(length * fraction) // block * block
    if p >= length:
        p = (length - 1) // block * block
    return p


class Profiler:
    """Runs the plan of ``cfg`` against ``model`` at ``cfg.url``."""

    def __init__(
        self,
        cfg: ProfileConfig,
        model: str,
        block_size_tokens: int,
        pool: Sequence[int],
        step: Step | None = None,
        handoff_model: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.block = block_size_tokens
        self.prompts = BlockPrompts(block_size_tokens, pool, seed=cfg.seed)
        # Block ids of this run only: an engine keeps what earlier profiles sent in its cache.
        self.fresh = FreshBlocks(start=time.time_ns() << 8)
        self.step = step or (lambda label: None)
        self.client = RawHttpClient(
            Timeouts(connect_s=10.0, read_s=cfg.timeout_s, pool_s=cfg.timeout_s)
        )
        self.requests = 0
        self.reported_cached = False
        self.handoff_model = handoff_model or model
        """The model name the hand-off gateway serves."""

    def fresh_prompt(self, length: int) -> list[int]:
        blocks = self.fresh.take(-(-length // self.block))
        return self.prompts.prompt(blocks, length)

    async def send(
        self, prompt: list[int], max_tokens: int, *, via: str | None = None
    ) -> StreamResult:
        """One streamed completion to the engine, or ``via`` another base URL (the hand-off
        gateway)."""
        body = {
            "model": self.model if via is None else self.handoff_model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        self.requests += 1
        base = self.cfg.url if via is None else via
        r = await stream_completion(
            self.client, f"{base}/v1/completions", body, timeout_s=self.cfg.timeout_s
        )
        if r.error is not None or r.first_token_s is None:
            raise ProfileError(f"request of {len(prompt)} tokens failed: {r.error}")
        if r.cached_tokens is not None:
            self.reported_cached = True
        return r

    async def ttft(self, prompt: list[int]) -> tuple[float, int | None]:
        r = await self.send(prompt, 1)
        assert r.first_token_s is not None
        return r.first_token_s - r.sent_s, r.cached_tokens

    async def run(self) -> Measurements:
        try:
            return await self._run()
        finally:
            await self.client.aclose()

    async def _run(self) -> Measurements:
        cfg = self.cfg
        lengths = sorted(cfg.prefill_lengths)
        for i in range(cfg.warmup):
            await self.ttft(self.fresh_prompt(lengths[-1 - i % len(lengths)]))
            self.step("warm-up")
        runs: dict[tuple[str, int, int], list[float]] = {}
        for _ in range(cfg.repeats):
            for n in lengths:
                t, _cached = await self.ttft(self.fresh_prompt(n))
                runs.setdefault(("new", n, 0), []).append(t)
                self.step(f"prefill {n}")
                for f in cfg.cached_fractions:
                    p = cached_prefix(n, f, self.block)
                    if p > 0:
                        prefix = self.fresh.take(p // self.block)
                        await self.ttft(self.prompts.prompt(prefix, p))
                        rest = self.fresh.take(-(-(n - p) // self.block))
                        prompt = self.prompts.prompt([*prefix, *rest], n)
                        t, cached = await self.ttft(prompt)
                        hit = cached if cached is not None else p
                        runs.setdefault(("cached", n, hit), []).append(t)
                    self.step(f"prefill {n}, {p} cached")
        prefill = tuple(
            PrefillSample(kind, n, p, statistics.median(ts), tuple(ts))
            for (kind, n, p), ts in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][2]))
        )
        decode: list[DecodeSample] = []
        for c in sorted(cfg.decode_contexts):
            for b in sorted(cfg.batch_sizes):
                sample = None
                for attempt in range(DECODE_ATTEMPTS):
                    sample = await self.decode_point(b, c, cfg.decode_tokens << attempt)
                    if sample is not None:
                        break
                if sample is not None:
                    decode.append(sample)
                self.step(f"decode {b} x {c}")
        handoff = await self.handoff() if cfg.handoff_url else ()
        return Measurements(prefill, tuple(decode), self.requests, self.reported_cached, handoff)

    async def prefill_leg(self, prompt: list[int]) -> float:
        """Seconds of a request as a gateway's prefill leg is sent: ``max_tokens`` 1, not
        streamed, to the engine. (Streamed to a vLLM KV producer with ExampleConnector, the
        one token came about 1 s late in all four samples of one run; not streamed, 20-30 ms
        in three of four: the cause was not traced.)"""
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 0.0,
            "stream": False,
        }
        self.requests += 1
        t0 = time.perf_counter()
        url = f"{self.cfg.url}/v1/completions"
        r = await self.client.post(url, json.dumps(body).encode(), None)
        data = b"".join([part async for part in r.aiter_raw()])
        if r.status_code != 200:
            why = data[:200].decode(errors="replace")
            raise ProfileError(f"prefill leg of {len(prompt)} tokens: HTTP {r.status_code} {why}")
        return time.perf_counter() - t0

    async def handoff(self) -> tuple[HandoffSample, ...]:
        """Per length and sample, a fresh prompt straight to the engine as a prefill leg
        (:meth:`prefill_leg`) and another through ``cfg.handoff_url`` (``max_tokens`` 2,
        streamed: the decode engine yields the first token); one unmeasured round first (a
        CPU engine meets each shape once)."""
        via = self.cfg.handoff_url
        assert via is not None
        out: list[HandoffSample] = []
        for k in range(self.cfg.handoff_samples + 1):
            for n in self.cfg.handoff_lengths:
                prefill_s = await self.prefill_leg(self.fresh_prompt(n))
                r = await self.send(self.fresh_prompt(n), 2, via=via)
                assert r.first_token_s is not None
                if k > 0:
                    out.append(HandoffSample(n, prefill_s, r.first_token_s - r.sent_s))
                self.step(f"hand-off {n}")
        return tuple(out)

    async def decode_point(self, batch: int, context: int, tokens: int) -> DecodeSample | None:
        """``batch`` concurrent streams after ``context``-token prompts that were sent (and
        cached) just before, so that the streams' prefills are short and they all decode
        together; None when no gap fell in the window where all of them decoded."""
        prompts = [self.fresh_prompt(context) for _ in range(batch)]
        await asyncio.gather(*(self.send(p, 1) for p in prompts))
        results = await asyncio.gather(*(self.send(p, tokens) for p in prompts))
        gaps = decode_gaps(results)
        if not gaps:
            return None
        mid = batch * (context + tokens // 2)
        return DecodeSample(batch, context, mid, statistics.median(gaps), len(gaps))


def decode_gaps(results: Sequence[StreamResult]) -> list[float]:
    """Seconds per token of each stream while every stream of the batch was decoding (the
    window after the last stream's first token and before the first stream's last): the
    time between its first and last event in that window over the tokens in between.
    Events coalesced by the network (several in one read) cannot bias it; an event that
    reports its token count (``token_counts``) counts those tokens, else one."""
    start = max(r.token_times_s[0] for r in results)
    end = min(r.token_times_s[-1] for r in results)
    out: list[float] = []
    for r in results:
        times = r.token_times_s
        counts = r.token_counts if len(r.token_counts) == len(times) else list(range(len(times)))
        inside = [i for i, t in enumerate(times) if start <= t <= end]
        if len(inside) < 2:
            continue
        first, last = inside[0], inside[-1]
        tokens = counts[last] - counts[first]
        dt = times[last] - times[first]
        if tokens > 0 and dt > 0:
            out.append(dt / tokens)
    return out
