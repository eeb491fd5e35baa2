"""Hugging Face tokenizers, cheaper: the Rust tokenizer called directly where that gives
transformers' results (:mod:`.rust`), and a byte-level BPE encoder (:mod:`.fast_bpe`). Used
by the gateway and the emulated engines."""
