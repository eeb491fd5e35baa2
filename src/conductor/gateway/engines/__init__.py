"""Engine kinds: everything the gateway must know about one kind of engine (vLLM, ...).

:mod:`.kind` is the :class:`~conductor.gateway.engines.kind.EngineKind` protocol, :mod:`.registry`
finds a kind by the name an engine's config gives (``kind = "vllm"``), :mod:`.vllm` (with its
socket reader :mod:`.vllm_zmq`) is the first implementation, and :mod:`.handle` is one engine
as the gateway runs it. The rest of the gateway talks to engines only through their kind.
"""
