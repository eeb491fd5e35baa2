"""Parameters of the synthetic workload kinds (:mod:`conductor.workload.synth`): frozen
dataclasses, every field checked at construction.

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

import math
from dataclasses import dataclass, fields

from conductor.core.errors import InvalidInput

__all__ = ["AgentParams", "ChatParams", "DocQAParams", "MixParams"]


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
