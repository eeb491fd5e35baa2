"""Subscribe to one vLLM engine's KV events over ZMQ and queue the translated core events.

:class:`VllmKvSubscriber` owns a SUB socket connected to the engine's publisher (e.g.
``tcp://10.0.0.5:5557``), decodes each multipart message
(:mod:`conductor.gateway.wire.vllm_events`), runs it through the engine's
:class:`~conductor.gateway.kv_ingest.EngineKvIngest` and puts the resulting
:mod:`conductor.core.events` on a bounded :class:`asyncio.Queue` without waiting.

When the queue is full the event is dropped, counted, and the engine is marked as needing a
resync (its index entries can no longer be trusted). On a sequence gap, if the engine has a
replay endpoint (vLLM ``replay_endpoint``, a ROUTER socket), the subscriber asks it for the
missed batches (DEALER; request ``[b"", seq as 8-byte BE]``; replies ``[b"", topic, seq,
payload]`` until seq -1) and applies them before the batch that revealed the gap; without
replay, or if replay fails or comes back incomplete, the engine is marked as needing resync.

The caller owns the task: ``task_group.create_task(sub.run())`` and cancel it to stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import zmq
import zmq.asyncio

from conductor.core.events import KvEvent
from conductor.gateway.kv_ingest import EngineKvIngest, SeqCheck, SeqVerdict
from conductor.gateway.wire.vllm_events import (
    END_OF_REPLAY_SEQ,
    EngineEventBatch,
    WireError,
    decode_frames,
    decode_payload,
    decode_seq,
    encode_seq,
)

log = logging.getLogger(__name__)
DRAIN_BATCHES = 256
"""Messages handled in a row before the event loop gets a turn."""


@dataclass(slots=True)
class SubscriberStats:
    batches: int = 0
    """Batches received on the SUB socket and decoded."""
    events_out: int = 0
    """Core events put on the queue."""
    drops: int = 0
    """Core events dropped because the queue was full."""
    decode_errors: int = 0
    replays: int = 0
    """Replay requests that filled their gap completely."""
    replay_failures: int = 0
    """Replay requests that timed out, failed to decode or came back incomplete."""


class VllmKvSubscriber:
    """One engine's KV-event subscription (see the module docstring for the protocol).

    Invariant: events reach ``queue`` in the engine's publication order, except for events
    dropped because the queue was full (then ``needs_resync`` is True).
    """

    def __init__(
        self,
        *,
        endpoint: str,
        ingest: EngineKvIngest,
        queue: asyncio.Queue[KvEvent],
        topic: bytes = b"",
        replay_endpoint: str | None = None,
        replay_timeout_s: float = 2.0,
        catch_up_on_join: bool = True,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.ingest = ingest
        self.queue = queue
        self.topic = topic
        self.replay_endpoint = replay_endpoint
        self.replay_timeout_s = replay_timeout_s
        self.catch_up_on_join = catch_up_on_join
        self._ctx = context if context is not None else zmq.asyncio.Context.instance()
        self.stats = SubscriberStats()
        self.needs_resync = False
        self._connected = asyncio.Event()

    @property
    def depth(self) -> int:
        """Events waiting in the queue."""
        return self.queue.qsize()

    def resynced(self) -> None:
        """The owner has rebuilt this engine's state; clear the resync mark."""
        self.needs_resync = False

    async def wait_connected(self) -> None:
        """Returns once :meth:`run` has its SUB socket connected and subscribed."""
        await self._connected.wait()

    async def run(self) -> None:
        """Receive and handle batches until cancelled; closes the socket on the way out.

        The socket is read synchronously whenever its ZMQ file descriptor signals (it is
        edge-triggered: after each wake-up, everything ``EVENTS`` reports is taken), which
        costs a fraction of ``zmq.asyncio``'s future per message."""
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, self.topic)
        sock.connect(self.endpoint)
        raw: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)
        loop = asyncio.get_running_loop()
        fd = int(raw.getsockopt(zmq.FD))
        signal = asyncio.Event()
        loop.add_reader(fd, signal.set)
        self._connected.set()
        try:
            while True:
                taken = 0
                while int(raw.get(zmq.EVENTS)) & zmq.POLLIN:
                    await self.handle_frames(raw.recv_multipart(zmq.NOBLOCK))
                    taken += 1
                    if taken % DRAIN_BATCHES == 0:
                        await asyncio.sleep(0)  # let the request path have a turn
                signal.clear()
                if int(raw.get(zmq.EVENTS)) & zmq.POLLIN:
                    continue  # arrived between the last check and the clear
                await signal.wait()
        finally:
            loop.remove_reader(fd)
            self._connected.clear()
            sock.close(linger=0)

    async def handle_frames(self, frames: Sequence[bytes]) -> None:
        """Decode one SUB message and queue its events (public for socket-free tests)."""
        try:
            batch = decode_frames(frames)
        except WireError as exc:
            self.stats.decode_errors += 1
            self.needs_resync = True
            log.warning("engine %s: undecodable KV event message: %s", self.ingest.holder, exc)
            return
        self.stats.batches += 1
        check = self.ingest.check(batch)
        if check.verdict is SeqVerdict.GAP or (
            check.verdict is SeqVerdict.FIRST and batch.seq > 0 and self.catch_up_on_join
        ):
            await self._fill(check, batch)
        elif check.verdict is SeqVerdict.RESTART:
            log.info("engine %s: KV event stream restarted (seq %d)", self.ingest.holder, batch.seq)
        self._put_all(self.ingest.apply(batch, check))

    async def _fill(self, check: SeqCheck, batch: EngineEventBatch) -> None:
        """Apply the batches before ``batch`` that were missed (or precede our join)."""
        start = check.expected if check.expected is not None else 0
        is_gap = check.verdict is SeqVerdict.GAP
        if self.replay_endpoint is None:
            if is_gap:
                self.needs_resync = True
                log.warning(
                    "engine %s: missed KV event batches %d..%d and no replay endpoint",
                    self.ingest.holder,
                    start,
                    batch.seq - 1,
                )
            return
        try:
            replayed = await self.replay_from(start)
        except (WireError, TimeoutError, zmq.ZMQError) as exc:
            self.stats.replay_failures += 1
            self.needs_resync = self.needs_resync or is_gap
            log.warning("engine %s: replay from seq %d failed: %s", self.ingest.holder, start, exc)
            return
        fill = [b for b in replayed if start <= b.seq < batch.seq]
        want = batch.seq - start
        complete = [b.seq for b in fill] == list(range(start, batch.seq))
        if complete or not is_gap:
            # On join, a partial history (the replay buffer wrapped) still helps.
            self.stats.replays += 1
        else:
            self.stats.replay_failures += 1
            self.needs_resync = True
            log.warning(
                "engine %s: replay returned %d of %d missed batches",
                self.ingest.holder,
                len(fill),
                want,
            )
        for b in fill:
            self._put_all(self.ingest.apply_unchecked(b))

    async def replay_from(self, start_seq: int) -> list[EngineEventBatch]:
        """Ask the engine's replay socket for every buffered batch with seq >= ``start_seq``."""
        if self.replay_endpoint is None:
            raise WireError("no replay endpoint configured")
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.replay_endpoint)
        out: list[EngineEventBatch] = []
        try:
            async with asyncio.timeout(self.replay_timeout_s):
                await sock.send_multipart([b"", encode_seq(start_seq)])
                while True:
                    frames = await sock.recv_multipart()
                    batch = self._decode_replay(frames)
                    if batch is None:
                        return out
                    out.append(batch)
        finally:
            sock.close(linger=0)

    def _decode_replay(self, frames: Sequence[bytes]) -> EngineEventBatch | None:
        """``[b"", topic, seq, payload]`` (vLLM 0.32) or ``[b"", seq, payload]``; None at end."""
        body = list(frames[1:]) if frames and frames[0] == b"" else list(frames)
        if len(body) == 3:
            topic, raw_seq, payload = body
        elif len(body) == 2:
            topic, (raw_seq, payload) = self.topic, body
        else:
            raise WireError(f"replay reply must have 2 or 3 frames, got {len(body)}")
        seq = decode_seq(raw_seq)
        if seq == END_OF_REPLAY_SEQ:
            return None
        if seq < 0:
            raise WireError(f"negative sequence number {seq} in replay")
        ts, events, dp_rank = decode_payload(payload)
        return EngineEventBatch(topic=bytes(topic), seq=seq, ts=ts, events=events, dp_rank=dp_rank)

    def _put_all(self, events: Sequence[KvEvent]) -> None:
        for event in events:
            try:
                self.queue.put_nowait(event)
            except asyncio.QueueFull:
                self.stats.drops += 1
                self.needs_resync = True
            else:
                self.stats.events_out += 1
