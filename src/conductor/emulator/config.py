"""Settings of one emulated engine, built once by the CLI (or a test) and passed down; the
field defaults are the emulator's defaults (``conductor emulate`` derives its flags from them)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from conductor.core.checks import check_at_least, check_choice, check_port, check_positive
from conductor.core.costmodel import PRESETS, CostModel
from conductor.core.errors import InvalidInput
from conductor.core.types import Role


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    """One engine. Times are the cost model's (``cost`` when given, else preset ``preset``
    of ``core.costmodel``) divided by ``speedup``; ``instant`` makes every step take no time
    at all (the engine then only costs CPU).

    ``cache_blocks`` is the KV cache's size in blocks of ``block_size_tokens`` tokens (32 by
    default: vLLM's CPU attention backend needs multiples of 32; GPU engines default to 16).
    ``max_batched_tokens`` bounds the tokens one step schedules (decode tokens + whole
    prompts; a prompt longer than that still runs, alone). ``engine_hash_seed`` seeds the
    engine's own block hashes (they differ from the scheduler's, as a real engine's do).
    ``replay_buffer_steps`` is how many event batches the replay socket keeps (vLLM's
    ``buffer_steps``).

    Invariants (checked on construction, :class:`InvalidInput` naming the field): ``preset``
    is a known preset; ``speedup`` is finite and > 0; sizes are > 0; ``seed`` >= 0; ports are
    TCP ports (0: any free one), the non-zero ones distinct; a replay port needs a KV events
    port; ``model_name`` is not blank.
    """

    model_name: str = "emulated"
    role: Role = Role.BOTH
    preset: str = "llama3-8b-h100"
    speedup: float = 1.0
    instant: bool = False
    block_size_tokens: int = 32
    cache_blocks: int = 4096
    max_model_len: int = 8192
    max_batch_size: int = 256
    max_batched_tokens: int = 8192
    seed: int = 0
    engine_id: str = "emulator-0"
    engine_hash_seed: int = 0x76_6C_6C_6D  # "vllm"
    host: str = "127.0.0.1"
    port: int = 8000
    kv_events_port: int | None = None
    replay_port: int | None = None
    kv_topic: str = ""
    replay_buffer_steps: int = 10_000
    cost: CostModel | None = None
    """A measured cost model (``conductor emulate --cost-file``) in place of ``preset``."""

    def __post_init__(self) -> None:
        if not self.model_name.strip():
            raise InvalidInput("model_name", self.model_name, "must not be empty")
        check_choice("preset", self.preset, sorted(PRESETS))
        if not (self.speedup > 0 and math.isfinite(self.speedup)):
            raise InvalidInput("speedup", self.speedup, "must be a finite number > 0")
        for name in (
            "block_size_tokens",
            "cache_blocks",
            "max_model_len",
            "max_batch_size",
            "max_batched_tokens",
            "replay_buffer_steps",
        ):
            check_positive(name, getattr(self, name))
        check_at_least("seed", self.seed, 0)
        self._check_ports()

    def _check_ports(self) -> None:
        port, kv, replay = self.port, self.kv_events_port, self.replay_port
        check_port("port", port)
        if kv is not None:
            check_port("kv_events_port", kv)
            if kv != 0 and kv == port:
                raise InvalidInput("kv_events_port", kv, "must differ from the HTTP port")
        if replay is not None:
            check_port("replay_port", replay)
            if kv is None:
                raise InvalidInput("replay_port", replay, "needs a KV events port too")
            if replay != 0 and replay in (port, kv):
                raise InvalidInput(
                    "replay_port", replay, "must differ from the HTTP and KV events ports"
                )
