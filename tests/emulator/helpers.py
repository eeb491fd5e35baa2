"""Run an emulator over real HTTP on 127.0.0.1 in a background thread (uvicorn)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import httpx
import uvicorn

from conductor.emulator.config import EmulatorConfig
from conductor.emulator.server import uvicorn_config
from conductor.emulator.service import Emulator
from conductor.emulator.tokenizer import Tokenizer
from tests.engines.fixtures import free_ports


class EmulatorThread:
    """An emulator's uvicorn server on its own event loop in a daemon thread."""

    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator
        self.server = uvicorn.Server(uvicorn_config(emulator, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

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
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("emulator did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
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
