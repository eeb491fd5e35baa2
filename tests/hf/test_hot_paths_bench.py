"""bench/hot_paths.py runs and reports every path it claims to measure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_module import load_bench


def test_hot_paths_bench_reports_each_path(tmp_path: Path) -> None:
    module = load_bench("hot_paths")
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
