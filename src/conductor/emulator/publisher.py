"""Publish the emulated engine's KV events as vLLM does: ZMQ PUB + a replay ROUTER.

Frames and payloads come from :mod:`conductor.wire.vllm_events_encode`. One batch per
engine step that produced events, sequence numbers from 0 per publisher; the last
``buffer_steps`` batches are kept for replay. A slow subscriber loses messages at the PUB
socket's high-water mark (as with vLLM); the replay socket is how it catches up.

The PUB socket is a plain (blocking-API) ZMQ socket sent to with ``NOBLOCK``: a PUB send
never waits (it drops at the high-water mark), and the ``zmq.asyncio`` wrapper cost about
a tenth of the engine's CPU under load. The replay ROUTER is a ``zmq.asyncio`` socket on
the same ZMQ context.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import zmq
import zmq.asyncio

from conductor.emulator.blocks import CacheEvent, Cleared, Removed, Stored
from conductor.wire import vllm_events_encode as enc
from conductor.wire.vllm_events import SEQ_BYTES

log = logging.getLogger(__name__)

DEFAULT_HWM = 100_000
"""vLLM ``KVEventsConfig.hwm``."""


def to_wire(events: Sequence[CacheEvent], block_size: int) -> list[enc.EventMap]:
    """The vLLM event maps for the pool's events (one ``BlockRemoved`` per evicted block)."""
    out: list[enc.EventMap] = []
    for event in events:
        if isinstance(event, Stored):
            out.append(
                enc.block_stored(
                    event.hashes,
                    event.token_ids,
                    block_size,
                    parent_block_hash=event.parent,
                )
            )
        elif isinstance(event, Removed):
            out.append(enc.block_removed(event.hashes))
        elif isinstance(event, Cleared):
            out.append(enc.all_blocks_cleared())
    return out


@dataclass(slots=True)
class PublisherStats:
    batches: int = 0
    events: int = 0
    replay_requests: int = 0
    bad_replay_requests: int = 0


class KvEventPublisher:
    """PUB socket on ``tcp://host:port`` and, optionally, a replay ROUTER on ``replay_port``.

    Invariant: the batch published with sequence ``s`` is the ``s``-th (from 0) and, while
    it is among the last ``buffer_steps``, a replay from any ``start <= s`` returns it.
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        replay_port: int | None,
        topic: bytes,
        block_size: int,
        buffer_steps: int,
        dp_rank: int = 0,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.topic = topic
        self.block_size = block_size
        self.dp_rank = dp_rank
        self._clock = wall_clock
        self._own_ctx = context is None
        self._ctx: zmq.Context[zmq.Socket[bytes]] = (
            context if context is not None else zmq.Context()
        )
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.next_seq = 0
        self.stats = PublisherStats()
        self._pub: zmq.Socket[bytes] = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, DEFAULT_HWM)
        self._pub.bind(f"tcp://{host}:{port}")
        self._router: zmq.asyncio.Socket | None = None
        if replay_port is not None:
            actx = zmq.asyncio.Context.shadow(self._ctx.underlying)  # closed with ``_ctx``
            self._router = actx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.bind(f"tcp://{host}:{replay_port}")

    def publish(self, events: Sequence[CacheEvent]) -> int | None:
        """Send one batch of ``events`` (nothing if empty); returns its sequence number.
        Never blocks: a message the PUB socket cannot queue is dropped (replay has it)."""
        if not events:
            return None
        wire = to_wire(events, self.block_size)
        payload = enc.encode_payload(wire, self._clock(), self.dp_rank)
        seq = self.next_seq
        self.next_seq += 1
        self._buffer.append((seq, payload))
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart(enc.pub_frames(self.topic, seq, payload), zmq.NOBLOCK)
        self.stats.batches += 1
        self.stats.events += len(wire)
        return seq

    async def serve_replay(self) -> None:
        """Answer replay requests until cancelled (returns at once without a ROUTER)."""
        router = self._router
        if router is None:
            return
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != SEQ_BYTES:
                # vLLM logs and ignores malformed requests.
                self.stats.bad_replay_requests += 1
                log.warning("ignoring a malformed replay request of %d frames", len(frames))
                continue
            identity, _, raw_start = frames
            start = int.from_bytes(raw_start, "big")
            self.stats.replay_requests += 1
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await router.send_multipart(
                        enc.replay_frames(identity, self.topic, seq, payload)
                    )
            await router.send_multipart(enc.replay_end_frames(identity))

    def close(self) -> None:
        self._pub.close(linger=0)
        if self._router is not None:
            self._router.close(linger=0)
        if self._own_ctx:
            self._ctx.term()
