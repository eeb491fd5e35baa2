"""Make the tiny random-weight Llama model that the real-vLLM tests serve.

Run with the vLLM venv's interpreter (it has torch, transformers and tokenizers)::

    .venv-vllm/bin/python tests/engines/make_tiny_model.py .tiny-model

Writes a Hugging Face model folder: a byte-level BPE tokenizer (vocab 1024, trained on a
fixed, generated corpus) with a chat template, and a 2-layer Llama (hidden 256, 4 heads of
64, 2 KV heads, 4096 positions) with weights drawn from a fixed torch seed. Running it twice
gives byte-identical tokenizer files and identical weights. No network is used.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

SEED = 1234
VOCAB_SIZE = 1024
BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_TEXT = (
    "the cache holds blocks of keys and values for every token a model has seen "
    "a scheduler sends each request to the engine that already has its prefix "
    "prefill computes the prompt while decode produces one token at a time "
    "mooncake stores kv blocks in a shared pool across many machines "
    "conductor chooses where to prefill where to decode and which blocks to move "
    "latency throughput goodput memory bandwidth network transfer reuse eviction "
    "alpha beta gamma delta one two three four five six seven eight nine ten "
    "red green blue yellow river mountain ocean forest city garden window door"
)


def corpus(seed: int = SEED, lines: int = 4000) -> list[str]:
    """A fixed pseudo-random corpus: sentences over a small vocabulary plus digits."""
    rng = random.Random(seed)
    vocabulary = _TEXT.split()
    out: list[str] = []
    for i in range(lines):
        n = rng.randint(5, 20)
        words = [rng.choice(vocabulary) for _ in range(n)]
        code = rng.randint(0, 99999)
        out.append(" ".join(words).capitalize() + f". Number {i % 997}, code {code}!")
    return out


def make_tokenizer(out_dir: Path) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[PAD, BOS, EOS, UNK, "<|user|>", "<|assistant|>", "<|system|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return fast


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
    torch.manual_seed(SEED)
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
