"""How one session of each synthetic workload kind unfolds (:mod:`conductor.workload.synth`):
its requests as content segments, arrival times and output lengths, drawn from one
``random.Random`` in a fixed order.

A prompt is a sequence of segments ``(content id, tokens)``; a content id names one piece of
content (a system prompt, a user message, an answer, a document), so identical prefixes are
identical segment sequences. Shared items (system prompts, tool sets, documents) are drawn
once, when a kind's session source is built.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Iterator
from typing import Protocol

from conductor.workload.synth_params import AgentParams, ChatParams, DocQAParams

__all__ = [
    "AgentSessions",
    "ChatSessions",
    "DocQASessions",
    "Segment",
    "Source",
    "Turn",
    "pick",
]


Segment = tuple[int, int]
"""``(content id, tokens)``: one piece of prompt content."""
Turn = tuple[float, tuple[Segment, ...], int]
"""``(arrival_s, prompt segments, output tokens)``: one request of a session."""


class Source(Protocol):
    """One workload kind: its shared content is drawn at construction."""

    @property
    def mean_requests_per_session(self) -> float: ...

    @property
    def mean_session_s(self) -> float:
        """Expected time from a session's first request to its last."""
        ...

    def session(self, rng: random.Random, start_s: float) -> list[Turn]: ...


def zipf_cum_weights(n: int, s: float) -> list[float]:
    return list(itertools.accumulate(1.0 / (k**s) for k in range(1, n + 1)))


def pick(rng: random.Random, cum_weights: list[float]) -> int:
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


class ChatSessions:
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
        self._cum = zipf_cum_weights(params.system_prompts, params.system_prompt_zipf_s)
        self.mean_requests_per_session = _geometric_mean(params.turns_mean, params.turns_max)
        self.mean_session_s = (self.mean_requests_per_session - 1) * (
            params.think_time_min_s + params.think_time_mean_s
        )

    def session(self, rng: random.Random, start_s: float) -> list[Turn]:
        p = self._p
        turns = _geometric(rng, p.turns_mean, p.turns_max)
        history = [self._system[pick(rng, self._cum)]]
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


class AgentSessions:
    def __init__(self, params: AgentParams, rng: random.Random, uids: Iterator[int]) -> None:
        self._p = params
        self._uids = uids
        self._toolsets = _shared_items(
            rng, uids, params.toolsets, params.toolset_min_tokens, params.toolset_max_tokens
        )
        self._cum = zipf_cum_weights(params.toolsets, params.toolset_zipf_s)
        self.mean_requests_per_session = _geometric_mean(params.steps_mean, params.steps_max)
        self.mean_session_s = (self.mean_requests_per_session - 1) * (
            params.step_gap_min_s + params.step_gap_mean_s
        )

    def session(self, rng: random.Random, start_s: float) -> list[Turn]:
        p = self._p
        steps = _geometric(rng, p.steps_mean, p.steps_max)
        task = _lognormal(rng, p.task_median_tokens, p.task_log_sigma, p.task_max_tokens)
        context = [self._toolsets[pick(rng, self._cum)], (next(self._uids), task)]
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


class DocQASessions:
    def __init__(self, params: DocQAParams, rng: random.Random, uids: Iterator[int]) -> None:
        self._p = params
        self._uids = uids
        self._system = (next(uids), params.system_prompt_tokens)
        self._documents = _shared_items(
            rng, uids, params.documents, params.document_min_tokens, params.document_max_tokens
        )
        self._cum = zipf_cum_weights(params.documents, params.document_zipf_s)
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
            document = self._documents[pick(rng, self._cum)]
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
