"""``conductor serve``'s engines: ``--engine URL,key=value,...`` specs and ``[[engines]]``
tables, parsed into :class:`~conductor.gateway.config.EngineConfig` values (moved out of
``serve_config`` to keep that module small; ``serve_config`` re-exports both)."""

from __future__ import annotations

from collections.abc import Mapping

from conductor.core.errors import InvalidInput
from conductor.gateway.config import EngineConfig, engine_from_mapping


def parse_engine_spec(spec: str) -> dict[str, object]:
    """``URL,key=value,...`` (the URL may also be given as ``url=...``) -> key/value pairs."""
    values: dict[str, object] = {}
    for i, part in enumerate(p.strip() for p in spec.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep:
            if i != 0:
                raise InvalidInput("engine", spec, f"{part!r} is not key=value")
            key, value = "url", part
        key = key.strip()
        if key in values:
            raise InvalidInput("engine", spec, f"{key!r} given twice")
        values[key] = value.strip()
    return values


def _engines(
    block_size: int, toml_engines: list[Mapping[str, object]], engine_specs: list[str]
) -> tuple[EngineConfig, ...]:
    engines: list[EngineConfig] = []
    for i, values in enumerate(toml_engines):
        engines.append(
            engine_from_mapping(values, default_block_size=block_size, where=f"engines[{i}]")
        )
    for j, spec in enumerate(engine_specs):
        engines.append(
            engine_from_mapping(
                parse_engine_spec(spec),
                default_block_size=block_size,
                where=f"engines[{len(toml_engines) + j}]",
            )
        )
    if not engines:
        raise InvalidInput("engines", [], "none given (--engine or [[engines]] in --config)")
    return tuple(engines)


__all__ = ["_engines", "parse_engine_spec"]
