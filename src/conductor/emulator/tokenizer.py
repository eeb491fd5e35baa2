"""Tokenizers for the emulator and its deterministic "model output".

Default: :class:`ByteTokenizer`, no model needed. **A token is one byte of the UTF-8
encoding of the text: token id = byte value (0-255), vocabulary 256, no BOS/EOS, no special
tokens.** ``encode(text) == list(text.encode("utf-8"))`` and ``decode(ids) ==
bytes(ids).decode("utf-8", errors="replace")``, so any client (a gateway computing prefix
hashes) can reproduce it in one line. Chat messages are rendered with :data:`CHAT_TEMPLATE`
before encoding.

Optional: :class:`HfTokenizer` wraps a local Hugging Face tokenizer folder
(``--model-path``; needs the ``tokenizer`` extra) and uses its own chat template.

Output text: :func:`output_tokens` draws words from :data:`OUTPUT_WORDS` with a
:class:`random.Random` seeded by ``(seed, prompt token ids)``, so the same prompt and seed
always produce the same completion; sampling parameters (temperature, top_p) are ignored.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import xxhash

from conductor.core.errors import InvalidInput
from conductor.hf.fast_bpe import FastByteLevelBpe
from conductor.hf.rust import rust_backend

BYTE_VOCAB_SIZE = 256

CHAT_TEMPLATE = "<|{role}|>\n{content}\n"
"""Each message of a chat request, concatenated; then :data:`CHAT_GENERATION_PROMPT`."""
CHAT_GENERATION_PROMPT = "<|assistant|>\n"

OUTPUT_WORDS: tuple[str, ...] = (
    "the",
    "cache",
    "holds",
    "blocks",
    "of",
    "keys",
    "and",
    "values",
    "for",
    "every",
    "token",
    "a",
    "model",
    "has",
    "seen",
    "prefill",
    "computes",
    "prompt",
    "while",
    "decode",
    "produces",
    "one",
    "at",
    "time",
    "scheduler",
    "sends",
    "each",
    "request",
    "to",
    "engine",
    "that",
    "already",
    "its",
    "prefix",
    "latency",
    "throughput",
    "memory",
    "bandwidth",
    "transfer",
    "reuse",
    "eviction",
)


class Tokenizer(Protocol):
    name: str

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def render_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Token ids of a chat conversation followed by the assistant's generation prompt."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as tokens (see the module docstring)."""

    name = "bytes"

    @property
    def vocab_size(self) -> int:
        return BYTE_VOCAB_SIZE

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(token_ids).decode("utf-8", errors="replace")

    def render_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        text = "".join(CHAT_TEMPLATE.format(role=m["role"], content=m["content"]) for m in messages)
        return self.encode(text + CHAT_GENERATION_PROMPT)


class HfTokenizer:
    """A Hugging Face tokenizer loaded from a local folder (never from a hub).

    Encoding and decoding call the Rust tokenizer (``tokenizers.Tokenizer``) directly when
    that gives what transformers gives (checked on a sample at load, see
    :func:`conductor.hf.rust.rust_backend`): transformers' Python wrapping costs more than
    the Rust work for a short prompt. Otherwise they go through transformers. Byte-level BPE
    tokenizers encode with :class:`conductor.hf.fast_bpe.FastByteLevelBpe` when it accepts
    them.
    """

    def __init__(self, path: Path) -> None:
        if not path.is_dir():
            raise InvalidInput("model_path", str(path), "not a directory")
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:  # the optional extra is missing
            raise InvalidInput(
                "model_path", str(path), "needs the 'tokenizer' extra (transformers)"
            ) from exc
        try:
            self._tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as exc:  # transformers raises many unrelated types
            raise InvalidInput("model_path", str(path), f"cannot load a tokenizer: {exc}") from exc
        self.name = path.name
        self._vocab_size = len(self._tok)
        self._rust: Any = rust_backend(self._tok, check_decode=True)
        self._bpe = None if self._rust is None else FastByteLevelBpe.build(self._rust)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def uses_rust_backend(self) -> bool:
        """Whether encode/decode skip transformers (see the class docstring)."""
        return self._rust is not None

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if self._bpe is not None:
            fast = self._bpe.encode(text, add_special_tokens=add_special_tokens)
            if fast is not None:
                return fast
        if self._rust is not None:
            ids: list[int] = self._rust.encode_batch_fast(
                [text], add_special_tokens=add_special_tokens
            )[0].ids
            return ids
        return [int(t) for t in self._tok.encode(text, add_special_tokens=add_special_tokens)]

    def decode(self, token_ids: Sequence[int]) -> str:
        if self._rust is not None:
            return str(self._rust.decode(list(token_ids), skip_special_tokens=False))
        return str(self._tok.decode(list(token_ids)))

    def render_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        if getattr(self._tok, "chat_template", None):
            text = self._tok.apply_chat_template(
                [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
            )
            return self.encode(str(text), add_special_tokens=False)
        text = "".join(CHAT_TEMPLATE.format(role=m["role"], content=m["content"]) for m in messages)
        return self.encode(text + CHAT_GENERATION_PROMPT)


def output_rng(seed: int, prompt_ids: Sequence[int]) -> random.Random:
    """The per-request generator: a function of the engine seed and the prompt only."""
    digest = xxhash.xxh3_64_intdigest(array("I", prompt_ids).tobytes(), seed)
    return random.Random(digest)


def output_tokens(
    tokenizer: Tokenizer, seed: int, prompt_ids: Sequence[int], n: int
) -> tuple[list[int], list[str]]:
    """``n`` deterministic output token ids and the text each one adds to the completion.

    Words from :data:`OUTPUT_WORDS` separated by spaces are encoded until there are ``n``
    tokens; each token's text is the growth of the decoded prefix (exact for bytes).
    """
    if n <= 0:
        return [], []
    rng = output_rng(seed, prompt_ids)
    ids: list[int] = []
    while len(ids) < n:
        words = " ".join(rng.choice(OUTPUT_WORDS) for _ in range(max(4, n // 4)))
        ids.extend(tokenizer.encode(" " + words, add_special_tokens=False))
    ids = ids[:n]
    if isinstance(tokenizer, ByteTokenizer):
        return ids, [chr(t) for t in ids]  # OUTPUT_WORDS are ASCII: one byte, one char
    texts: list[str] = []
    previous = ""
    for k in range(1, n + 1):
        current = tokenizer.decode(ids[:k])
        texts.append(current[len(previous) :] if current.startswith(previous) else current)
        previous = current
    return ids, texts
