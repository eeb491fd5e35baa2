"""One engine as the gateway runs it: config, kind, KV-event feed and its bounded queue, tasks,
and the load the engine last reported.

An :class:`EngineHandle` exists for every engine the gateway knows; the scheduler's view of the
same engine is ``conductor.instances[engine_id]``. The handle's background tasks (feed, pump)
are created and cancelled by :class:`~conductor.gateway.kv_pump.KvPump`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import zmq.asyncio

from conductor.core.events import KvEvent
from conductor.core.hashing import hash_block
from conductor.core.types import InstanceId
from conductor.gateway.config import EngineConfig
from conductor.gateway.engines.kind import EngineKind, ReportedLoad
from conductor.gateway.engines.registry import engine_kind
from conductor.gateway.kv_feed import EngineKvIngest, KvFeed
from conductor.gateway.kv_ingest import EngineHashMapper


@dataclass(slots=True)
class EngineHandle:
    """One engine as the gateway runs it. ``feed``/``queue``/``ingest`` are None when the
    engine publishes no KV events (``feed`` also until the gateway runs); ``load`` is what the
    engine last reported (zeros until the first poll); ``served``: requests (or prefill legs)
    it answered; ``probe_timeouts``: health probes timed out in a row; ``kv_silent``: it
    served traffic but published no KV event (its publisher is not reaching us)."""

    config: EngineConfig
    kind: EngineKind
    feed: KvFeed | None = None
    queue: asyncio.Queue[KvEvent] | None = None
    ingest: EngineKvIngest | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    load: ReportedLoad = field(default_factory=ReportedLoad)
    served: int = 0
    probe_timeouts: int = 0
    kv_silent: bool = False
    model_checked: bool = False
    model_error: str | None = None

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


def make_handle(config: EngineConfig, *, queue_size: int, max_blocks: int) -> EngineHandle:
    """A handle with its kind and, when the engine publishes KV events, their ingest and
    queue (the feed comes with :func:`attach_feed` once the gateway runs). Our hashes of the
    engine's blocks are :func:`conductor.core.hashing.hash_block` chains, the same function
    the request path uses through ``hash_blocks``, so both sides agree block for block.
    The engine's events may claim at most its ``max_blocks`` (else ``max_blocks``) blocks."""
    handle = EngineHandle(config, engine_kind(config.kind))
    if config.kv_events is None:
        return handle
    engine_id = InstanceId(config.engine_id)
    handle.ingest = EngineKvIngest(
        EngineHashMapper(
            engine_id,
            hash_block,
            max_blocks=config.max_blocks if config.max_blocks is not None else max_blocks,
        ),
        block_size_tokens=config.block_size_tokens,
    )
    handle.queue = asyncio.Queue(maxsize=queue_size)
    return handle


def attach_feed(handle: EngineHandle, zmq_context: zmq.asyncio.Context) -> None:
    """Give ``handle`` its kind's KV-event feed on ``zmq_context`` (none without KV events)."""
    if handle.ingest is None or handle.queue is None:
        return
    handle.feed = handle.kind.kv_feed(handle.config, handle.ingest, handle.queue, zmq_context)
