"""Layering: the gateway imports the core, the wire formats and the web server, never the
simulator, emulator or CLI; it decodes no wire format itself (msgpack stays in
``conductor.wire``; msgspec only in ``conductor.wire`` and the gateway's JSON codec).
``conductor.wire`` imports only the core."""

from __future__ import annotations

import ast
from pathlib import Path

import conductor.gateway
import conductor.wire

GATEWAY = Path(conductor.gateway.__file__).parent
WIRE = Path(conductor.wire.__file__).parent
FORBIDDEN_PREFIXES = ("conductor.sim", "conductor.emulator", "conductor.cli", "conductor.workload")
WIRE_ONLY = {"msgpack", "msgspec"}
JSON_CODEC = GATEWAY / "json_codec.py"


def _imports(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
    return out


def test_gateway_imports_only_core_wire_web_and_itself() -> None:
    files = sorted(GATEWAY.rglob("*.py"))
    assert len(files) > 10
    for f in files:
        for mod in _imports(f):
            assert not mod.startswith(FORBIDDEN_PREFIXES), f"{f.name} imports {mod}"
            if mod.split(".")[0] in WIRE_ONLY:
                assert (f, mod) == (JSON_CODEC, "msgspec"), f"{f.name} decodes a wire format"


def test_wire_imports_nothing_of_gateway_or_emulator() -> None:
    files = sorted(WIRE.rglob("*.py"))
    assert {f.name for f in files} >= {"events.py", "vllm_events.py", "vllm_events_encode.py"}
    for f in files:
        for mod in _imports(f):
            if mod == "conductor" or mod.startswith("conductor."):
                assert mod.startswith(("conductor.core", "conductor.wire")), (
                    f"wire/{f.name} imports {mod}"
                )


def test_only_the_engines_package_knows_engine_kinds() -> None:
    """Outside ``gateway/engines/`` the gateway reaches a kind only through the registry."""
    for f in sorted(GATEWAY.rglob("*.py")):
        if f.parent.name == "engines":
            continue
        for mod in _imports(f):
            assert not mod.startswith("conductor.gateway.engines.vllm"), f"{f.name} imports {mod}"
