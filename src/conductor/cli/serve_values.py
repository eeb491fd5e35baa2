"""Typed access to ``conductor serve``'s resolved options: a command-line option, else the
TOML ``[gateway]`` key, else the default; a ``[[models]]`` table's keys come first for its
model (:meth:`Values.layered`). Errors name the option or key a value came from."""

from __future__ import annotations

from collections.abc import Mapping

from conductor.cli.fields import renamed
from conductor.cli.serve_keys import DEFAULTS, FIELD_KEYS, KEYS
from conductor.core.errors import InvalidInput


class Values:
    """Typed access to the resolved options: a command-line option, else the TOML
    ``[gateway]`` key, else the default (:data:`DEFAULTS`)."""

    def __init__(
        self,
        cli: Mapping[str, object | None],
        toml: Mapping[str, object],
        via_set: frozenset[str] = frozenset(),
        *,
        parent: Values | None = None,
        table: str = "gateway",
    ) -> None:
        self.cli = cli
        self.toml = toml
        self.via_set = via_set
        self.parent = parent
        self.table = table

    def layered(self, table: Mapping[str, object], where: str) -> Values:
        """Values of a ``[[models]]`` table (named ``where``, e.g. ``models[1]``): its own
        keys, else these values (a command-line option, ``[gateway]``, the default)."""
        return Values({}, table, parent=self, table=where)

    def raw(self, name: str) -> object | None:
        if self.parent is not None:
            return self.toml[name] if name in self.toml else self.parent.raw(name)
        value = self.cli.get(name)
        if value is not None:
            return value
        if name in self.toml:
            return self.toml[name]
        return DEFAULTS.get(name)

    def where(self, name: str) -> str:
        """How the user wrote key ``name``: ``--the-option``, ``gateway.the_key``, or just
        the key when its default is used."""
        if self.parent is not None:
            return f"{self.table}.{name}" if name in self.toml else self.parent.where(name)
        if self.cli.get(name) is not None:
            return f"--set {name}" if name in self.via_set else "--" + name.replace("_", "-")
        if name in self.toml:
            return f"{self.table}.{name}"
        return name

    def renamed(self, exc: InvalidInput) -> InvalidInput:
        """``exc`` naming the option or TOML key the faulty value came from."""
        names = {key: self.where(key) for key in KEYS}
        names.update({field: self.where(key) for field, key in FIELD_KEYS.items()})
        return renamed(exc, names, {"tbt_slo_s": self.raw("tbt_slo_ms")})

    def opt_str(self, name: str) -> str | None:
        value = self.raw(name)
        if value is None or isinstance(value, str):
            return value
        raise InvalidInput(name, value, "must be a string")

    def opt_int(self, name: str) -> int | None:
        value = self.raw(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidInput(name, value, "must be an integer")
        return value

    def opt_float(self, name: str) -> float | None:
        value = self.raw(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidInput(name, value, "must be a number")
        return float(value)

    def str_(self, name: str) -> str:
        value = self.opt_str(name)
        if value is None:
            raise InvalidInput(name, None, "is required")
        return value

    def int_(self, name: str) -> int:
        value = self.opt_int(name)
        if value is None:
            raise InvalidInput(name, None, "is required")
        return value

    def float_(self, name: str) -> float:
        value = self.opt_float(name)
        if value is None:
            raise InvalidInput(name, None, "is required")
        return value

    def names(self, name: str) -> tuple[str, ...]:
        value = self.raw(name)
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise InvalidInput(name, value, "must be an array of strings")

    def bool_(self, name: str) -> bool:
        value = self.raw(name)
        if not isinstance(value, bool):
            raise InvalidInput(name, value, "must be true or false")
        return value
