"""The engine helpers explain why a real engine cannot start, and hand out distinct ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engines import fixtures


def test_missing_venv_and_model_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv, model = tmp_path / "venv", tmp_path / "model"
    monkeypatch.setattr(fixtures, "VLLM_VENV", venv)
    monkeypatch.setattr(fixtures, "VLLM_PYTHON", venv / "bin" / "python")
    monkeypatch.setattr(fixtures, "TINY_MODEL", model)
    assert fixtures.missing_prerequisites() == f"no vLLM CPU venv at {venv} (run `make vllm-env`)"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / ".installed").touch()
    assert fixtures.missing_prerequisites() == f"no tiny model at {model} (run `make tiny-model`)"
    model.mkdir()
    (model / ".generated").touch()
    assert fixtures.missing_prerequisites() is None


def test_free_ports_are_distinct() -> None:
    ports = fixtures.free_ports(5)
    assert len(set(ports)) == 5
    assert all(0 < p < 65536 for p in ports)
