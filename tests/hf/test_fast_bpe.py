"""The fast byte-level BPE encoder gives exactly the tokenizer's ids, or declines."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

from conductor.demo.tokenizer import corpus, make_tokenizer
from conductor.hf.fast_bpe import FastByteLevelBpe, verification_corpus
from conductor.hf.tokenizer import HfTokenizer

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def train(pre: Any, *, normalizer: Any = None, specials: list[str] | None = None) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre
    if normalizer is not None:
        tok.normalizer = normalizer
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        min_frequency=2,
        special_tokens=specials or ["<s>", "<|user|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def llama3_style() -> Tokenizer:
    tok = train(
        pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    )
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", bos)]
    )
    return tok


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HfTokenizer]:
    path = tmp_path_factory.mktemp("tok")
    make_tokenizer(path)
    yield HfTokenizer.load(Path(path))


@pytest.fixture(scope="module")
def llama3() -> Tokenizer:
    return llama3_style()


TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from(list(" \n\t\r\u00a0\u3000\u2028'sdtmlv0123456789.,!?<|>é中🙂")),
        st.characters(codec="utf-8"),
    ),
    max_size=80,
)


def test_the_tokenizer_takes_the_fast_path(tiny: HfTokenizer) -> None:
    assert tiny.fast_path == "byte-level-bpe"


@settings(max_examples=300, deadline=None)
@given(TEXT, st.booleans())
def test_gpt2_style_ids_are_the_tokenizers(tiny: HfTokenizer, text: str, special: bool) -> None:
    slow = tiny._tok._tokenizer.encode(text, add_special_tokens=special).ids
    assert tiny.encode(text, add_special_tokens=special) == slow


@settings(max_examples=300, deadline=None)
@given(TEXT, st.booleans())
def test_llama3_style_ids_are_the_tokenizers(llama3: Tokenizer, text: str, special: bool) -> None:
    fast = FastByteLevelBpe.build(llama3)
    assert fast is not None
    got = fast.encode(text, add_special_tokens=special)
    want = llama3.encode(text, add_special_tokens=special).ids
    assert got is None or got == want
    if "<s>" not in text and "<|user|>" not in text:
        assert got == want


def test_special_ids_around_the_text(llama3: Tokenizer) -> None:
    fast = FastByteLevelBpe.build(llama3)
    assert fast is not None
    bos = llama3.token_to_id("<s>")
    plain = fast.encode("the cache holds blocks", add_special_tokens=False)
    assert plain is not None and plain == llama3.encode("the cache holds blocks").ids[1:]
    assert fast.encode("the cache holds blocks", add_special_tokens=True) == [bos, *plain]


def test_text_with_an_added_token_goes_to_the_tokenizer(tiny: HfTokenizer) -> None:
    text = "hi <|user|> there"
    backend = tiny._tok._tokenizer
    fast = FastByteLevelBpe.build(backend)
    assert fast is not None and fast.encode(text, add_special_tokens=False) is None
    assert tiny.encode(text, add_special_tokens=False) == backend.encode(text).ids
    assert backend.token_to_id("<|user|>") in tiny.encode(text, add_special_tokens=False)


@pytest.mark.parametrize(
    "tokenizer",
    [
        pytest.param(lambda: train(pre_tokenizers.ByteLevel(add_prefix_space=True)), id="prefix"),
        pytest.param(
            lambda: train(pre_tokenizers.ByteLevel(), normalizer=normalizers.NFKC()), id="nfkc"
        ),
        pytest.param(lambda: train(pre_tokenizers.Whitespace()), id="whitespace"),
        pytest.param(
            lambda: train(pre_tokenizers.ByteLevel(), specials=["<s>", "my token"]), id="spaced"
        ),
    ],
)
def test_shapes_it_cannot_reproduce_are_declined(tokenizer: Any) -> None:
    assert FastByteLevelBpe.build(tokenizer()) is None


def test_a_wrong_pattern_is_caught_by_the_self_check(llama3: Tokenizer) -> None:
    fast = FastByteLevelBpe.build(llama3)
    assert fast is not None
    fast._findall = lambda text: text.split(" ")  # a plausible but wrong word split
    assert not fast.agrees_with(llama3)


def test_the_corpus_is_seeded_and_awkward() -> None:
    texts = verification_corpus(50)
    assert texts == verification_corpus(50)
    joined = "".join(texts)
    for char in ("\u00a0", "\u3000", "\n", "中", "'"):
        assert char in joined
