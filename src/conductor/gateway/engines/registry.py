"""Engine kinds by name: the one place an engine config's ``kind`` is looked up and checked.

Adding a kind is one module implementing :class:`~conductor.gateway.engines.kind.EngineKind`
and one entry in :data:`KINDS`.
"""

from __future__ import annotations

from collections.abc import Mapping

from conductor.core.errors import InvalidInput
from conductor.gateway.engines.kind import EngineKind
from conductor.gateway.engines.vllm import VllmKind

DEFAULT_KIND = "vllm"
KINDS: Mapping[str, EngineKind] = {"vllm": VllmKind()}


def check_kind(name: str, field: str = "kind") -> str:
    """``name`` if it is a registered kind, else :class:`InvalidInput` naming ``field``."""
    if name not in KINDS:
        raise InvalidInput(field, name, f"unknown engine kind; known: {', '.join(sorted(KINDS))}")
    return name


def engine_kind(name: str) -> EngineKind:
    """The kind registered as ``name`` (checked as :func:`check_kind` does)."""
    return KINDS[check_kind(name)]
