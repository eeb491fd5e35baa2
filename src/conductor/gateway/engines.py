"""Per-engine runtime state: configuration, KV-event subscription and its bounded queue.

An :class:`EngineHandle` exists for every engine the gateway knows; the scheduler's view of the
same engine is ``conductor.instances[engine_id]``. The handle's background tasks (subscriber,
pump) are created and cancelled by :class:`~conductor.gateway.service.Gateway`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field

import zmq.asyncio

from conductor.core.events import KvEvent
from conductor.core.hashing import hash_block
from conductor.core.types import InstanceId
from conductor.gateway.config import EngineConfig
from conductor.gateway.kv_ingest import EngineHashMapper, EngineKvIngest, SeqCheck
from conductor.gateway.wire.vllm_events import EngineBlockStored, EngineEventBatch
from conductor.gateway.wire.zmq_sub import VllmKvSubscriber

log = logging.getLogger(__name__)


class TimedIngest(EngineKvIngest):
    """An :class:`EngineKvIngest` that remembers each batch's publication time by sequence
    number (so the pump can measure publication-to-index lag) and counts BlockStored events
    whose block size differs from the gateway's (their hashes cannot match ours).

    Invariant: ``len(published) <= keep``; the oldest entries go first.
    """

    def __init__(self, mapper: EngineHashMapper, *, block_size_tokens: int, keep: int = 4096):
        super().__init__(mapper)
        self.block_size_tokens = block_size_tokens
        self.keep = keep
        self.published: OrderedDict[int, float] = OrderedDict()
        self.block_size_mismatches = 0

    def _note(self, batch: EngineEventBatch) -> None:
        self.published[batch.seq] = batch.ts
        self.published.move_to_end(batch.seq)
        while len(self.published) > self.keep:
            self.published.popitem(last=False)
        for event in batch.events:
            if isinstance(event, EngineBlockStored) and event.block_size != self.block_size_tokens:
                if not self.block_size_mismatches:
                    log.error(
                        "engine %s publishes blocks of %d tokens but the gateway hashes %d; "
                        "its cache cannot be matched (fix block_size)",
                        self.holder,
                        event.block_size,
                        self.block_size_tokens,
                    )
                self.block_size_mismatches += 1

    def apply(self, batch: EngineEventBatch, check: SeqCheck) -> list[KvEvent]:
        self._note(batch)
        return super().apply(batch, check)

    def apply_unchecked(self, batch: EngineEventBatch) -> list[KvEvent]:
        self._note(batch)
        return super().apply_unchecked(batch)

    def published_at(self, seq: int | None) -> float | None:
        return None if seq is None else self.published.get(seq)


@dataclass(slots=True)
class EngineHandle:
    """One engine as the gateway runs it. ``subscriber``/``queue``/``ingest`` are None when
    the engine publishes no KV events."""

    config: EngineConfig
    subscriber: VllmKvSubscriber | None = None
    queue: asyncio.Queue[KvEvent] | None = None
    ingest: TimedIngest | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    health_failures: int = 0
    """Consecutive failed health checks."""

    @property
    def engine_id(self) -> InstanceId:
        return InstanceId(self.config.engine_id)

    @property
    def upstream_model(self) -> str | None:
        return self.config.model

    @property
    def kv_queue_depth(self) -> int:
        return 0 if self.queue is None else self.queue.qsize()

    def cancel_tasks(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.tasks.clear()


def make_handle(config: EngineConfig, *, queue_size: int) -> EngineHandle:
    """A handle with its KV-event ingest and queue (the subscriber comes with
    :func:`attach_subscriber` once the gateway runs). Our hashes of the engine's blocks are
    :func:`conductor.core.hashing.hash_block` chains, the same function the request path uses
    through ``hash_blocks``, so both sides agree block for block."""
    handle = EngineHandle(config)
    if config.kv_events is None:
        return handle
    engine_id = InstanceId(config.engine_id)
    handle.ingest = TimedIngest(
        EngineHashMapper(engine_id, hash_block), block_size_tokens=config.block_size_tokens
    )
    handle.queue = asyncio.Queue(maxsize=queue_size)
    return handle


def attach_subscriber(handle: EngineHandle, zmq_context: zmq.asyncio.Context) -> None:
    """Give ``handle`` a subscriber on ``zmq_context`` (a no-op without KV events)."""
    config = handle.config
    if config.kv_events is None or handle.ingest is None or handle.queue is None:
        return
    handle.subscriber = VllmKvSubscriber(
        endpoint=config.kv_events,
        ingest=handle.ingest,
        queue=handle.queue,
        topic=config.topic.encode(),
        replay_endpoint=config.replay,
        context=zmq_context,
    )
