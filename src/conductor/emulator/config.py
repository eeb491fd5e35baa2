"""Settings of one emulated engine, built once by the CLI (or a test) and passed down."""

from __future__ import annotations

import math
from dataclasses import dataclass

from conductor.core.errors import InvalidInput
from conductor.core.types import Role

DEFAULT_PRESET = "llama3-8b-h100"
"""Cost model preset the emulator times its steps with (``core.costmodel.PRESETS``)."""
DEFAULT_BLOCK_SIZE_TOKENS = 32
"""vLLM's CPU attention backend needs multiples of 32; GPU engines default to 16."""
DEFAULT_CACHE_BLOCKS = 4096
DEFAULT_MAX_MODEL_LEN = 8192
DEFAULT_MAX_BATCH_SIZE = 256
DEFAULT_MAX_BATCHED_TOKENS = 8192
DEFAULT_MODEL_NAME = "emulated"
DEFAULT_REPLAY_BUFFER_STEPS = 10_000
"""Batches the replay socket keeps (vLLM ``buffer_steps``)."""


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    """One engine. Times are the cost model's divided by ``speedup``; ``instant`` makes every
    step take no time at all (the engine then only costs CPU).

    ``cache_blocks`` is the KV cache's size in blocks of ``block_size_tokens`` tokens.
    ``max_batched_tokens`` bounds the tokens one step schedules (decode tokens + whole
    prompts; a prompt longer than that still runs, alone). ``engine_hash_seed`` seeds the
    engine's own block hashes (they differ from the scheduler's, as a real engine's do).
    """

    model_name: str = DEFAULT_MODEL_NAME
    role: Role = Role.BOTH
    preset: str = DEFAULT_PRESET
    speedup: float = 1.0
    instant: bool = False
    block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS
    cache_blocks: int = DEFAULT_CACHE_BLOCKS
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    seed: int = 0
    engine_id: str = "emulator-0"
    engine_hash_seed: int = 0x76_6C_6C_6D  # "vllm"
    host: str = "127.0.0.1"
    port: int = 8000
    kv_events_port: int | None = None
    replay_port: int | None = None
    kv_topic: str = ""
    replay_buffer_steps: int = DEFAULT_REPLAY_BUFFER_STEPS

    def __post_init__(self) -> None:
        if not (self.speedup > 0 and math.isfinite(self.speedup)):
            raise InvalidInput("speedup", self.speedup, "must be a finite number > 0")
        positive = (
            ("block_size_tokens", self.block_size_tokens),
            ("cache_blocks", self.cache_blocks),
            ("max_model_len", self.max_model_len),
            ("max_batch_size", self.max_batch_size),
            ("max_batched_tokens", self.max_batched_tokens),
            ("replay_buffer_steps", self.replay_buffer_steps),
        )
        for name, value in positive:
            if value <= 0:
                raise InvalidInput(name, value, "must be > 0")
        for name, port in (
            ("port", self.port),
            ("kv_events_port", self.kv_events_port),
            ("replay_port", self.replay_port),
        ):
            if port is not None and not 0 <= port <= 65535:
                raise InvalidInput(name, port, "must be a TCP port (0-65535)")
        if self.replay_port is not None and self.kv_events_port is None:
            raise InvalidInput("replay_port", self.replay_port, "needs kv_events_port too")
        if not self.model_name:
            raise InvalidInput("model_name", self.model_name, "must not be empty")
        if self.seed < 0:
            raise InvalidInput("seed", self.seed, "must be >= 0")
