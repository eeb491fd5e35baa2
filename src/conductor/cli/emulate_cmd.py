"""``conductor emulate``: serve one emulated vLLM engine (HTTP API + KV events)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from conductor.cli.cost_source import CostFileOpt, cost_from_options
from conductor.core.checks import check_choice
from conductor.core.costmodel import PRESETS, CostModel
from conductor.core.errors import ConductorError, InvalidInput
from conductor.core.types import Role
from conductor.emulator.config import EmulatorConfig
from conductor.emulator.tokenizer import Tokenizer
from conductor.hf.tokenizer import HfTokenizer

ROLES = tuple(r.value for r in Role)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
_FIELDS = {f.name: f for f in dataclasses.fields(EmulatorConfig)}
FLAGS = {"model_name": "--model", "block_size_tokens": "--block-size"}
"""The flag of each :class:`EmulatorConfig` field whose flag is not its name with dashes."""


def _default(field: str) -> Any:
    """The default of ``--<field>``: the config field's (defaults are defined there only)."""
    value = _FIELDS[field].default
    return value.value if isinstance(value, Role) else value


def flag(field: str) -> str:
    """The option that sets the config field ``field``."""
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def _bad(option: str, message: str) -> typer.BadParameter:
    return typer.BadParameter(message, param_hint=option)


def _bad_input(exc: InvalidInput) -> typer.BadParameter:
    """``exc`` worded for the command line: the flag, the reason, the value."""
    return _bad(flag(exc.field), f"{exc.why}, got {exc.value!r}")


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
    cost: CostModel | None = None,
) -> EmulatorConfig:
    """The options as an :class:`EmulatorConfig` (which validates them); an error names the
    option."""
    try:
        return EmulatorConfig(
            model_name=model,
            role=Role(check_choice("role", role, ROLES)),
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
            cost=cost,
        )
    except InvalidInput as exc:
        raise _bad_input(exc) from None


def load_tokenizer(model_path: Path | None) -> Tokenizer | None:
    if model_path is None:
        return None
    try:
        return HfTokenizer.load(model_path)
    except ConductorError as exc:
        raise _bad("--model-path", str(exc)) from None


def register(app: typer.Typer) -> None:
    @app.command("emulate")
    def emulate_cmd(
        ctx: typer.Context,
        port: Annotated[int, typer.Option("--port", help="HTTP port")] = _default("port"),
        host: Annotated[
            str, typer.Option("--host", help="address to bind (HTTP and ZMQ)")
        ] = _default("host"),
        role: Annotated[
            str, typer.Option("--role", help=f"{'|'.join(ROLES)} (informational)")
        ] = _default("role"),
        kv_events_port: Annotated[
            int | None,
            typer.Option("--kv-events-port", help="publish KV events (ZMQ PUB) on this port"),
        ] = _default("kv_events_port"),
        replay_port: Annotated[
            int | None,
            typer.Option("--replay-port", help="serve KV event replays (ZMQ ROUTER) here"),
        ] = _default("replay_port"),
        kv_topic: Annotated[
            str, typer.Option("--kv-topic", help="topic frame of KV event messages")
        ] = _default("kv_topic"),
        preset_name: Annotated[
            str,
            typer.Option("--preset", help=f"cost model preset: {', '.join(sorted(PRESETS))}"),
        ] = _default("preset"),
        cost_file: CostFileOpt = None,
        speedup: Annotated[
            float, typer.Option("--speedup", help="run the cost model's times X times faster")
        ] = _default("speedup"),
        instant: Annotated[
            bool, typer.Option("--instant", help="steps take no time (measure the client)")
        ] = _default("instant"),
        block_size: Annotated[
            int, typer.Option("--block-size", help="tokens per KV block")
        ] = _default("block_size_tokens"),
        cache_blocks: Annotated[
            int, typer.Option("--cache-blocks", help="KV cache size in blocks")
        ] = _default("cache_blocks"),
        max_model_len: Annotated[
            int, typer.Option("--max-model-len", help="prompt + output tokens at most")
        ] = _default("max_model_len"),
        max_batch_size: Annotated[
            int, typer.Option("--max-batch-size", help="running requests at most")
        ] = _default("max_batch_size"),
        max_batched_tokens: Annotated[
            int, typer.Option("--max-batched-tokens", help="tokens scheduled per step")
        ] = _default("max_batched_tokens"),
        model: Annotated[str, typer.Option("--model", help="served model name")] = _default(
            "model_name"
        ),
        model_path: Annotated[
            Path | None,
            typer.Option("--model-path", help="local Hugging Face tokenizer folder (optional)"),
        ] = None,
        seed: Annotated[int, typer.Option("--seed", help="seed of the generated text")] = _default(
            "seed"
        ),
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
            cost=cost_from_options(ctx, cost_file),
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
