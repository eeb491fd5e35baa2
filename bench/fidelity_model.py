"""A larger random-weight Llama for bench/fidelity.py, so that on a CPU the engine's prefill
and decode compute dominate the fixed per-request and per-token overheads (HTTP, the API
server, the gateway) that the simulator does not model.

Run with the vLLM venv's interpreter (it has torch and transformers)::

    .venv-vllm/bin/python bench/fidelity_model.py .fidelity-model

Same tokenizer as ``.tiny-model`` (tests/engines/make_tiny_model.py: vocab 1024, the same
ids for the same text) and the same context (4096 positions); 6 layers of hidden 768
(12 heads of 64, 4 KV heads, FFN 2048): about 38M parameters, weights from a fixed seed.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from conductor.demo.tokenizer import make_tokenizer  # noqa: E402

SHAPE = {
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "head_dim": 64,
}


def main(argv: list[str]) -> int:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = Path(argv[1] if len(argv) > 1 else ".fidelity-model")
    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(out)
    cfg = LlamaConfig(
        vocab_size=len(tok),  # type: ignore[arg-type]
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        bos_token_id=tok.bos_token_id,  # type: ignore[attr-defined]
        eos_token_id=tok.eos_token_id,  # type: ignore[attr-defined]
        pad_token_id=tok.pad_token_id,  # type: ignore[attr-defined]
        tie_word_embeddings=False,
        torch_dtype="float32",
        **SHAPE,
    )
    torch.manual_seed(1234)
    model = LlamaForCausalLM(cfg)
    model.eval()
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id
    ).save_pretrained(str(out))
    (out / ".generated").touch()
    n = sum(p.numel() for p in model.parameters())
    print(f"model written to {out}: {n / 1e6:.1f}M parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
