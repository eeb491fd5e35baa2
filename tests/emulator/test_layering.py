"""The emulator depends on ``core``, ``wire``, ``hf`` and the ``web`` server only
(cli -> emulator -> core); nothing outside ``cli`` imports the emulator."""

from __future__ import annotations

import ast
from pathlib import Path

import conductor

SRC = Path(conductor.__file__).parent
ALLOWED = (
    "conductor.core",
    "conductor.wire",
    "conductor.web",
    "conductor.hf",
    "conductor.emulator",
)


def _conductor_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
    return [m for m in out if m == "conductor" or m.startswith("conductor.")]


def test_emulator_imports_only_core_wire_and_web() -> None:
    files = sorted((SRC / "emulator").rglob("*.py"))
    assert len(files) >= 8
    for f in files:
        for mod in _conductor_imports(f):
            assert mod.startswith(ALLOWED), f"emulator/{f.name} imports {mod}"


def test_only_the_cli_imports_the_emulator() -> None:
    for f in sorted(SRC.rglob("*.py")):
        rel = f.relative_to(SRC)
        if rel.parts[0] in ("emulator", "cli"):
            continue
        for mod in _conductor_imports(f):
            assert not mod.startswith("conductor.emulator"), f"{rel} imports {mod}"
