"""Policy registry: names are part of the CLI contract."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from conductor.core.errors import InvalidInput, UnknownPolicy
from conductor.core.policies.base import PrefillPolicy

_REGISTRY: dict[str, Callable[[], PrefillPolicy]] = {}

DEFAULT_POLICY = "conductor"
"""The policy every shell (library facade, simulator, gateway, benchmarks, CLI) uses unless
told otherwise; defined here only."""

P = TypeVar("P")


def register(cls: type[P]) -> type[P]:
    """Class decorator: register a prefill policy under its ``name``."""
    name: str = cls.name  # type: ignore[attr-defined]
    if name in _REGISTRY:
        raise ValueError(f"policy {name!r} registered twice")
    _REGISTRY[name] = cls  # type: ignore[assignment]
    return cls


def make_policy(name: str) -> PrefillPolicy:
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise UnknownPolicy(name, list(_REGISTRY)) from None
    return factory()


def policy_names() -> list[str]:
    return list(_REGISTRY)


def policy_config_defaults(name: str) -> dict[str, object]:
    """Scheduler settings a policy brings with it (e.g. ``conductor``'s admission), applied
    by the shells to whatever the user did not set explicitly."""
    if name not in _REGISTRY:
        raise UnknownPolicy(name, list(_REGISTRY))
    defaults: dict[str, object] = getattr(_REGISTRY[name], "config_defaults", {})
    return dict(defaults)


def check_policy(name: str, field: str = "policy") -> str:
    """``name`` if it is a registered policy, else :class:`InvalidInput` naming ``field`` and
    listing the known names (the one place policy names are validated)."""
    if name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY))
        raise InvalidInput(field, name, f"unknown policy; known: {known}")
    return name
