"""What ``conductor replay`` sends (frozen; built once by the CLI, whose flags derive their
defaults from these fields).

Request ``i`` of the trace is sent at ``timestamp_ms / 1000 / speed`` seconds after the
replay starts (open loop: whether earlier requests finished does not matter). Its prompt is
``ceil(input_length * token_scale)`` token ids made from its ``hash_ids``, each id becoming
``block_size_tokens`` ids (default ``trace_block_tokens * token_scale``: the trace's blocks
scaled like the lengths), so equal ids are equal blocks; its ``max_tokens`` is
``ceil(output_length * output_scale)``, capped at ``max_output_tokens``, generated whatever
the model says (``ignore_eos``). Prompts longer than ``max_prompt_tokens`` are cut there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from conductor.core.checks import check_at_least, check_positive
from conductor.core.errors import InvalidInput
from conductor.workload.trace_format import DEFAULT_BLOCK_SIZE_TOKENS


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """One replay (see the module docstring). ``model`` None: the first model
    ``GET /v1/models`` lists. ``endpoint``: ``completions`` (token-id prompts)."""

    url: str
    model: str | None = None
    speed: float = 1.0
    limit: int | None = None
    token_scale: float = 1.0
    output_scale: float = 1.0
    trace_block_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS
    block_size_tokens: int | None = None
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    timeout_s: float = 600.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.url.startswith("http://"):
            raise InvalidInput("url", self.url, "must be an http:// URL")
        if not (math.isfinite(self.speed) and self.speed > 0):
            raise InvalidInput("speed", self.speed, "must be a finite number > 0")
        if self.limit is not None:
            check_at_least("limit", self.limit, 1)
        for name in ("token_scale", "output_scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise InvalidInput(name, value, "must be a finite number > 0")
        check_at_least("trace_block_tokens", self.trace_block_tokens, 1)
        if self.block_size_tokens is not None:
            check_at_least("block_size_tokens", self.block_size_tokens, 1)
        elif self.trace_block_tokens * self.token_scale < 1:
            raise InvalidInput(
                "token_scale", self.token_scale, "scales a trace block below one token"
            )
        if self.max_prompt_tokens is not None:
            check_at_least("max_prompt_tokens", self.max_prompt_tokens, 1)
        if self.max_output_tokens is not None:
            check_at_least("max_output_tokens", self.max_output_tokens, 1)
        check_positive("timeout_s", self.timeout_s)
        check_at_least("seed", self.seed, 0)

    @property
    def tokens_per_block(self) -> int:
        """Token ids per trace hash id."""
        if self.block_size_tokens is not None:
            return self.block_size_tokens
        return max(1, round(self.trace_block_tokens * self.token_scale))

    def prompt_tokens(self, input_length: int) -> int:
        n = max(1, math.ceil(input_length * self.token_scale))
        return n if self.max_prompt_tokens is None else min(n, self.max_prompt_tokens)

    def output_tokens(self, output_length: int) -> int:
        n = max(1, math.ceil(output_length * self.output_scale))
        return n if self.max_output_tokens is None else min(n, self.max_output_tokens)
