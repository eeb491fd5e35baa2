"""Synthetic Mooncake-style workloads: chat, agent, document QA and a mixture.

:func:`synthesize` returns :class:`~conductor.workload.trace.TraceRecord` s (sorted by
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

**Distributions.** ``*_median_tokens`` / ``*_log_sigma`` define a log-normal (median, sigma
of the log), rounded and clipped to ``[1, *_max_tokens]``. Counts per session
(``turns_mean``, ``steps_mean``, ``questions_mean``) are geometric on ``1, 2, ...`` with that
mean, truncated at the matching ``*_max``. ``*_zipf_s`` is the exponent of a finite Zipf law
over the popular items (item k of n is chosen with probability ``∝ 1 / k**s``). Lengths of
shared items (system prompts, tool sets, documents) are drawn once, uniform in
``[*_min_tokens, *_max_tokens]``.

Kinds and their parameters (defaults in the dataclasses below):

* ``chat`` (:class:`ChatParams`): ``system_prompts`` shared system prompts
  (``system_prompt_min_tokens``..``system_prompt_max_tokens``) chosen by Zipf
  (``system_prompt_zipf_s``); each turn re-sends system prompt + all earlier user messages and
  answers + a new user message (``user_message_median_tokens``, ``user_message_log_sigma``,
  ``user_message_max_tokens``); the answer (``output_median_tokens``, ``output_log_sigma``,
  ``output_max_tokens``) joins the history; turns (``turns_mean``, ``turns_max``) are
  ``think_time_min_s + Exp(think_time_mean_s)`` apart; a session ends early rather than
  exceed ``context_max_tokens``.
* ``agent`` (:class:`AgentParams`): ``toolsets`` shared tool-definition prompts
  (``toolset_min_tokens``..``toolset_max_tokens``, Zipf ``toolset_zipf_s``) + a private task
  (``task_median_tokens``, ``task_log_sigma``, ``task_max_tokens``); each step re-sends the
  whole context and appends the short model output (``output_*``) and a tool observation
  (``observation_median_tokens``, ``observation_log_sigma``, ``observation_max_tokens``);
  steps (``steps_mean``, ``steps_max``) are ``step_gap_min_s + Exp(step_gap_mean_s)`` apart,
  up to ``context_max_tokens``.
* ``docqa`` (:class:`DocQAParams`): a shared ``system_prompt_tokens`` instruction + a document
  + a short question (``question_*``), short-medium answers (``output_*``). The document is
  one of ``documents`` popular long documents (``document_min_tokens``..
  ``document_max_tokens``, Zipf ``document_zipf_s``), or, with probability
  ``private_document_share``, a fresh one of the same length range that only its session
  uses. A session asks ``questions_mean`` (``questions_max``) independent questions
  ``think_time_min_s + Exp(think_time_mean_s)`` apart.
* ``mixed`` (:class:`MixParams`): sessions of the three kinds, weighted so that the expected
  shares of *requests* are ``chat_request_share``, ``agent_request_share`` and
  ``docqa_request_share``.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Protocol

from conductor.core.errors import InvalidInput
from conductor.workload.trace import DEFAULT_BLOCK_SIZE_TOKENS, TraceRecord

__all__ = [
    "KINDS",
    "AgentParams",
    "ChatParams",
    "DocQAParams",
    "MixParams",
    "synthesize",
]

KINDS: tuple[str, ...] = ("chat", "agent", "docqa", "mixed")
"""Workload kinds :func:`synthesize` knows."""

WARMUP_SESSION_LENGTHS = 3.0
"""Warm-up before t = 0, in mean session durations of the longest-lived kind."""


def _require(owner: object, name: str, ok: bool, why: str) -> None:
    if not ok:
        raise InvalidInput(f"{type(owner).__name__}.{name}", getattr(owner, name), why)


def _check_fields(params: ChatParams | AgentParams | DocQAParams | MixParams) -> None:
    """Every float must be finite; times, shares, sigmas and exponents >= 0, the rest >= 1."""
    for spec in fields(params):
        value = getattr(params, spec.name)
        if isinstance(value, float):
            _require(params, spec.name, math.isfinite(value), "must be finite")
        if spec.name.endswith(("_s", "_share", "_log_sigma")):  # "_zipf_s" ends with "_s"
            _require(params, spec.name, value >= 0, "must be >= 0")
        else:
            _require(params, spec.name, value >= 1, "must be >= 1")


def _check_range(params: object, low: str, high: str) -> None:
    ok = getattr(params, low) <= getattr(params, high)
    _require(params, high, ok, f"must be >= {low} ({getattr(params, low)})")


@dataclass(frozen=True, slots=True)
class ChatParams:
    """Multi-turn chat sessions over a few shared system prompts."""

    system_prompts: int = 8
    system_prompt_zipf_s: float = 1.2
    system_prompt_min_tokens: int = 600
    system_prompt_max_tokens: int = 2_500
    turns_mean: float = 4.0
    turns_max: int = 24
    user_message_median_tokens: float = 200.0
    user_message_log_sigma: float = 1.2
    user_message_max_tokens: int = 16_000
    output_median_tokens: float = 300.0
    output_log_sigma: float = 0.7
    output_max_tokens: int = 2_000
    think_time_min_s: float = 5.0
    think_time_mean_s: float = 40.0
    context_max_tokens: int = 131_072

    def __post_init__(self) -> None:
        _check_fields(self)
        _check_range(self, "system_prompt_min_tokens", "system_prompt_max_tokens")
        first = self.system_prompt_max_tokens + self.user_message_max_tokens
        _require(self, "context_max_tokens", self.context_max_tokens >= first, "too small")


@dataclass(frozen=True, slots=True)
class AgentParams:
    """Agent loops: long shared tool definitions + a task, small appends, short outputs."""

    toolsets: int = 4
    toolset_zipf_s: float = 1.0
    toolset_min_tokens: int = 3_000
    toolset_max_tokens: int = 12_000
    task_median_tokens: float = 1_000.0
    task_log_sigma: float = 0.8
    task_max_tokens: int = 16_000
    steps_mean: float = 16.0
    steps_max: int = 64
    observation_median_tokens: float = 250.0
    observation_log_sigma: float = 1.0
    observation_max_tokens: int = 8_000
    output_median_tokens: float = 60.0
    output_log_sigma: float = 0.6
    output_max_tokens: int = 1_000
    step_gap_min_s: float = 0.5
    step_gap_mean_s: float = 2.5
    context_max_tokens: int = 131_072

    def __post_init__(self) -> None:
        _check_fields(self)
        _check_range(self, "toolset_min_tokens", "toolset_max_tokens")
        first = self.toolset_max_tokens + self.task_max_tokens
        _require(self, "context_max_tokens", self.context_max_tokens >= first, "too small")


@dataclass(frozen=True, slots=True)
class DocQAParams:
    """Questions about a few very long popular documents (and some private ones)."""

    documents: int = 10
    document_zipf_s: float = 1.1
    document_min_tokens: int = 20_000
    document_max_tokens: int = 100_000
    private_document_share: float = 0.2
    system_prompt_tokens: int = 300
    questions_mean: float = 2.0
    questions_max: int = 10
    question_median_tokens: float = 40.0
    question_log_sigma: float = 0.6
    question_max_tokens: int = 1_000
    output_median_tokens: float = 200.0
    output_log_sigma: float = 0.8
    output_max_tokens: int = 2_000
    think_time_min_s: float = 5.0
    think_time_mean_s: float = 30.0

    def __post_init__(self) -> None:
        _check_fields(self)
        _check_range(self, "document_min_tokens", "document_max_tokens")
        share = self.private_document_share
        _require(self, "private_document_share", share <= 1, "must be <= 1")


@dataclass(frozen=True, slots=True)
class MixParams:
    """Expected shares of requests per kind in ``mixed`` (need not sum to 1; one must be > 0)."""

    chat_request_share: float = 0.5
    agent_request_share: float = 0.3
    docqa_request_share: float = 0.2

    def __post_init__(self) -> None:
        _check_fields(self)
        total = self.chat_request_share + self.agent_request_share + self.docqa_request_share
        _require(self, "docqa_request_share", total > 0, "the shares must not all be 0")


Segment = tuple[int, int]
"""``(content id, tokens)``: one piece of prompt content."""
Turn = tuple[float, tuple[Segment, ...], int]
"""``(arrival_s, prompt segments, output tokens)``: one request of a session."""


class _Source(Protocol):
    """One workload kind: its shared content is drawn at construction."""

    @property
    def mean_requests_per_session(self) -> float: ...

    @property
    def mean_session_s(self) -> float:
        """Expected time from a session's first request to its last."""
        ...

    def session(self, rng: random.Random, start_s: float) -> list[Turn]: ...


def _zipf_cum_weights(n: int, s: float) -> list[float]:
    return list(itertools.accumulate(1.0 / (k**s) for k in range(1, n + 1)))


def _pick(rng: random.Random, cum_weights: list[float]) -> int:
    """An index drawn with the given cumulative weights."""
    index = bisect.bisect_right(cum_weights, rng.random() * cum_weights[-1])
    return min(index, len(cum_weights) - 1)


def _geometric(rng: random.Random, mean: float, maximum: int) -> int:
    """A count on 1, 2, ... with the given mean, truncated at ``maximum``."""
    if mean <= 1:
        return 1
    draw = 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - 1.0 / mean))
    return min(draw, maximum)


def _geometric_mean(mean: float, maximum: int) -> float:
    """Expected value of :func:`_geometric` (truncation included)."""
    if mean <= 1:
        return 1.0
    p = 1.0 / mean
    return (1.0 - (1.0 - p) ** maximum) / p


def _lognormal(rng: random.Random, median: float, log_sigma: float, maximum: int) -> int:
    draw = round(rng.lognormvariate(math.log(median), log_sigma))
    return max(1, min(maximum, draw))


def _gap(rng: random.Random, min_s: float, mean_s: float) -> float:
    return min_s + (rng.expovariate(1.0 / mean_s) if mean_s > 0 else 0.0)


def _shared_items(
    rng: random.Random, uids: Iterator[int], count: int, low: int, high: int
) -> list[Segment]:
    return [(next(uids), rng.randint(low, high)) for _ in range(count)]


class _Chat:
    def __init__(self, params: ChatParams, rng: random.Random, uids: Iterator[int]) -> None:
        self._p = params
        self._uids = uids
        self._system = _shared_items(
            rng,
            uids,
            params.system_prompts,
            params.system_prompt_min_tokens,
            params.system_prompt_max_tokens,
        )
        self._cum = _zipf_cum_weights(params.system_prompts, params.system_prompt_zipf_s)
        self.mean_requests_per_session = _geometric_mean(params.turns_mean, params.turns_max)
        self.mean_session_s = (self.mean_requests_per_session - 1) * (
            params.think_time_min_s + params.think_time_mean_s
        )

    def session(self, rng: random.Random, start_s: float) -> list[Turn]:
        p = self._p
        turns = _geometric(rng, p.turns_mean, p.turns_max)
        history = [self._system[_pick(rng, self._cum)]]
        length = history[0][1]
        now_s = start_s
        out: list[Turn] = []
        for _ in range(turns):
            user = _lognormal(
                rng,
                p.user_message_median_tokens,
                p.user_message_log_sigma,
                p.user_message_max_tokens,
            )
            if length + user > p.context_max_tokens:
                break
            history.append((next(self._uids), user))
            length += user
            output = _lognormal(
                rng, p.output_median_tokens, p.output_log_sigma, p.output_max_tokens
            )
            out.append((now_s, tuple(history), output))
            history.append((next(self._uids), output))
            length += output
            now_s += _gap(rng, p.think_time_min_s, p.think_time_mean_s)
        return out


class _Agent:
    def __init__(self, params: AgentParams, rng: random.Random, uids: Iterator[int]) -> None:
        self._p = params
        self._uids = uids
        self._toolsets = _shared_items(
            rng, uids, params.toolsets, params.toolset_min_tokens, params.toolset_max_tokens
        )
        self._cum = _zipf_cum_weights(params.toolsets, params.toolset_zipf_s)
        self.mean_requests_per_session = _geometric_mean(params.steps_mean, params.steps_max)
        self.mean_session_s = (self.mean_requests_per_session - 1) * (
            params.step_gap_min_s + params.step_gap_mean_s
        )

    def session(self, rng: random.Random, start_s: float) -> list[Turn]:
        p = self._p
        steps = _geometric(rng, p.steps_mean, p.steps_max)
        task = _lognormal(rng, p.task_median_tokens, p.task_log_sigma, p.task_max_tokens)
        context = [self._toolsets[_pick(rng, self._cum)], (next(self._uids), task)]
        length = context[0][1] + task
        now_s = start_s
        out: list[Turn] = []
        for _ in range(steps):
            if length > p.context_max_tokens:
                break
            output = _lognormal(
                rng, p.output_median_tokens, p.output_log_sigma, p.output_max_tokens
            )
            out.append((now_s, tuple(context), output))
            observation = _lognormal(
                rng, p.observation_median_tokens, p.observation_log_sigma, p.observation_max_tokens
            )
            context += [(next(self._uids), output), (next(self._uids), observation)]
            length += output + observation
            now_s += _gap(rng, p.step_gap_min_s, p.step_gap_mean_s)
        return out


class _DocQA:
    def __init__(self, params: DocQAParams, rng: random.Random, uids: Iterator[int]) -> None:
        self._p = params
        self._uids = uids
        self._system = (next(uids), params.system_prompt_tokens)
        self._documents = _shared_items(
            rng, uids, params.documents, params.document_min_tokens, params.document_max_tokens
        )
        self._cum = _zipf_cum_weights(params.documents, params.document_zipf_s)
        self.mean_requests_per_session = _geometric_mean(
            params.questions_mean, params.questions_max
        )
        self.mean_session_s = (self.mean_requests_per_session - 1) * (
            params.think_time_min_s + params.think_time_mean_s
        )

    def session(self, rng: random.Random, start_s: float) -> list[Turn]:
        p = self._p
        questions = _geometric(rng, p.questions_mean, p.questions_max)
        if rng.random() < p.private_document_share:
            length = rng.randint(p.document_min_tokens, p.document_max_tokens)
            document = (next(self._uids), length)
        else:
            document = self._documents[_pick(rng, self._cum)]
        now_s = start_s
        out: list[Turn] = []
        for _ in range(questions):
            question = _lognormal(
                rng, p.question_median_tokens, p.question_log_sigma, p.question_max_tokens
            )
            output = _lognormal(
                rng, p.output_median_tokens, p.output_log_sigma, p.output_max_tokens
            )
            prompt = (self._system, document, (next(self._uids), question))
            out.append((now_s, prompt, output))
            now_s += _gap(rng, p.think_time_min_s, p.think_time_mean_s)
        return out


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
) -> list[TraceRecord]:
    """``requests`` synthetic requests of ``kind`` (one of :data:`KINDS`) at ``rate_rps``.

    Deterministic in its arguments. Records are sorted by timestamp (ms, first at 0) with
    ``line_no`` = position + 1. Raises :class:`InvalidInput` for an unknown kind, a
    non-positive ``requests``, ``rate_rps`` or ``block_size_tokens``, or a non-integer seed.
    """
    _validate(kind, requests, rate_rps, seed, block_size_tokens)
    rng = random.Random(seed)
    uids = itertools.count()
    shares = _shares(kind, mix or MixParams())
    sources: dict[str, _Source] = {}
    if "chat" in shares:
        sources["chat"] = _Chat(chat or ChatParams(), rng, uids)
    if "agent" in shares:
        sources["agent"] = _Agent(agent or AgentParams(), rng, uids)
    if "docqa" in shares:
        sources["docqa"] = _DocQA(docqa or DocQAParams(), rng, uids)
    names = list(sources)
    # Session-kind weights so that the expected request shares match `shares`.
    weights = [shares[name] / sources[name].mean_requests_per_session for name in names]
    cum_weights = list(itertools.accumulate(weights))
    session_rate = rate_rps * sum(weights) / sum(shares.values())

    drafts: list[tuple[int, int, tuple[Segment, ...], int]] = []
    earliest: list[int] = []  # max-heap (negated) of the `requests` smallest timestamps
    start_s = -WARMUP_SESSION_LENGTHS * max(source.mean_session_s for source in sources.values())
    while len(earliest) < requests or int(start_s * 1000) < -earliest[0]:
        source = sources[names[_pick(rng, cum_weights)]] if len(names) > 1 else sources[names[0]]
        for arrival_s, segments, output in source.session(rng, start_s):
            if arrival_s < 0:
                continue
            timestamp_ms = int(arrival_s * 1000)
            drafts.append((timestamp_ms, len(drafts), segments, output))
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
        )
        for index, (timestamp_ms, _, segments, output) in enumerate(drafts[:requests])
    ]
