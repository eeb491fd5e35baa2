"""Serve an emulator's HTTP API with :mod:`conductor.web` (the CLI's ``conductor emulate``).

The engine (and its KV-event sockets) runs for the lifespan of the server
(:meth:`~conductor.emulator.service.Emulator.running`); SIGINT/SIGTERM stop it gracefully:
no new connections, requests in progress get :data:`GRACE_S` to finish.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from conductor.emulator.api import MAX_BODY_BYTES, build_app
from conductor.emulator.config import EmulatorConfig
from conductor.emulator.errors import error_factory
from conductor.emulator.service import Emulator
from conductor.emulator.tokenizer import Tokenizer
from conductor.web.server import HttpServer, run, serve_until_stopped

GRACE_S = 2.0


def http_server(emulator: Emulator) -> HttpServer:
    """The HTTP server of ``emulator``'s API (not started)."""
    return HttpServer(build_app(emulator), max_body_bytes=MAX_BODY_BYTES, error=error_factory)


async def serve_emulator(
    emulator: Emulator,
    *,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[HttpServer], None] | None = None,
) -> None:
    """Run the engine and serve its API on its ``host:port`` until ``stop`` is set or
    SIGINT/SIGTERM arrives (signals only in the main thread), then shut down gracefully."""
    cfg = emulator.config
    await serve_until_stopped(
        http_server(emulator),
        host=cfg.host,
        port=cfg.port,
        lifespan=emulator.running(),
        stop=stop,
        grace_s=GRACE_S,
        on_ready=on_ready,
    )


def serve(config: EmulatorConfig, tokenizer: Tokenizer | None = None) -> None:
    """Serve until interrupted (SIGINT/SIGTERM), on uvloop."""
    emulator = Emulator(config, tokenizer)
    run(lambda: serve_emulator(emulator))
