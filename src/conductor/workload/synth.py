"""Synthetic Mooncake-style workloads: chat, agent, document QA and a mixture.

:func:`synthesize` returns :class:`~conductor.workload.trace_format.TraceRecord` s (sorted by
timestamp, int milliseconds, the first at 0) that :func:`~conductor.workload.trace.write_trace`
writes as Mooncake JSONL. Output depends only on the arguments: one ``random.Random(seed)``
drives every draw, in a fixed order.

**Content model.** A prompt is a sequence of content segments ``(content id, tokens)``: a
system prompt, a user message, an assistant answer, a document... Its blocks of
``block_size_tokens`` are identified as in a chained block hash: a block's id is the id of
``(parent block id, the segment slices it holds)``. Identical prefixes therefore get identical
ids and the last partial block's id is unique to its whole prefix content. Ids are dense
integers in order of first appearance in the output, exactly like Mooncake's remapping, and
``len(hash_ids) == ceil(input_length / block_size_tokens)``.

**Arrivals.** Sessions start as a Poisson process at the rate that gives ``rate_rps``
requests per second (``rate_rps / mean requests per session``). A session's requests follow
its turn order, separated by a think (or tool) time of ``*_min_s`` plus an exponential with
mean ``*_mean_s``. So that the trace starts in steady state rather than empty, the process
starts a warm-up of ``WARMUP_SESSION_LENGTHS`` mean session durations before t = 0 and
requests before 0 are dropped (like a window cut out of a longer log: sessions already under
way at the start miss their earlier turns). The output is exactly the ``requests`` earliest
requests at t >= 0 (ties by generation order), shifted so that the first is at 0 ms.

**Several models.** With ``models`` (name -> weight, e.g. ``{"a": 0.7, "b": 0.3}``) every
*session* is for one model, drawn with those weights (a conversation stays with its model),
so each model's expected share of requests is its weight over the sum. Every model has its
own shared content (system prompts, tool sets, documents, drawn per model in the given order),
so no prefix and no block id is shared across models: a model's blocks live in its own pool.
Records carry their ``model``; without ``models`` they carry none and the output is exactly
that of a single-model call (the same draws).

Kinds, their parameters and distributions: :mod:`conductor.workload.synth_params`; how a
session of each kind unfolds: :mod:`conductor.workload.synth_sessions`.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Mapping

from conductor.core.errors import InvalidInput
from conductor.workload.synth_params import AgentParams, ChatParams, DocQAParams, MixParams
from conductor.workload.synth_sessions import (
    AgentSessions,
    ChatSessions,
    DocQASessions,
    Segment,
    Source,
    pick,
)
from conductor.workload.trace_format import DEFAULT_BLOCK_SIZE_TOKENS, TraceRecord

__all__ = ["KINDS", "check_models", "synthesize"]

KINDS: tuple[str, ...] = ("chat", "agent", "docqa", "mixed")
"""Workload kinds :func:`synthesize` knows."""

WARMUP_SESSION_LENGTHS = 3.0
"""Warm-up before t = 0, in mean session durations of the longest-lived kind."""


BlockKey = tuple[int, tuple[tuple[int, int, int], ...]]
"""``(parent block id or -1, ((content id, start, end), ...))``: a block's identity."""


def _block_ids(
    segments: tuple[Segment, ...], block_size_tokens: int, ids: dict[BlockKey, int]
) -> tuple[int, ...]:
    """Dense ids of the prompt's blocks, new ones numbered in order of first appearance."""
    out: list[int] = []
    parent = -1
    pieces: list[tuple[int, int, int]] = []
    filled = 0
    for uid, length in segments:
        offset = 0
        while offset < length:
            take = min(block_size_tokens - filled, length - offset)
            pieces.append((uid, offset, offset + take))
            offset += take
            filled += take
            if filled == block_size_tokens:
                parent = ids.setdefault((parent, tuple(pieces)), len(ids))
                out.append(parent)
                pieces = []
                filled = 0
    if pieces:
        out.append(ids.setdefault((parent, tuple(pieces)), len(ids)))
    return tuple(out)


def _shares(kind: str, mix: MixParams) -> dict[str, float]:
    if kind != "mixed":
        return {kind: 1.0}
    shares = {
        "chat": mix.chat_request_share,
        "agent": mix.agent_request_share,
        "docqa": mix.docqa_request_share,
    }
    return {name: share for name, share in shares.items() if share > 0}


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_models(models: Mapping[str, float]) -> None:
    """Raises :class:`InvalidInput` naming ``models`` unless ``models`` maps at least one
    non-empty name to a finite weight > 0 (names are distinct: they are keys)."""
    if not isinstance(models, Mapping) or not models:
        raise InvalidInput("models", models, "must name at least one model")
    for name, weight in models.items():
        if not isinstance(name, str) or not name.strip():
            raise InvalidInput("models", name, "a model name must be a non-empty string")
        if (
            isinstance(weight, bool)
            or not isinstance(weight, int | float)
            or not (math.isfinite(weight) and weight > 0)
        ):
            why = f"the weight of model {name!r} must be a finite number > 0"
            raise InvalidInput("models", weight, why)


def _validate(
    kind: object, requests: object, rate_rps: object, seed: object, block_size_tokens: object
) -> None:
    if kind not in KINDS:
        raise InvalidInput("kind", kind, f"must be one of {', '.join(KINDS)}")
    if not _positive_int(requests):
        raise InvalidInput("requests", requests, "must be an integer > 0")
    if (
        isinstance(rate_rps, bool)
        or not isinstance(rate_rps, int | float)
        or not (math.isfinite(rate_rps) and rate_rps > 0)
    ):
        raise InvalidInput("rate_rps", rate_rps, "must be a finite number > 0")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidInput("seed", seed, "must be an integer")
    if not _positive_int(block_size_tokens):
        raise InvalidInput("block_size_tokens", block_size_tokens, "must be an integer > 0")


def synthesize(
    kind: str,
    *,
    requests: int,
    rate_rps: float,
    seed: int,
    block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS,
    chat: ChatParams | None = None,
    agent: AgentParams | None = None,
    docqa: DocQAParams | None = None,
    mix: MixParams | None = None,
    models: Mapping[str, float] | None = None,
) -> list[TraceRecord]:
    """``requests`` synthetic requests of ``kind`` (one of :data:`KINDS`) at ``rate_rps``,
    for the models of ``models`` (name -> weight; None: one unnamed model).

    Deterministic in its arguments. Records are sorted by timestamp (ms, first at 0) with
    ``line_no`` = position + 1. Raises :class:`InvalidInput` for an unknown kind, a
    non-positive ``requests``, ``rate_rps`` or ``block_size_tokens``, a non-integer seed, or
    ``models`` failing :func:`check_models`.
    """
    _validate(kind, requests, rate_rps, seed, block_size_tokens)
    if models is not None:
        check_models(models)
    rng = random.Random(seed)
    uids = itertools.count()
    shares = _shares(kind, mix or MixParams())
    model_weights: dict[str | None, float] = (
        {None: 1.0} if models is None else {name: weight for name, weight in models.items()}
    )
    per_model: dict[str | None, dict[str, Source]] = {}
    for model in model_weights:
        sources: dict[str, Source] = {}
        if "chat" in shares:
            sources["chat"] = ChatSessions(chat or ChatParams(), rng, uids)
        if "agent" in shares:
            sources["agent"] = AgentSessions(agent or AgentParams(), rng, uids)
        if "docqa" in shares:
            sources["docqa"] = DocQASessions(docqa or DocQAParams(), rng, uids)
        per_model[model] = sources
    names = list(shares)
    # Session-kind weights so that the expected request shares match `shares` (every model
    # has the same kinds, so these hold for each).
    first = next(iter(per_model.values()))
    weights = [shares[name] / first[name].mean_requests_per_session for name in names]
    cum_weights = list(itertools.accumulate(weights))
    session_rate = rate_rps * sum(weights) / sum(shares.values())
    model_names = list(model_weights)
    model_cum = list(itertools.accumulate(model_weights.values()))

    drafts: list[tuple[int, int, tuple[Segment, ...], int, str | None]] = []
    earliest: list[int] = []  # max-heap (negated) of the `requests` smallest timestamps
    start_s = -WARMUP_SESSION_LENGTHS * max(source.mean_session_s for source in first.values())
    while len(earliest) < requests or int(start_s * 1000) < -earliest[0]:
        model = model_names[pick(rng, model_cum)] if len(model_names) > 1 else model_names[0]
        sources = per_model[model]
        source = sources[names[pick(rng, cum_weights)]] if len(names) > 1 else sources[names[0]]
        for arrival_s, segments, output in source.session(rng, start_s):
            if arrival_s < 0:
                continue
            timestamp_ms = int(arrival_s * 1000)
            drafts.append((timestamp_ms, len(drafts), segments, output, model))
            heapq.heappush(earliest, -timestamp_ms)
            if len(earliest) > requests:
                heapq.heappop(earliest)
        start_s += rng.expovariate(session_rate)

    drafts.sort(key=lambda draft: (draft[0], draft[1]))
    first_ms = drafts[0][0]
    block_ids: dict[BlockKey, int] = {}
    return [
        TraceRecord(
            timestamp_ms=timestamp_ms - first_ms,
            input_length=sum(length for _, length in segments),
            output_length=output,
            hash_ids=_block_ids(segments, block_size_tokens, block_ids),
            line_no=index + 1,
            model=model,
        )
        for index, (timestamp_ms, _, segments, output, model) in enumerate(drafts[:requests])
    ]
