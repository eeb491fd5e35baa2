"""The emulator's tokens: the default tokenizer, chat rendering and the deterministic "model
output".

Default: :class:`ByteTokenizer`, no model needed. **A token is one byte of the UTF-8
encoding of the text: token id = byte value (0-255), vocabulary 256, no BOS/EOS, no special
tokens.** ``encode(text) == list(text.encode("utf-8"))`` and ``decode(ids) ==
bytes(ids).decode("utf-8", errors="replace")``, so any client (a gateway computing prefix
hashes) can reproduce it in one line. Chat messages are rendered with :data:`CHAT_TEMPLATE`
before encoding (:func:`chat_ids`).

Optional: :class:`conductor.hf.tokenizer.HfTokenizer`, a local Hugging Face tokenizer folder
(``--model-path``; needs the ``tokenizer`` extra), with its own chat template if it has one.

Output text: :func:`output_tokens` draws words from :data:`conductor.hf.words.WORDS` with a
:class:`random.Random` seeded by ``(seed, prompt token ids)``, so the same prompt and seed
always produce the same completion; sampling parameters (temperature, top_p) are ignored.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Mapping, Sequence
from typing import Protocol

import xxhash

from conductor.hf.tokenizer import HfTokenizer
from conductor.hf.words import WORDS

BYTE_VOCAB_SIZE = 256

CHAT_TEMPLATE = "<|{role}|>\n{content}\n"
"""Each message of a chat request, concatenated; then :data:`CHAT_GENERATION_PROMPT`."""
CHAT_GENERATION_PROMPT = "<|assistant|>\n"


class Tokenizer(Protocol):
    """What the emulator needs from a tokenizer (:class:`ByteTokenizer`, or
    :class:`~conductor.hf.tokenizer.HfTokenizer`)."""

    name: str

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


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


def chat_ids(tokenizer: Tokenizer, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Token ids of a chat conversation followed by the assistant's generation prompt: the
    model's own chat template when a Hugging Face tokenizer has one (its text encoded without
    special tokens, as vLLM does), else :data:`CHAT_TEMPLATE`."""
    if isinstance(tokenizer, HfTokenizer) and tokenizer.has_chat_template:
        return tokenizer.encode(tokenizer.render_chat(messages), add_special_tokens=False)
    text = "".join(CHAT_TEMPLATE.format(role=m["role"], content=m["content"]) for m in messages)
    return tokenizer.encode(text + CHAT_GENERATION_PROMPT)


def output_rng(seed: int, prompt_ids: Sequence[int]) -> random.Random:
    """The per-request generator: a function of the engine seed and the prompt only."""
    digest = xxhash.xxh3_64_intdigest(array("I", prompt_ids).tobytes(), seed)
    return random.Random(digest)


def output_tokens(
    tokenizer: Tokenizer, seed: int, prompt_ids: Sequence[int], n: int
) -> tuple[list[int], list[str]]:
    """``n`` deterministic output token ids and the text each one adds to the completion.

    Words from :data:`~conductor.hf.words.WORDS` separated by spaces are encoded until there
    are ``n`` tokens; each token's text is the growth of the decoded prefix (exact for bytes).
    """
    if n <= 0:
        return [], []
    rng = output_rng(seed, prompt_ids)
    ids: list[int] = []
    while len(ids) < n:
        words = " ".join(rng.choice(WORDS) for _ in range(max(4, n // 4)))
        ids.extend(tokenizer.encode(" " + words, add_special_tokens=False))
    ids = ids[:n]
    if isinstance(tokenizer, ByteTokenizer):
        return ids, [chr(t) for t in ids]  # WORDS are ASCII: one byte, one char
    texts: list[str] = []
    previous = ""
    for k in range(1, n + 1):
        current = tokenizer.decode(ids[:k])
        texts.append(current[len(previous) :] if current.startswith(previous) else current)
        previous = current
    return ids, texts
