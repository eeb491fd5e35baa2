"""Tokenization as the engine does it, and request hashes equal to the KV ingest's."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor.core.hashing import hash_block
from conductor.core.types import InstanceId
from conductor.gateway.errors import BadRequest
from conductor.gateway.kv_ingest import EngineHashMapper
from conductor.gateway.openai_api import parse_chat, parse_completion
from conductor.gateway.tokenizer import prompt_token_ids, request_block_hashes
from conductor.hf.tokenizer import HfTokenizer, TokenizerLoadError
from conductor.wire.events import EngineBlockHash, EngineBlockStored
from tests.engines.fixtures import TINY_MODEL
from tests.hf.helpers import make_hf_tokenizer

needs_tiny_model = pytest.mark.skipif(
    not (TINY_MODEL / ".generated").exists(), reason="no tiny model (run `make tiny-model`)"
)


def mapper_hashes(tokens: list[int], block: int, extras: list[tuple[object, ...] | None]):
    mapper = EngineHashMapper(InstanceId("e"), hash_block)
    n = len(tokens) // block
    event = EngineBlockStored(
        engine_hashes=tuple(EngineBlockHash(1000 + i) for i in range(n)),
        parent_engine_hash=None,
        token_ids=tuple(tokens[: n * block]),
        block_size=block,
        extra_keys=tuple(extras),
    )
    stored = mapper.translate(event)
    assert stored is not None
    return list(stored.block_hashes)


def test_request_hashes_equal_the_ingest_hashes() -> None:
    tokens = list(range(7, 7 + 70))
    assert request_block_hashes(tokens, 16) == mapper_hashes(tokens, 16, [None] * 4)


def test_cache_salt_goes_into_the_first_block_only_like_vllm() -> None:
    tokens = list(range(300, 364))
    salted = request_block_hashes(tokens, 16, "tenant-a")
    assert salted == mapper_hashes(tokens, 16, [("tenant-a",), None, None, None])
    assert salted != request_block_hashes(tokens, 16)
    assert salted != request_block_hashes(tokens, 16, "tenant-b")
    assert request_block_hashes(tokens[:10], 16, "tenant-a") == []


@needs_tiny_model
def test_hf_tokenizer_matches_the_tokenizer_file_and_renders_the_chat_template() -> None:
    from tokenizers import Tokenizer

    tok = HfTokenizer.load(TINY_MODEL)
    text = "The scheduler sends each request to the engine that already has its prefix."
    raw = Tokenizer.from_file(str(TINY_MODEL / "tokenizer.json"))
    assert tok.encode(text, add_special_tokens=True) == raw.encode(text).ids
    req = parse_completion({"model": "tiny", "prompt": text})
    assert prompt_token_ids(tok, req) == raw.encode(text).ids
    chat = parse_chat({"model": "tiny", "messages": [{"role": "user", "content": "hi there"}]})
    rendered = tok.render_chat(
        chat.messages,
        add_generation_prompt=True,
        continue_final_message=False,
        tools=None,
        template_kwargs={},
    )
    assert rendered == "<s><|user|>\nhi there</s>\n<|assistant|>\n"
    assert prompt_token_ids(tok, chat) == raw.encode(rendered, add_special_tokens=False).ids
    parts = parse_chat(
        {
            "model": "tiny",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}],
                }
            ],
        }
    )
    assert (
        prompt_token_ids(tok, parts)
        == raw.encode("<s><|user|>\nhi\nthere</s>\n<|assistant|>\n", add_special_tokens=False).ids
    )


def test_loading_a_folder_without_tokenizer_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match=r"no tokenizer\.json or tokenizer_config\.json"):
        HfTokenizer.load(tmp_path)


def test_a_model_without_a_chat_template_refuses_chat_requests(tmp_path: Path) -> None:
    make_hf_tokenizer(tmp_path)
    tok = HfTokenizer.load(tmp_path)
    chat = parse_chat({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(BadRequest) as caught:
        prompt_token_ids(tok, chat)
    assert caught.value.body() == {
        "error": {
            "message": "the model has no chat template; use /v1/completions",
            "type": "invalid_request_error",
            "code": 400,
        }
    }
