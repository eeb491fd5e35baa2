"""The one Hugging Face tokenizer: its chat template paths (what the gateway and the
emulator each build on)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor.hf.tokenizer import HfTokenizer, NoChatTemplate
from tests.hf.helpers import make_hf_tokenizer

TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"


def test_without_a_chat_template_rendering_is_refused(tmp_path: Path) -> None:
    make_hf_tokenizer(tmp_path)
    tok = HfTokenizer.load(tmp_path)
    assert not tok.has_chat_template and tok.name == tmp_path.name
    with pytest.raises(NoChatTemplate):
        tok.render_chat([{"role": "user", "content": "hi"}])


def test_the_chat_template_renders_to_text(tmp_path: Path) -> None:
    make_hf_tokenizer(tmp_path, chat_template=TEMPLATE)
    tok = HfTokenizer.load(tmp_path)
    assert tok.has_chat_template
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert tok.render_chat(messages) == "[system] be brief\n[user] hi\n"
