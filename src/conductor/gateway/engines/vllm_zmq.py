"""vLLM's KV-event transport: a ZMQ SUB socket that yields decoded batches, and replay.

:class:`VllmEventSocket` connects a SUB socket to the engine's publisher (e.g.
``tcp://10.0.0.5:5557``) and yields each multipart message decoded by
:mod:`conductor.wire.vllm_events`; what to do with a batch (sequence gaps, replays, the
queue) is :class:`~conductor.gateway.kv_feed.KvFeed`'s job. :meth:`VllmEventSocket.replay_from`
asks the engine's replay endpoint (vLLM ``replay_endpoint``, a ROUTER socket) for the buffered
batches from a sequence number on (DEALER; request ``[b"", seq as 8-byte BE]``; replies
``[b"", topic, seq, payload]`` until seq -1).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

import zmq
import zmq.asyncio

from conductor.gateway.kv_feed import ReplayFailed
from conductor.wire.events import EngineEventBatch, WireError
from conductor.wire.vllm_events import decode_frames, decode_replay, encode_seq

DRAIN_BATCHES = 256
"""Messages taken in a row before the event loop gets a turn."""
DECODE_INLINE_BYTES = 256 * 1024
"""Bigger messages are decoded in a worker thread, off the event loop."""


def decode_message(frames: Sequence[bytes]) -> EngineEventBatch | WireError:
    """One SUB message decoded, or the :class:`WireError` saying why it is not decodable."""
    try:
        return decode_frames(frames)
    except WireError as exc:
        return exc
    except Exception as exc:  # whatever reaches the port: never let it end the subscription
        return WireError(f"undecodable message: {exc!r}"[:300])


class VllmEventSocket:
    """One vLLM engine's KV-event sockets (a :class:`~conductor.gateway.kv_feed.KvEventSource`).

    Invariant: at most one SUB socket is open, while :meth:`batches` is being iterated.
    """

    def __init__(
        self,
        *,
        endpoint: str,
        topic: bytes = b"",
        replay_endpoint: str | None = None,
        replay_timeout_s: float = 2.0,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.topic = topic
        self.replay_endpoint = replay_endpoint
        self.replay_timeout_s = replay_timeout_s
        self._ctx = context if context is not None else zmq.asyncio.Context.instance()
        self._connected = asyncio.Event()

    @property
    def can_replay(self) -> bool:
        return self.replay_endpoint is not None

    async def wait_connected(self) -> None:
        """Returns once :meth:`batches` has its SUB socket connected and subscribed."""
        await self._connected.wait()

    async def batches(self) -> AsyncGenerator[EngineEventBatch | WireError, None]:
        """Decoded messages until the iterator is closed (which closes the socket).

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
                    frames = raw.recv_multipart(zmq.NOBLOCK)
                    if sum(len(f) for f in frames) > DECODE_INLINE_BYTES:
                        yield await asyncio.to_thread(decode_message, frames)
                    else:
                        yield decode_message(frames)
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

    async def replay_from(self, start_seq: int) -> list[EngineEventBatch]:
        """Every buffered batch with seq >= ``start_seq``; :class:`ReplayFailed` on a
        timeout, a socket error or an undecodable reply."""
        if self.replay_endpoint is None:
            raise ReplayFailed("no replay endpoint configured")
        try:
            return await self._replay(self.replay_endpoint, start_seq)
        except TimeoutError:
            raise ReplayFailed(f"no end of replay within {self.replay_timeout_s:g} s") from None
        except (WireError, zmq.ZMQError) as exc:
            raise ReplayFailed(str(exc)) from exc

    async def _replay(self, endpoint: str, start_seq: int) -> list[EngineEventBatch]:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        out: list[EngineEventBatch] = []
        try:
            async with asyncio.timeout(self.replay_timeout_s):
                await sock.send_multipart([b"", encode_seq(start_seq)])
                while True:
                    batch = decode_replay(await sock.recv_multipart(), self.topic)
                    if batch is None:
                        return out
                    out.append(batch)
        finally:
            sock.close(linger=0)
