"""Micro-benchmarks of two hot paths of the gateway, each beside what it replaced.

- Tokenizing a bench prompt (256 characters, as bench/gateway_load.py sends) with the
  generated tiny byte-level BPE tokenizer: transformers' ``encode``, the Rust tokenizer's
  ``encode_batch_fast``, its pre-tokenizer alone, and ``conductor.hf.fast_bpe`` (what the
  gateway uses). Each prompt has a unique suffix, as in the load test.
- Decoding one vLLM KV-event batch (a BlockStored of 8 blocks x 32 tokens and a
  BlockRemoved): the generic decoder and the typed msgspec path ``decode_payload`` takes.

Run: ``.venv/bin/python bench/hot_paths.py [--n 3000] [--json out/hot_paths.json]``.
Prints microseconds per call (median of 5 rounds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conductor.demo.tokenizer import make_tokenizer
from conductor.hf.fast_bpe import FastByteLevelBpe
from conductor.hf.tokenizer import HfTokenizer
from conductor.wire import vllm_events_encode as enc
from conductor.wire.vllm_events import _decode_payload_generic, decode_payload


def per_call_us(fn: Callable[[int], object], n: int, rounds: int = 5) -> float:
    fn(0)
    times = []
    for r in range(rounds):
        t0 = time.perf_counter()
        for i in range(n):
            fn(r * n + i)
        times.append((time.perf_counter() - t0) / n * 1e6)
    return round(statistics.median(times), 1)


def prompt(i: int) -> str:
    prefix = ("[group 3] shared system prompt. " * 64)[:128]
    return prefix + (f" request {i} asks something unique." * 64)[:128]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=3000, help="calls per round")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.n <= 0:
        p.error("--n must be > 0")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        make_tokenizer(Path(tmp))
        tok = HfTokenizer.load(Path(tmp))
        hf: Any = tok._tok
        rust = hf._tokenizer
        fast = FastByteLevelBpe.build(rust)
        assert fast is not None, "the tiny tokenizer should take the fast path"
        out["tokenize_us"] = {
            "transformers_encode": per_call_us(lambda i: hf.encode(prompt(i)), args.n),
            "rust_encode_batch_fast": per_call_us(
                lambda i: rust.encode_batch_fast([prompt(i)], add_special_tokens=True), args.n
            ),
            "rust_pre_tokenizer_only": per_call_us(
                lambda i: rust.pre_tokenizer.pre_tokenize_str(prompt(i)), args.n
            ),
            "fast_bpe": per_call_us(
                lambda i: fast.encode(prompt(i), add_special_tokens=True), args.n
            ),
        }
    events = [
        enc.block_stored(list(range(1000, 1008)), list(range(256)), 32, parent_block_hash=999),
        enc.block_removed([5, 6, 7]),
    ]
    payload = enc.encode_payload(events, 1.0, 0)
    out["kv_batch_decode_us"] = {
        "generic": per_call_us(lambda i: _decode_payload_generic(payload), args.n),
        "typed (decode_payload)": per_call_us(lambda i: decode_payload(payload), args.n),
    }
    for group, rows in out.items():
        print(group)
        for name, us in rows.items():
            print(f"  {name:28s} {us:8.1f} us")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
