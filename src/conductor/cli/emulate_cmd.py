"""``conductor emulate``: serve one emulated vLLM engine (HTTP API + KV events)."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Annotated

import typer

from conductor.core.costmodel import PRESETS
from conductor.core.errors import ConductorError
from conductor.core.types import Role
from conductor.emulator import config as defaults
from conductor.emulator.config import EmulatorConfig
from conductor.emulator.tokenizer import HfTokenizer, Tokenizer

ROLES = tuple(r.value for r in Role)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def _bad(option: str, message: str) -> typer.BadParameter:
    return typer.BadParameter(message, param_hint=option)


def _check_port(option: str, value: int | None) -> None:
    if value is not None and not 1 <= value <= 65535:
        raise _bad(option, f"must be a TCP port in 1-65535, got {value}")


def _check_positive(option: str, value: int) -> None:
    if value <= 0:
        raise _bad(option, f"must be > 0, got {value}")


def build_config(
    *,
    port: int,
    host: str,
    role: str,
    kv_events_port: int | None,
    replay_port: int | None,
    kv_topic: str,
    preset_name: str,
    speedup: float,
    instant: bool,
    block_size: int,
    cache_blocks: int,
    max_model_len: int,
    max_batch_size: int,
    max_batched_tokens: int,
    model: str,
    seed: int,
    engine_id: str | None,
) -> EmulatorConfig:
    """Validate the options (each error names its option) into an :class:`EmulatorConfig`."""
    if role not in ROLES:
        raise _bad("--role", f"must be one of {', '.join(ROLES)}, got {role!r}")
    if preset_name not in PRESETS:
        raise _bad(
            "--preset", f"unknown preset {preset_name!r}; known: {', '.join(sorted(PRESETS))}"
        )
    if not (speedup > 0 and math.isfinite(speedup)):
        raise _bad("--speedup", f"must be a finite number > 0, got {speedup}")
    _check_port("--port", port)
    _check_port("--kv-events-port", kv_events_port)
    _check_port("--replay-port", replay_port)
    if replay_port is not None and kv_events_port is None:
        raise _bad("--replay-port", "needs --kv-events-port too")
    if kv_events_port is not None and kv_events_port == port:
        raise _bad("--kv-events-port", f"must differ from --port ({port})")
    if replay_port is not None and replay_port in (port, kv_events_port):
        raise _bad("--replay-port", "must differ from --port and --kv-events-port")
    for option, value in (
        ("--block-size", block_size),
        ("--cache-blocks", cache_blocks),
        ("--max-model-len", max_model_len),
        ("--max-batch-size", max_batch_size),
        ("--max-batched-tokens", max_batched_tokens),
    ):
        _check_positive(option, value)
    if seed < 0:
        raise _bad("--seed", f"must be >= 0, got {seed}")
    if not model.strip():
        raise _bad("--model", "must not be empty")
    try:
        return EmulatorConfig(
            model_name=model,
            role=Role(role),
            preset=preset_name,
            speedup=speedup,
            instant=instant,
            block_size_tokens=block_size,
            cache_blocks=cache_blocks,
            max_model_len=max_model_len,
            max_batch_size=max_batch_size,
            max_batched_tokens=max_batched_tokens,
            seed=seed,
            engine_id=engine_id or f"emulator-{port}",
            host=host,
            port=port,
            kv_events_port=kv_events_port,
            replay_port=replay_port,
            kv_topic=kv_topic,
        )
    except ConductorError as exc:  # a check above should have caught it first
        raise typer.BadParameter(str(exc)) from None


def load_tokenizer(model_path: Path | None) -> Tokenizer | None:
    if model_path is None:
        return None
    try:
        return HfTokenizer(model_path)
    except ConductorError as exc:
        raise _bad("--model-path", str(exc)) from None


def register(app: typer.Typer) -> None:
    @app.command("emulate")
    def emulate_cmd(
        port: Annotated[int, typer.Option("--port", help="HTTP port")] = 8000,
        host: Annotated[
            str, typer.Option("--host", help="address to bind (HTTP and ZMQ)")
        ] = "127.0.0.1",
        role: Annotated[
            str, typer.Option("--role", help=f"{'|'.join(ROLES)} (informational)")
        ] = "both",
        kv_events_port: Annotated[
            int | None,
            typer.Option("--kv-events-port", help="publish KV events (ZMQ PUB) on this port"),
        ] = None,
        replay_port: Annotated[
            int | None,
            typer.Option("--replay-port", help="serve KV event replays (ZMQ ROUTER) here"),
        ] = None,
        kv_topic: Annotated[
            str, typer.Option("--kv-topic", help="topic frame of KV event messages")
        ] = "",
        preset_name: Annotated[
            str,
            typer.Option("--preset", help=f"cost model preset: {', '.join(sorted(PRESETS))}"),
        ] = defaults.DEFAULT_PRESET,
        speedup: Annotated[
            float, typer.Option("--speedup", help="run the cost model's times X times faster")
        ] = 1.0,
        instant: Annotated[
            bool, typer.Option("--instant", help="steps take no time (measure the client)")
        ] = False,
        block_size: Annotated[
            int, typer.Option("--block-size", help="tokens per KV block")
        ] = defaults.DEFAULT_BLOCK_SIZE_TOKENS,
        cache_blocks: Annotated[
            int, typer.Option("--cache-blocks", help="KV cache size in blocks")
        ] = defaults.DEFAULT_CACHE_BLOCKS,
        max_model_len: Annotated[
            int, typer.Option("--max-model-len", help="prompt + output tokens at most")
        ] = defaults.DEFAULT_MAX_MODEL_LEN,
        max_batch_size: Annotated[
            int, typer.Option("--max-batch-size", help="running requests at most")
        ] = defaults.DEFAULT_MAX_BATCH_SIZE,
        max_batched_tokens: Annotated[
            int, typer.Option("--max-batched-tokens", help="tokens scheduled per step")
        ] = defaults.DEFAULT_MAX_BATCHED_TOKENS,
        model: Annotated[
            str, typer.Option("--model", help="served model name")
        ] = defaults.DEFAULT_MODEL_NAME,
        model_path: Annotated[
            Path | None,
            typer.Option("--model-path", help="local Hugging Face tokenizer folder (optional)"),
        ] = None,
        seed: Annotated[int, typer.Option("--seed", help="seed of the generated text")] = 0,
        engine_id: Annotated[
            str | None, typer.Option("--engine-id", help="engine id (default emulator-PORT)")
        ] = None,
        log_level: Annotated[str, typer.Option("--log-level", help="log level")] = "warning",
    ) -> None:
        """Serve an emulated vLLM engine: OpenAI HTTP API, /metrics and KV events."""
        if log_level not in LOG_LEVELS:
            raise _bad("--log-level", f"must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")
        cfg = build_config(
            port=port,
            host=host,
            role=role,
            kv_events_port=kv_events_port,
            replay_port=replay_port,
            kv_topic=kv_topic,
            preset_name=preset_name,
            speedup=speedup,
            instant=instant,
            block_size=block_size,
            cache_blocks=cache_blocks,
            max_model_len=max_model_len,
            max_batch_size=max_batch_size,
            max_batched_tokens=max_batched_tokens,
            model=model,
            seed=seed,
            engine_id=engine_id,
        )
        tokenizer = load_tokenizer(model_path)
        from conductor.emulator.server import serve

        logging.basicConfig(level=log_level.upper())
        typer.echo(
            f"emulated engine {cfg.engine_id} ({cfg.role.value}) on http://{cfg.host}:{cfg.port}"
            + (
                f", KV events on tcp://{cfg.host}:{cfg.kv_events_port}"
                if cfg.kv_events_port
                else ""
            )
            + (f", replay on tcp://{cfg.host}:{cfg.replay_port}" if cfg.replay_port else ""),
            err=True,
        )
        serve(cfg, tokenizer)
