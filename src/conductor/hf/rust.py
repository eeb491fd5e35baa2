"""The ``tokenizers.Tokenizer`` under a transformers fast tokenizer, when calling it directly
gives what transformers gives (its Python wrapping is about a third of the cost of encoding a
short prompt)."""

from __future__ import annotations

from typing import Any

SAMPLE = " Hello, world! 12 3\n\tthe <s> cache holds blocks. éß 中文 </s>"


def rust_backend(tokenizer: Any, *, check_decode: bool = False) -> Any:
    """The Rust tokenizer under ``tokenizer`` (a transformers fast tokenizer), or None.

    Required: no truncation, padding or special-token splitting, and the same ids with and
    without special tokens on a sample; with ``check_decode`` also no clean-up of decoded
    spaces and the same decoded text of every prefix of those ids.
    """
    backend: Any = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "encode_batch_fast"):
        return None
    if getattr(tokenizer, "split_special_tokens", True):
        return None
    if check_decode and getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    try:
        if backend.truncation is not None or backend.padding is not None:
            return None
        if backend.encode_special_tokens:
            return None
        for special in (True, False):
            want = [int(i) for i in tokenizer.encode(SAMPLE, add_special_tokens=special)]
            got = backend.encode_batch_fast([SAMPLE], add_special_tokens=special)[0].ids
            if list(got) != want:
                return None
            if check_decode and any(
                backend.decode(want[:k], skip_special_tokens=False) != tokenizer.decode(want[:k])
                for k in range(1, len(want) + 1)
            ):
                return None
    except Exception:  # any surprise: keep the transformers path
        return None
    return backend
