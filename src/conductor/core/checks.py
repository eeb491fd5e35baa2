"""Validators shared by every frozen config's ``__post_init__``: each raises
:class:`~conductor.core.errors.InvalidInput` naming the field and the value, so a shell can map
the error to its own name for the field (a CLI flag, a TOML key, a JSON path); and
:func:`check_request`, the scheduler's check of a request's own fields."""

from __future__ import annotations

import math
from collections.abc import Collection

from conductor.core.errors import InvalidInput
from conductor.core.types import Request

PORT_MIN = 0
"""Port 0 asks the operating system for a free port (tests and demos use it)."""
PORT_MAX = 65535


def check_port(field: str, value: int) -> int:
    """A TCP port: ``PORT_MIN..PORT_MAX``."""
    if not PORT_MIN <= value <= PORT_MAX:
        raise InvalidInput(field, value, f"must be a TCP port in {PORT_MIN}..{PORT_MAX}")
    return value


def check_positive(field: str, value: float) -> float:
    """Strictly above zero (NaN fails too)."""
    if not value > 0:
        raise InvalidInput(field, value, "must be > 0")
    return value


def check_at_least(field: str, value: float, low: float) -> float:
    """``value >= low`` (NaN fails too)."""
    if not value >= low:
        raise InvalidInput(field, value, f"must be >= {low}")
    return value


def check_choice(field: str, value: str, choices: Collection[str]) -> str:
    """One of ``choices``; the message lists them in order."""
    if value not in choices:
        raise InvalidInput(field, value, f"must be one of: {', '.join(choices)}")
    return value


def check_request(request: Request, block_size_tokens: int) -> None:
    """A positive prompt, ``max_tokens`` (if given) >= 1, and no more block hashes than
    ``ceil(prompt_tokens / block_size_tokens)``."""
    if request.prompt_tokens <= 0:
        raise InvalidInput("prompt_tokens", request.prompt_tokens, "must be > 0")
    if request.max_tokens is not None and request.max_tokens < 1:
        raise InvalidInput("max_tokens", request.max_tokens, "must be >= 1")
    most = math.ceil(request.prompt_tokens / block_size_tokens)
    if len(request.block_hashes) > most:
        raise InvalidInput(
            "block_hashes",
            len(request.block_hashes),
            f"more blocks than ceil({request.prompt_tokens}/{block_size_tokens}) = {most}",
        )
