"""The emulator's tokenizers and deterministic output."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from conductor.emulator.tokenizer import ByteTokenizer, chat_ids, output_tokens
from conductor.hf.tokenizer import HfTokenizer, TokenizerLoadError
from conductor.hf.words import WORDS
from tests.hf.helpers import make_hf_tokenizer


def test_byte_tokenizer_is_utf8_bytes() -> None:
    tok = ByteTokenizer()
    assert tok.encode("hé") == [104, 195, 169]
    assert tok.decode([104, 195, 169]) == "hé"
    assert tok.vocab_size == 256
    rendered = chat_ids(tok, [{"role": "user", "content": "hi"}])
    assert tok.decode(rendered) == "<|user|>\nhi\n<|assistant|>\n"


def test_output_is_a_function_of_seed_and_prompt() -> None:
    tok = ByteTokenizer()
    ids, texts = output_tokens(tok, 0, [1, 2, 3], 40)
    assert len(ids) == len(texts) == 40
    assert output_tokens(tok, 0, [1, 2, 3], 40) == (ids, texts)
    # A shorter request gets a prefix of the same completion.
    assert output_tokens(tok, 0, [1, 2, 3], 10) == (ids[:10], texts[:10])
    assert output_tokens(tok, 1, [1, 2, 3], 40)[0] != ids
    assert output_tokens(tok, 0, [1, 2, 4], 40)[0] != ids
    assert "".join(texts) == tok.decode(ids)
    assert output_tokens(tok, 0, [1], 0) == ([], [])


def test_output_tokens_are_stable_across_versions() -> None:
    """Pinned: changing the generator (or :data:`conductor.hf.words.WORDS`) changes every
    emulated completion."""
    tok = ByteTokenizer()
    _, texts = output_tokens(tok, 0, tok.encode("hello"), 24)
    assert "".join(texts) == " decode prefill garden t"


def test_hf_tokenizer_from_a_local_folder(tmp_path: Path) -> None:
    make_hf_tokenizer(tmp_path)
    tok = HfTokenizer.load(tmp_path)
    ids = tok.encode("the cache holds")
    assert tok.decode(ids) == "the cache holds"
    assert tok.vocab_size >= 256
    out_ids, texts = output_tokens(tok, 0, ids, 6)
    assert len(out_ids) == 6 and "".join(texts) == tok.decode(out_ids)
    chat = chat_ids(tok, [{"role": "user", "content": "hi"}])  # no template: ours
    assert tok.decode(chat) == "<|user|>\nhi\n<|assistant|>\n"


class _ThroughTransformers:
    """The emulator's tokenizer as it was before it called the Rust tokenizer directly:
    everything through transformers (the reference the fast path must match)."""

    name = "reference"

    def __init__(self, path: Path) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return [int(t) for t in self._tok.encode(text, add_special_tokens=add_special_tokens)]

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(token_ids)))


TEXTS = (
    "the cache holds blocks of keys and values",
    " leading space, trailing space ",
    "<s> special </s> tokens inside<s>",
    "unicode: éß 中文 🙂 and tabs\tand\nnewlines",
    "[group 1] shared system prompt. request 1234 asks something unique.",
    "",
)


@pytest.mark.parametrize("options", [{}, {"clean_up_tokenization_spaces": True}])
def test_hf_tokenizer_gives_what_transformers_gives(tmp_path: Path, options: Any) -> None:
    make_hf_tokenizer(tmp_path, **options)
    tok = HfTokenizer.load(tmp_path)
    # encoding skips transformers; decoding too unless it cleans up spaces
    assert tok.fast_path != "transformers"
    assert tok.decodes_with_rust is not options
    ref = _ThroughTransformers(tmp_path)
    assert tok.vocab_size == ref.vocab_size
    for text in TEXTS:
        for special in (True, False):
            ids = tok.encode(text, add_special_tokens=special)
            assert ids == ref.encode(text, add_special_tokens=special), (text, special)
            assert all(type(i) is int for i in ids)
        ids = ref.encode(text)
        for k in range(len(ids) + 1):
            assert tok.decode(ids[:k]) == ref.decode(ids[:k])
    for seed, prompt, n in ((0, [1, 2, 3], 1), (7, ref.encode(TEXTS[0]), 9), (3, [5] * 40, 33)):
        assert output_tokens(tok, seed, prompt, n) == output_tokens(ref, seed, prompt, n)


def test_hf_tokenizer_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match=r"no tokenizer\.json .* in .*missing"):
        HfTokenizer.load(tmp_path / "missing")
    pytest.importorskip("transformers")
    (tmp_path / "tokenizer.json").write_text("{")
    with pytest.raises(TokenizerLoadError, match="cannot load the tokenizer in"):
        HfTokenizer.load(tmp_path)


def test_the_words_are_ascii() -> None:
    """The byte tokenizer's output texts are one character per byte."""
    assert all(w.isascii() and w for w in WORDS)


def test_emulator_serves_with_a_hf_tokenizer(tmp_path: Path) -> None:
    import httpx

    from conductor.emulator.config import EmulatorConfig
    from tests.emulator.helpers import running_emulator

    make_hf_tokenizer(tmp_path)
    tok = HfTokenizer.load(tmp_path)
    prompt = "the cache holds blocks of keys and values " * 8
    with running_emulator(EmulatorConfig(instant=True), tokenizer=tok) as emu:
        r = httpx.post(
            f"{emu.base_url}/v1/completions", json={"prompt": prompt, "max_tokens": 5}, timeout=10
        )
        info = httpx.get(f"{emu.base_url}/emulator/info", timeout=10).json()
    body = r.json()
    assert body["usage"]["prompt_tokens"] == len(tok.encode(prompt))
    _, texts = output_tokens(tok, 0, tok.encode(prompt), 5)
    assert body["choices"][0]["text"] == "".join(texts)
    assert info["tokenizer"] == tmp_path.name
