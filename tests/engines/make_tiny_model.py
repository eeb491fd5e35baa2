"""Make the tiny random-weight Llama model that the real-vLLM tests serve.

Run with the vLLM venv's interpreter (it has torch, transformers and tokenizers)::

    .venv-vllm/bin/python tests/engines/make_tiny_model.py .tiny-model

Writes a Hugging Face model folder: a byte-level BPE tokenizer (vocab 1024, trained on a
fixed, generated corpus) with a chat template, and a 2-layer Llama (hidden 256, 4 heads of
64, 2 KV heads, 4096 positions) with weights drawn from a fixed torch seed. Running it twice
gives byte-identical tokenizer files and identical weights. No network is used.

Another tiny model (the several-models tests serve two): ``--seed``, ``--layers`` and
``--hidden`` (a multiple of 128: heads of 64, half as many KV heads) change the weights
and the size; the defaults give the model above::

    .venv-vllm/bin/python tests/engines/make_tiny_model.py .tiny-model-b --seed 4321 \
        --layers 1 --hidden 128
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The tokenizer is the package's own (conductor.demo.tokenizer); this script runs with the
# vLLM venv's interpreter, which does not have conductor installed, so import it from src/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from conductor.demo.tokenizer import make_tokenizer


def make_model(
    out_dir: Path, tokenizer: object, *, seed: int = 1234, layers: int = 2, hidden: int = 256
) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    vocab = len(tokenizer)  # type: ignore[arg-type]
    heads = hidden // 64
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        head_dim=64,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        bos_token_id=tokenizer.bos_token_id,  # type: ignore[attr-defined]
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
        pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    model.eval()
    model.save_pretrained(str(out_dir), safe_serialization=True)
    GenerationConfig(
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id
    ).save_pretrained(str(out_dir))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Write a tiny random-weight Llama model.")
    parser.add_argument("out_dir", nargs="?", default=".tiny-model", type=Path)
    parser.add_argument("--seed", type=int, default=1234, help="torch seed of the weights")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size (n x 128)")
    args = parser.parse_args(argv[1:])
    if args.layers < 1 or args.hidden < 128 or args.hidden % 128:
        parser.error("--layers must be >= 1 and --hidden a positive multiple of 128")
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(out_dir)
    make_model(out_dir, tokenizer, seed=args.seed, layers=args.layers, hidden=args.hidden)
    print(f"tiny model written to {out_dir} (vocab {len(tokenizer)})")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
