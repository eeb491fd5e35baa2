"""What ``conductor profile`` learns about the engine and the model without timing anything:
the served model's name (``GET /v1/models``), the KV block size and capacity (vLLM's
``vllm:cache_config_info`` metric: ``block_size`` and ``num_gpu_blocks`` labels), and the
transformer's shape (the model folder's ``config.json``, its parameter count from the
``*.safetensors`` headers)."""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import httpx

from conductor.core.costmodel import ModelSpec
from conductor.core.errors import InvalidInput

_INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1}


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """The served model name, and the KV block size / capacity when the engine says."""

    model: str
    block_size_tokens: int | None
    kv_capacity_tokens: int | None


def served_model(client: httpx.Client, url: str) -> str:
    """The first model ``GET /v1/models`` lists."""
    r = client.get(f"{url}/v1/models")
    r.raise_for_status()
    data = r.json().get("data") or []
    if not data or not isinstance(data[0], dict) or "id" not in data[0]:
        raise InvalidInput("url", url, "GET /v1/models lists no model")
    return str(data[0]["id"])


def cache_config(metrics_text: str) -> tuple[int | None, int | None]:
    """``(block_size, capacity in tokens)`` from vLLM's ``vllm:cache_config_info`` labels
    (``kv_cache_size_tokens``, else ``num_gpu_blocks * block_size``); None each when
    absent."""
    m = _INFO.search(metrics_text)
    if m is None:
        return None, None
    labels = dict(_LABEL.findall(m.group("labels")))

    def as_int(key: str) -> int | None:
        value = labels.get(key, "")
        return int(value) if value.isdigit() and int(value) > 0 else None

    block, blocks = as_int("block_size"), as_int("num_gpu_blocks")
    tokens = as_int("kv_cache_size_tokens")
    if tokens is None and block is not None and blocks is not None:
        tokens = block * blocks
    return block, tokens


def engine_facts(client: httpx.Client, url: str, model: str | None) -> EngineFacts:
    name = model if model is not None else served_model(client, url)
    block = capacity = None
    try:
        r = client.get(f"{url}/metrics")
        if r.status_code == 200:
            block, capacity = cache_config(r.text)
    except httpx.HTTPError:
        pass
    return EngineFacts(name, block, capacity)


def _parameters(model_path: Path) -> int:
    """Parameters in the model folder's safetensors files (their headers only)."""
    total = 0
    for f in sorted(model_path.glob("*.safetensors")):
        with f.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for name, entry in header.items():
            if name == "__metadata__" or not isinstance(entry, dict):
                continue
            n = 1
            for dim in entry.get("shape", []):
                n *= int(dim)
            total += n
    return total


def model_spec(model_path: Path, *, bytes_per_elem: int) -> ModelSpec:
    """The transformer's shape from ``config.json``; ``bytes_per_elem``: the engine's KV and
    weight dtype (vLLM serves float32 checkpoints in bfloat16 by default: 2)."""
    try:
        cfg = json.loads((model_path / "config.json").read_text())
    except OSError as exc:
        raise InvalidInput("model_path", str(model_path), f"no config.json: {exc}") from None
    except ValueError as exc:
        raise InvalidInput("model_path", str(model_path), f"bad config.json: {exc}") from None
    text = cfg.get("text_config")
    if isinstance(text, dict):  # multimodal configs nest the language model's
        cfg = {**cfg, **text}

    def key(*names: str) -> int:
        for n in names:
            v = cfg.get(n)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
        raise InvalidInput("model_path", str(model_path), f"config.json has no {names[0]}")

    layers = key("num_hidden_layers", "n_layer", "num_layers")
    hidden = key("hidden_size", "n_embd", "d_model")
    q_heads = key("num_attention_heads", "n_head")
    kv_heads = cfg.get("num_key_value_heads") or q_heads
    head_dim = cfg.get("head_dim") or hidden // q_heads
    params = _parameters(model_path)
    if params == 0:  # no safetensors: the usual estimate, 12 l d^2 plus embeddings
        params = 12 * layers * hidden * hidden + 2 * int(cfg.get("vocab_size", 0)) * hidden
    return ModelSpec(
        name=model_path.resolve().name,
        layers=layers,
        hidden=hidden,
        q_heads=q_heads,
        kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        params_b=params / 1e9,
        ffn=int(cfg.get("intermediate_size") or 4 * hidden),
        vocab=key("vocab_size"),
        bytes_per_elem=bytes_per_elem,
    )
