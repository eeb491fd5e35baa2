"""Hugging Face tokenizers for the gateway and the emulated engines: one
:class:`~conductor.hf.tokenizer.HfTokenizer` (:mod:`.tokenizer`) encoding through the Rust
tokenizer directly where that gives transformers' results (:mod:`.rust`) and a byte-level BPE
encoder (:mod:`.fast_bpe`); and the word list of conductor's synthetic text (:mod:`.words`)."""
