"""The rooms of ``src/conductor`` and which way their imports point (docs/architecture.md).

``cli`` is the only composition root; the shells (``sim``, ``gateway``, ``emulator``, ``demo``,
``perf``, ``profiling``, ``replay``) never import each other; the shared parts (``wire``,
``web``, ``hf``, ``workload``) import only ``core`` and themselves; ``core`` imports only
itself (its purity, no clocks or sockets, is checked in tests/core/test_purity.py). No module
grows past ``MAX_LINES``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import conductor

SRC = Path(conductor.__file__).parent
MAX_LINES = 400

ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset({"core"}),
    "wire": frozenset({"core", "wire"}),
    "web": frozenset({"core", "web"}),
    "hf": frozenset({"core", "hf"}),
    "workload": frozenset({"core", "workload"}),
    "cluster": frozenset({"core", "cluster"}),
    "sim": frozenset({"core", "workload", "sim"}),
    "perf": frozenset({"core", "workload", "perf"}),
    "gateway": frozenset({"core", "wire", "web", "hf", "gateway"}),
    "emulator": frozenset({"core", "wire", "web", "hf", "emulator"}),
    "demo": frozenset({"core", "hf", "demo"}),
    "profiling": frozenset({"core", "web", "hf", "workload", "profiling"}),
    "replay": frozenset({"core", "web", "workload", "replay"}),
}
"""Room -> the rooms it may import. ``cli`` may import every room and is not listed."""


def _rooms() -> list[str]:
    return sorted(p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists())


def _conductor_imports(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return [m for m in out if m.startswith("conductor.")]


def test_every_room_has_a_rule() -> None:
    """A new top-level package must say where it sits before it can be imported."""
    assert set(_rooms()) - {"cli", "data"} == set(ALLOWED)


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_imports_point_one_way(room: str) -> None:
    files = sorted((SRC / room).rglob("*.py"))
    assert files
    for f in files:
        for mod in _conductor_imports(f):
            target = mod.split(".")[1]
            assert target in ALLOWED[room], f"{f.relative_to(SRC)} imports {mod}"


def test_only_the_cli_composes_shells() -> None:
    shells = {"sim", "gateway", "emulator", "demo", "perf", "profiling", "replay"}
    for f in sorted(SRC.rglob("*.py")):
        room = f.relative_to(SRC).parts[0]
        if room == "cli":
            continue
        for mod in _conductor_imports(f):
            target = mod.split(".")[1]
            assert target == room or target not in shells, f"{f.relative_to(SRC)} imports {mod}"


def test_modules_stay_small() -> None:
    big = {
        str(f.relative_to(SRC)): n
        for f in sorted(SRC.rglob("*.py"))
        if (n := len(f.read_text().splitlines())) > MAX_LINES
    }
    assert big == {}
