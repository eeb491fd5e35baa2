"""bench/hot_paths.py runs and reports every path it claims to measure."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "hot_paths.py"


def test_hot_paths_bench_reports_each_path(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("hot_paths", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["hot_paths"] = module
    spec.loader.exec_module(module)
    out = tmp_path / "hot.json"
    assert module.main(["--n", "20", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["tokenize_us"]) == {
        "transformers_encode",
        "rust_encode_batch_fast",
        "rust_pre_tokenizer_only",
        "fast_bpe",
    }
    assert set(result["kv_batch_decode_us"]) == {"generic", "typed (decode_payload)"}
    assert all(v > 0 for group in result.values() for v in group.values())
    with pytest.raises(SystemExit):
        module.main(["--n", "0"])
