"""fixtures.engine_dtype: float32 engines where the CPU cannot run bfloat16 natively."""

from __future__ import annotations

from pathlib import Path

from tests.engines.fixtures import engine_dtype


def _cpuinfo(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return path


def test_float32_without_native_bfloat16(tmp_path: Path) -> None:
    avx2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
    assert engine_dtype(_cpuinfo(tmp_path, avx2)) == "float32"


def test_vllm_default_with_native_bfloat16(tmp_path: Path) -> None:
    for flag in ("avx512_bf16", "amx_bf16"):
        text = f"processor\t: 0\nflags\t\t: fpu avx2 avx512f {flag}\n"
        assert engine_dtype(_cpuinfo(tmp_path, text)) is None


def test_vllm_default_when_unknown(tmp_path: Path) -> None:
    assert engine_dtype(tmp_path / "missing") is None
    assert engine_dtype(_cpuinfo(tmp_path, "processor\t: 0\n")) is None
