"""An engine that speaks vLLM's OpenAI HTTP API and KV-event wire format, timed by
:mod:`conductor.core.costmodel` instead of running a model: for gateway load tests and demos
without GPUs. Real vLLM is what integration tests use.

Pieces: :mod:`.config` (settings), :mod:`.tokenizer` (deterministic byte tokenizer or a local
Hugging Face one, and the deterministic output text), :mod:`.blocks` (the prefix cache),
:mod:`.engine` (FCFS prefill + continuous-batching decode, one step at a time, no clock),
:mod:`.loop` (the asyncio driver that paces steps), :mod:`.publisher` (ZMQ PUB + replay),
:mod:`.metrics` (Prometheus text) and :mod:`.api` (the HTTP app).
"""
