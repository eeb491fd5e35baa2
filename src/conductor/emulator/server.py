"""Run an emulator's HTTP app under uvicorn (the CLI's ``conductor emulate``)."""

from __future__ import annotations

import uvicorn

from conductor.emulator.api import build_app
from conductor.emulator.config import EmulatorConfig
from conductor.emulator.service import Emulator
from conductor.emulator.tokenizer import Tokenizer


def uvicorn_config(emulator: Emulator, *, log_level: str = "warning") -> uvicorn.Config:
    """A uvicorn config serving ``emulator`` on its ``host:port``.

    uvicorn picks uvloop and httptools when they are installed (``loop``/``http`` "auto").
    """
    cfg = emulator.config
    return uvicorn.Config(
        build_app(emulator),
        host=cfg.host,
        port=cfg.port,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=2,
    )


def serve(
    config: EmulatorConfig, tokenizer: Tokenizer | None = None, *, log_level: str = "warning"
) -> None:
    """Serve until interrupted (SIGINT/SIGTERM)."""
    uvicorn.Server(uvicorn_config(Emulator(config, tokenizer), log_level=log_level)).run()
