"""The asyncio driver of an :class:`~conductor.emulator.engine.EngineCore`: paces its steps in
wall time, hands tokens to the waiting HTTP handlers and publishes the step's KV events.

A step of cost-model duration ``d`` ends ``d / speedup`` seconds after the later of its start
and the previous step's end (no catching up after a stall); with ``instant`` it ends at
once. Then its KV events are published (before the tokens are handed over, so a client that
sees a response finish can count on the engine's events being out) and every emitted token is
put on its request's queue. The loop sleeps while the engine has no work. How late the tokens
were handed out after each step's planned end (a busy machine wakes the loop late) is
counted (``EngineCounters.late_s``, ``conductor_emulator_late_seconds_total``): every second
of it lengthens the token intervals the clients see beyond the cost model's.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from conductor.emulator.engine import EngineCore, EngineRequest, TokenOutput
from conductor.emulator.publisher import KvEventPublisher


class TokenQueue:
    """One request's emitted tokens for its one reader (a lighter ``asyncio.Queue``: the
    engine puts a token per step for every running request). ``None`` ends an aborted one."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[TokenOutput | None] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: TokenOutput | None) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> TokenOutput | None:
        """The next item, waiting for it if need be (one reader at a time)."""
        items = self._items
        while not items:
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None
        return items.popleft()


class EngineLoop:
    """Owns the engine core; one :meth:`run` task per loop (the app's lifespan owns it).

    Invariant: every submitted request's queue receives its tokens in order, the last one
    with ``finished`` set, unless the request is aborted first (then ``None`` ends it).
    """

    def __init__(
        self,
        core: EngineCore,
        *,
        speedup: float = 1.0,
        instant: bool = False,
        publisher: KvEventPublisher | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = core
        self.speedup = speedup
        self.instant = instant
        self.publisher = publisher
        self._clock = clock
        self._wake = asyncio.Event()
        self._queues: dict[str, TokenQueue] = {}
        self._step_end = 0.0

    def submit(self, request: EngineRequest) -> TokenQueue:
        """Queue ``request`` in the engine; its tokens arrive on the returned queue, and
        ``None`` if it is aborted.

        Raises :class:`~conductor.core.errors.InvalidInput` if the engine cannot serve it.
        """
        self.core.add(request)
        queue = TokenQueue()
        self._queues[request.request_id] = queue
        self._wake.set()
        return queue

    def abort(self, request: EngineRequest) -> None:
        """Stop generating for ``request`` (its client went away) and free its blocks; a
        reader still waiting on its queue gets ``None``."""
        queue = self._queues.pop(request.request_id, None)
        if queue is not None:
            queue.put_nowait(None)
        self.core.abort(request)

    def reset_prefix_cache(self) -> bool:
        return self.core.reset_prefix_cache()

    def flush_events(self) -> None:
        """Publish events produced outside a step (a prefix-cache reset)."""
        if self.publisher is not None:
            self.publisher.publish(self.core.pool.take_events())

    async def run(self) -> None:
        """Step the engine until cancelled."""
        core = self.core
        while True:
            if not core.has_work:
                self._wake.clear()
                await self._wake.wait()
                continue
            start = self._clock()
            result = core.step()
            if self.instant:
                await asyncio.sleep(0)
            else:
                self._step_end = max(self._step_end, start) + result.duration_s / self.speedup
                await asyncio.sleep(max(0.0, self._step_end - self._clock()))
            if self.publisher is not None and result.events:
                self.publisher.publish(result.events)
            queues = self._queues
            for out in result.outputs:
                queue = queues.get(out.request.request_id)
                if queue is None:
                    continue
                queue.put_nowait(out)
                if out.finished:
                    del queues[out.request.request_id]
            if not self.instant:
                late = self._clock() - self._step_end
                if late > 0.0:
                    core.counters.late_s += late
