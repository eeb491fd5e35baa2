"""Validators shared by every frozen config's ``__post_init__``: each raises
:class:`~conductor.core.errors.InvalidInput` naming the field and the value, so a shell can map
the error to its own name for the field (a CLI flag, a TOML key, a JSON path). A request's
own fields: :meth:`conductor.core.types.Request.check`."""

from __future__ import annotations

from collections.abc import Collection

from conductor.core.errors import InvalidInput

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
