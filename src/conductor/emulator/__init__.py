"""An engine that speaks vLLM's OpenAI HTTP API and KV-event wire format, timed by
:mod:`conductor.core.costmodel` instead of running a model: for gateway load tests and demos
without GPUs. Real vLLM is what integration tests use.

Pieces: :mod:`.config` (settings, their defaults and checks), :mod:`.tokenizer`
(deterministic byte tokenizer, chat rendering and the deterministic output text; a local
Hugging Face tokenizer is :mod:`conductor.hf.tokenizer`'s), :mod:`.blocks` (the prefix cache),
:mod:`.engine` (FCFS prefill + continuous-batching decode, one step at a time, no clock),
:mod:`.loop` (the asyncio driver that paces steps), :mod:`.publisher` (ZMQ PUB + replay),
:mod:`.metrics` (Prometheus text), :mod:`.service` (the pieces put together) and the HTTP
app: :mod:`.api` (routes), :mod:`.parsing` (requests), :mod:`.shaping` (responses),
:mod:`.errors` (refusals) and :mod:`.server`.
"""
