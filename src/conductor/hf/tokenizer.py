"""One Hugging Face tokenizer for the gateway and the emulated engines: loaded from a local
folder (never from a hub), encoding through the cheapest path that gives transformers' ids.

The cascade, cheapest first: :class:`conductor.hf.fast_bpe.FastByteLevelBpe` for byte-level
BPE tokenizers it accepts (a text holding an added token falls through); the Rust
``tokenizers.Tokenizer`` called directly (:func:`conductor.hf.rust.rust_backend`: where that
gives transformers' ids, checked at load); transformers itself. Decoding calls the Rust
tokenizer directly only where that was checked to decode as transformers does too.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from conductor.core.errors import ConductorError
from conductor.hf.fast_bpe import FastByteLevelBpe
from conductor.hf.rust import rust_backend


class TokenizerLoadError(ConductorError):
    """The model folder has no usable tokenizer."""


class NoChatTemplate(ConductorError):
    """The tokenizer has no chat template to render a conversation with."""


class ChatTemplateNotText(ConductorError):
    """The chat template rendered to something other than text."""


class HfTokenizer:
    """A local Hugging Face tokenizer (see the module docstring).

    Invariants: :meth:`encode` gives transformers' ``encode`` ids and :meth:`decode`
    transformers' ``decode`` text, whichever path runs. Calls are serialised (one lock): the
    gateway tokenizes long prompts in worker threads, and a Rust tokenizer shared across
    threads can fail with "Already borrowed".
    """

    def __init__(self, tokenizer: Any, name: str = "") -> None:
        self._tok = tokenizer
        self.name = name
        self._vocab_size = len(tokenizer)
        self._lock = threading.Lock()
        backend = rust_backend(tokenizer)
        self._fast = None if backend is None else backend.encode_batch_fast
        self._bpe = None if backend is None else FastByteLevelBpe.build(backend)
        self._rust_decode: Any = None
        if backend is not None and rust_backend(tokenizer, check_decode=True) is not None:
            self._rust_decode = backend.decode

    @classmethod
    def load(cls, model_path: Path) -> HfTokenizer:
        """The tokenizer of the model folder ``model_path`` (named after the folder);
        :class:`TokenizerLoadError` if it has none or transformers is missing."""
        if (
            not (model_path / "tokenizer.json").exists()
            and not (model_path / "tokenizer_config.json").exists()
        ):
            raise TokenizerLoadError(f"no tokenizer.json or tokenizer_config.json in {model_path}")
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:  # the 'tokenizer' extra is not installed
            raise TokenizerLoadError(
                f"transformers is not installed ({exc}); install conductor[tokenizer]"
            ) from exc
        try:
            tok = AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
        except Exception as exc:  # transformers raises OSError, ValueError, ...
            raise TokenizerLoadError(f"cannot load the tokenizer in {model_path}: {exc}") from exc
        return cls(tok, model_path.name)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def fast_path(self) -> str:
        """Which encoder runs: ``byte-level-bpe`` (:mod:`conductor.hf.fast_bpe`),
        ``rust`` (the Rust tokenizer directly) or ``transformers``."""
        if self._bpe is not None:
            return "byte-level-bpe"
        return "rust" if self._fast is not None else "transformers"

    @property
    def decodes_with_rust(self) -> bool:
        """Whether :meth:`decode` skips transformers (not when it cleans up spaces)."""
        return self._rust_decode is not None

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self._tok, "chat_template", None))

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        with self._lock:
            if self._bpe is not None:
                ids = self._bpe.encode(text, add_special_tokens=add_special_tokens)
                if ids is not None:
                    return ids
            if self._fast is not None:  # the Rust tokenizer itself, as transformers calls it
                return list(self._fast([text], add_special_tokens=add_special_tokens)[0].ids)
            ids = self._tok.encode(text, add_special_tokens=add_special_tokens)
        return [int(i) for i in ids]

    def decode(self, token_ids: Sequence[int]) -> str:
        with self._lock:
            if self._rust_decode is not None:
                return str(self._rust_decode(list(token_ids), skip_special_tokens=False))
            return str(self._tok.decode(list(token_ids)))

    def render_chat(
        self,
        messages: Sequence[Mapping[str, object]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[object] | None = None,
        template_kwargs: Mapping[str, object] | None = None,
    ) -> str:
        """The conversation rendered to text by the model's chat template (not tokenized);
        :class:`NoChatTemplate` or :class:`ChatTemplateNotText`, and whatever the template
        itself raises."""
        if not self.has_chat_template:
            raise NoChatTemplate("the model has no chat template")
        with self._lock:
            text = self._tok.apply_chat_template(
                list(messages),
                tools=None if tools is None else list(tools),
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=False,
                **(template_kwargs or {}),
            )
        if not isinstance(text, str):
            raise ChatTemplateNotText("the chat template did not render to text")
        return text
