"""Make the tiny random-weight Llama model that the real-vLLM tests serve.

Run with the vLLM venv's interpreter (it has torch, transformers and tokenizers)::

    .venv-vllm/bin/python tests/engines/make_tiny_model.py .tiny-model

Writes a Hugging Face model folder: a byte-level BPE tokenizer (vocab 1024, trained on a
fixed, generated corpus) with a chat template, and a 2-layer Llama (hidden 256, 4 heads of
64, 2 KV heads, 4096 positions) with weights drawn from a fixed torch seed. Running it twice
gives byte-identical tokenizer files and identical weights. No network is used.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The tokenizer is the package's own (conductor.demo.tokenizer); this script runs with the
# vLLM venv's interpreter, which does not have conductor installed, so import it from src/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from conductor.demo.tokenizer import make_tokenizer


def make_model(out_dir: Path, tokenizer: object) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    vocab = len(tokenizer)  # type: ignore[arg-type]
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
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
    torch.manual_seed(1234)
    model = LlamaForCausalLM(cfg)
    model.eval()
    model.save_pretrained(str(out_dir), safe_serialization=True)
    GenerationConfig(
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id
    ).save_pretrained(str(out_dir))


def main(argv: list[str]) -> int:
    out_dir = Path(argv[1] if len(argv) > 1 else ".tiny-model")
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(out_dir)
    make_model(out_dir, tokenizer)
    print(f"tiny model written to {out_dir} (vocab {len(tokenizer)})")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
