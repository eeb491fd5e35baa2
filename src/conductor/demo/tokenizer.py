"""A tiny byte-level BPE tokenizer with a chat template, trained locally (no downloads).

Used by ``conductor demo`` (gateway and emulated engines must tokenize alike) and by the
test suite's tiny vLLM model. Deterministic: the corpus is generated from a fixed seed over
:data:`conductor.hf.words.WORDS`.
"""

from __future__ import annotations

import random
from pathlib import Path

from conductor.hf.words import WORDS

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


def corpus(seed: int = SEED, lines: int = 4000) -> list[str]:
    """A fixed pseudo-random corpus: sentences over a small vocabulary plus digits."""
    rng = random.Random(seed)
    out: list[str] = []
    for i in range(lines):
        n = rng.randint(5, 20)
        words = [rng.choice(WORDS) for _ in range(n)]
        code = rng.randint(0, 99999)
        out.append(" ".join(words).capitalize() + f". Number {i % 997}, code {code}!")
    return out


def make_tokenizer(out_dir: Path, *, model_max_length: int = 4096) -> object:
    """Train the tokenizer and save it as a Hugging Face folder in ``out_dir``."""
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
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        model_max_length=model_max_length,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return fast
