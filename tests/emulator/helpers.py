"""Run an emulator over real HTTP on 127.0.0.1 in a background thread (conductor.web)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import httpx

from conductor.emulator.config import EmulatorConfig
from conductor.emulator.server import serve_emulator
from conductor.emulator.service import Emulator
from conductor.emulator.tokenizer import Tokenizer
from conductor.web.server import HttpServer, run
from tests.engines.fixtures import free_ports


class EmulatorThread:
    """An emulator's HTTP server on its own event loop in a daemon thread."""

    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator
        self.thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.error: BaseException | None = None

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await serve_emulator(self.emulator, stop=self._stop, on_ready=self._on_ready)

        try:
            run(main)  # uvloop, as ``conductor emulate``
        except BaseException as exc:  # reported by start()
            self.error = exc
        finally:
            self._ready.set()

    def _on_ready(self, server: HttpServer) -> None:
        self._ready.set()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.emulator.config.port}"

    @property
    def kv_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.emulator.config.kv_events_port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.emulator.config.replay_port}"

    def start(self, timeout_s: float = 10.0) -> None:
        self.thread.start()
        if not self._ready.wait(timeout_s) or not self.thread.is_alive():
            raise RuntimeError(f"emulator did not start: {self.error!r}")

    def stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        self.thread.join(timeout=10)


@contextmanager
def running_emulator(
    config: EmulatorConfig | None = None,
    *,
    kv_events: bool = True,
    tokenizer: Tokenizer | None = None,
) -> Iterator[EmulatorThread]:
    """An emulator on free ports (HTTP, and PUB + replay if ``kv_events``), stopped after."""
    http, pub, replay = free_ports(3)
    cfg = replace(
        config or EmulatorConfig(instant=True),
        port=http,
        kv_events_port=pub if kv_events else None,
        replay_port=replay if kv_events else None,
    )
    server = EmulatorThread(Emulator(cfg, tokenizer))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def metric(client: httpx.Client, name: str) -> float:
    """The value of one unlabelled-by-reason vLLM metric from ``GET /metrics``."""
    text = client.get("/metrics").text
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)
