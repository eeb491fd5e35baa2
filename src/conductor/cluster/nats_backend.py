"""The NATS transport (nats-py): one subject, every replica subscribed, no echo.

Connecting retries forever (``reconnect_s`` apart) until NATS answers; once connected,
nats-py reconnects by itself after a loss and restores the subscription. While disconnected,
:meth:`NatsTransport.publish` drops the message and says so: the replicas' sequence numbers
then show the gap and the peers resynchronise from a snapshot, rather than receiving stale
reservations that nats-py would have buffered.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from conductor.cluster.protocol import Handler, StateCallback

log = logging.getLogger(__name__)

PING_INTERVAL_S = 2
"""How often the client pings the server (a silent network loss shows within ~2 pings)."""


class NatsTransport:
    """See the module docstring; implements :class:`~conductor.cluster.protocol.Transport`."""

    def __init__(self, url: str, subject: str, name: str, reconnect_s: float) -> None:
        self.url = url
        self.subject = subject
        self.name = name
        self.reconnect_s = reconnect_s
        self._nc: Client | None = None
        self._on_state: StateCallback | None = None

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    async def _state(self, connected: bool, why: str) -> None:
        if self._on_state is not None:
            result = self._on_state(connected, why)
            if inspect.isawaitable(result):
                await result

    async def start(self, on_message: Handler, on_state: StateCallback) -> None:
        self._on_state = on_state

        async def disconnected() -> None:
            await self._state(False, "disconnected")

        async def reconnected() -> None:
            await self._state(True, "reconnected")

        async def error(exc: Exception) -> None:
            log.debug("nats: %s", exc)

        async def message(msg: Msg) -> None:
            on_message(msg.data)

        while True:
            try:
                nc = await nats.connect(
                    servers=[self.url],
                    name=self.name,
                    no_echo=True,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=self.reconnect_s,
                    connect_timeout=max(1.0, self.reconnect_s),
                    ping_interval=PING_INTERVAL_S,
                    max_outstanding_pings=2,
                    disconnected_cb=disconnected,
                    reconnected_cb=reconnected,
                    error_cb=error,
                )
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # unreachable: keep serving on local state, retry
                await self._state(
                    False, f"cannot connect to {self.url}: {exc or type(exc).__name__}"
                )
                await asyncio.sleep(self.reconnect_s)
        self._nc = nc
        await nc.subscribe(self.subject, cb=message)
        await nc.flush()
        await self._state(True, f"connected to {self.url}")

    async def publish(self, data: bytes) -> bool:
        nc = self._nc
        if nc is None or not nc.is_connected:
            return False
        try:
            await nc.publish(self.subject, data)
        except Exception as exc:
            log.debug("nats publish failed: %s", exc)
            return False
        return True

    async def close(self) -> None:
        nc, self._nc = self._nc, None
        if nc is not None and not nc.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.flush(timeout=1), timeout=1.5)
            await nc.close()
