"""One emulated engine put together: config, tokenizer, engine core, loop and KV publisher.

:meth:`Emulator.running` is the lifespan: it binds the ZMQ sockets and owns the engine loop
and replay tasks (one :class:`asyncio.TaskGroup`), cancelling and closing them on the way out.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from conductor.core.costmodel import preset
from conductor.emulator.config import EmulatorConfig
from conductor.emulator.engine import EngineCore, EngineRequest
from conductor.emulator.loop import EngineLoop
from conductor.emulator.publisher import KvEventPublisher
from conductor.emulator.tokenizer import ByteTokenizer, Tokenizer, output_tokens


class Emulator:
    """An engine and its shell state (see the module docstring)."""

    def __init__(self, config: EmulatorConfig, tokenizer: Tokenizer | None = None) -> None:
        self.config = config
        self.tokenizer: Tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        self.cost = config.cost if config.cost is not None else preset(config.preset)
        self.core = EngineCore(
            self.cost,
            block_size_tokens=config.block_size_tokens,
            cache_blocks=config.cache_blocks,
            max_model_len=config.max_model_len,
            max_batch_size=config.max_batch_size,
            max_batched_tokens=config.max_batched_tokens,
            engine_hash_seed=config.engine_hash_seed,
        )
        self.loop = EngineLoop(self.core, speedup=config.speedup, instant=config.instant)
        self.publisher: KvEventPublisher | None = None
        self._ids = itertools.count()

    def new_request(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int,
        *,
        seed: int | None = None,
        remote_prefill: bool = False,
    ) -> EngineRequest:
        """A request with its deterministic completion (a function of seed and prompt).

        Raises :class:`~conductor.core.errors.InvalidInput` if the engine cannot serve it.
        """
        self.core.validate(len(prompt_ids), max_tokens)
        out_ids, out_texts = output_tokens(
            self.tokenizer, self.config.seed if seed is None else seed, prompt_ids, max_tokens
        )
        return EngineRequest(
            request_id=f"{self.config.engine_id}-{next(self._ids)}",
            prompt_ids=list(prompt_ids),
            out_ids=out_ids,
            out_texts=out_texts,
            remote_prefill=remote_prefill,
        )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Emulator]:
        """Bind the sockets and run the engine loop (and replay server) until exit."""
        cfg = self.config
        if cfg.kv_events_port is not None:
            self.publisher = KvEventPublisher(
                host=cfg.host,
                port=cfg.kv_events_port,
                replay_port=cfg.replay_port,
                topic=cfg.kv_topic.encode(),
                block_size=cfg.block_size_tokens,
                buffer_steps=cfg.replay_buffer_steps,
            )
            self.loop.publisher = self.publisher
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(self.loop.run(), name="engine-loop")]
                if self.publisher is not None:
                    tasks.append(tg.create_task(self.publisher.serve_replay(), name="kv-replay"))
                try:
                    yield self
                finally:
                    for task in tasks:
                        task.cancel()
        finally:
            if self.publisher is not None:
                self.publisher.close()
                self.loop.publisher = None
                self.publisher = None
