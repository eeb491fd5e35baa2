"""Layering: the gateway imports the core, never the simulator, emulator or CLI; wire
formats (msgpack, msgspec) stay under ``gateway/wire``."""

from __future__ import annotations

import ast
from pathlib import Path

import conductor.gateway

GATEWAY = Path(conductor.gateway.__file__).parent
FORBIDDEN_PREFIXES = ("conductor.sim", "conductor.emulator", "conductor.cli", "conductor.workload")
WIRE_ONLY = {"msgpack", "msgspec"}


def _imports(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
    return out


def test_gateway_imports_only_core_and_itself() -> None:
    files = sorted(GATEWAY.rglob("*.py"))
    assert len(files) > 10
    for f in files:
        for mod in _imports(f):
            assert not mod.startswith(FORBIDDEN_PREFIXES), f"{f.name} imports {mod}"
            if mod.split(".")[0] in WIRE_ONLY:
                assert f.parent.name == "wire", f"{f.name} decodes a wire format ({mod})"
