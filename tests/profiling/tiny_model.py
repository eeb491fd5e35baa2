"""The small model folder the profiling tests point ``--model-path`` at: the demo tokenizer
and a ``config.json`` of 2 layers x 2 KV heads x 64 (1,024 KV bytes a token in bf16)."""

from __future__ import annotations

import json
from pathlib import Path

from conductor.demo.tokenizer import make_tokenizer

MODEL_CONFIG = {
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 1024,
}
KV_BYTES_PER_TOKEN = 2 * 2 * 64 * 2 * 2
"""layers x KV heads x head_dim x (K, V) x bytes."""


def write_model_dir(d: Path) -> Path:
    make_tokenizer(d)
    (d / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return d
