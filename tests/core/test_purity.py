"""The core stays pure: no asyncio, sockets, files, env reads or wall clock (DESIGN.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import conductor.core

CORE = Path(conductor.core.__file__).parent
FORBIDDEN_MODULES = {
    "asyncio",
    "socket",
    "zmq",
    "httpx",
    "os",
    "time",
    "datetime",
    "subprocess",
    "threading",
    "pathlib",
    "io",
    "shutil",
    "uvicorn",
    "starlette",
    "sys",
}
FORBIDDEN_PREFIXES = ("conductor.sim", "conductor.gateway", "conductor.emulator", "conductor.cli")
FORBIDDEN_CALLS = {"open", "input", "print"}


def _imports(tree: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
    return out


def test_core_imports_nothing_impure() -> None:
    files = sorted(CORE.rglob("*.py"))
    assert len(files) > 10
    for f in files:
        tree = ast.parse(f.read_text(), filename=str(f))
        for mod in _imports(tree):
            top = mod.split(".")[0]
            assert top not in FORBIDDEN_MODULES, f"{f.name} imports {mod}"
            assert not mod.startswith(FORBIDDEN_PREFIXES), f"{f.name} imports {mod}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in FORBIDDEN_CALLS, f"{f.name} calls {node.func.id}()"
