"""Turn a request into the token ids the engine will see, and those into block hashes.

vLLM's preprocessing, with the model's own tokenizer (:class:`conductor.hf.tokenizer.HfTokenizer`
in production): completions encode the prompt with ``add_special_tokens`` (default on); chat
renders the template to text (``tokenize=False``) and encodes that text with
``add_special_tokens`` (default off), as vLLM's OpenAI server does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from conductor.core.hashing import hash_block, hash_blocks
from conductor.core.types import BlockHash
from conductor.gateway.errors import BadRequest
from conductor.gateway.openai_api import ParsedRequest
from conductor.hf.tokenizer import ChatTemplateNotText, NoChatTemplate


class PromptTokenizer(Protocol):
    """What the gateway needs from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]: ...

    def render_chat(
        self,
        messages: Sequence[dict[str, object]],
        *,
        add_generation_prompt: bool,
        continue_final_message: bool,
        tools: Sequence[object] | None,
        template_kwargs: dict[str, object],
    ) -> str: ...


def prompt_token_ids(tokenizer: PromptTokenizer, req: ParsedRequest) -> list[int]:
    """The prompt's token ids as the engine will compute them; :class:`BadRequest` if the
    request cannot be tokenized (ids out of the vocabulary, a template error)."""
    if req.kind == "completion":
        if req.prompt_ids is not None:
            vocab = tokenizer.vocab_size
            bad = next((t for t in req.prompt_ids if t >= vocab), None)
            if bad is not None:
                raise BadRequest(
                    f"token id {bad} in 'prompt' is out of the vocabulary (size {vocab})",
                    param="prompt",
                )
            return list(req.prompt_ids)
        assert req.prompt_text is not None
        return tokenizer.encode(req.prompt_text, add_special_tokens=req.add_special_tokens)
    try:
        text = tokenizer.render_chat(
            req.messages,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            tools=req.tools,
            template_kwargs=req.chat_template_kwargs,
        )
    except BadRequest:
        raise
    except NoChatTemplate:
        raise BadRequest("the model has no chat template; use /v1/completions") from None
    except ChatTemplateNotText as exc:
        raise BadRequest(str(exc), param="messages") from None
    except Exception as exc:  # jinja2 raises many types; none may reach the client raw
        raise BadRequest(f"cannot apply the chat template: {exc}", param="messages") from None
    return tokenizer.encode(text, add_special_tokens=req.add_special_tokens)


def request_block_hashes(
    token_ids: Sequence[int], block_size_tokens: int, cache_salt: str | None = None
) -> list[BlockHash]:
    """Our chained hashes of the prompt's full blocks, exactly as the KV ingest computes them
    from the engine's events (``hash_block`` over each block's token ids, chained from the
    root, with the engine's per-block extra keys): vLLM folds a request's ``cache_salt`` into
    the first block only, and publishes it there as the extra key ``(salt,)``."""
    if not cache_salt:
        return hash_blocks(token_ids, block_size_tokens)
    if len(token_ids) < block_size_tokens:
        return []
    first = hash_block(None, token_ids[:block_size_tokens], (cache_salt,))
    return [first, *hash_blocks(token_ids[block_size_tokens:], block_size_tokens, parent=first)]


def read_max_model_len(model_path: Path) -> int | None:
    """``max_position_embeddings`` (or ``max_seq_len``...) from the model's ``config.json``;
    the length vLLM uses when started without ``--max-model-len``."""
    try:
        cfg = json.loads((model_path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
