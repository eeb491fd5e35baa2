"""Command-line options derived from the frozen config dataclasses.

An option's default is the default of the config field it sets (:func:`field_default`), the
field validates the value (its class's ``__post_init__``), and the command reports the
:class:`~conductor.core.errors.InvalidInput` under the name the user typed
(:func:`config_error`): ``error: invalid --ttft-slo-s=-1.0: must be > 0``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import typer

from conductor.core.errors import InvalidInput


def field_default(config: type[Any], name: str) -> object:
    """The default of field ``name`` of the dataclass ``config`` (a factory is called)."""
    for spec in dataclasses.fields(config):
        if spec.name != name:
            continue
        if spec.default is not dataclasses.MISSING:
            return spec.default
        if spec.default_factory is not dataclasses.MISSING:
            return spec.default_factory()
        raise KeyError(f"{config.__name__}.{name} has no default")
    raise KeyError(f"{config.__name__} has no field {name!r}")


def renamed(
    exc: InvalidInput, names: Mapping[str, str], given: Mapping[str, object] | None = None
) -> InvalidInput:
    """``exc`` with its field named as in ``names`` (config field -> option or key name);
    ``given`` holds the values as typed for options whose unit differs from the field's
    (``--tbt-slo-ms`` sets ``tbt_slo_s``), so the message shows what the user wrote."""
    name = names.get(exc.field)
    if name is None:
        return exc
    value = given[exc.field] if given is not None and exc.field in given else exc.value
    return InvalidInput(name, value, exc.why)


def config_error(
    exc: InvalidInput, names: Mapping[str, str], given: Mapping[str, object] | None = None
) -> typer.Exit:
    """Print ``error: invalid <option>=<value>: <why>`` to stderr; the caller raises the
    returned exit (status 2)."""
    typer.echo(f"error: {renamed(exc, names, given)}", err=True)
    return typer.Exit(2)
