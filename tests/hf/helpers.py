"""A tokenizer folder for tests, trained in a moment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def make_hf_tokenizer(path: Path, **options: Any) -> None:
    """A small byte-level BPE tokenizer saved as a transformers folder (no chat template);
    skips the test without the 'tokenizer' extra."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["the cache holds blocks of keys and values"] * 20, trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", **options
    )
    fast.save_pretrained(str(path))
