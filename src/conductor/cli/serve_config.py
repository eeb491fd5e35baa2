"""Build the gateway's frozen configuration from a TOML file and command-line options.

Precedence: a command-line option, else the TOML ``[gateway]`` table, else the default.
Engines come from the TOML ``[[engines]]`` tables followed by each ``--engine`` option::

    --engine http://10.0.0.5:8000,role=prefill,kv_events=tcp://10.0.0.5:5557,block_size=32

Every problem raises :class:`~conductor.core.errors.InvalidInput` naming the field and value.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from conductor.core.config import ADMISSION_MODES, SchedulerConfig
from conductor.core.costmodel import DEFAULT_PRESET, CostModel
from conductor.core.errors import InvalidInput
from conductor.core.policies import policy_config_defaults, policy_names
from conductor.gateway.config import (
    EngineConfig,
    GatewayConfig,
    MonitorConfig,
    UpstreamConfig,
    engine_from_mapping,
)
from conductor.gateway.costs import gateway_preset, with_overrides
from conductor.gateway.tokenizer import read_max_model_len

DEFAULTS: dict[str, object] = {
    "model_name": None,  # the model folder's name
    "max_model_len": None,  # the model's config.json
    "block_size": 16,  # vLLM's default on GPUs; the CPU backend needs a multiple of 32
    "policy": "conductor",
    "admission": None,  # the policy's own
    "preset": DEFAULT_PRESET,  # tiny-cpu for the tests' CPU model
    "prefill_tokens_per_s": None,
    "decode_step_ms": None,
    "ttft_slo_s": 30.0,
    "tbt_slo_ms": 100.0,
    "seed": 0,
    "host": "127.0.0.1",
    "port": 8000,
    "admin_token": None,
    "max_body_bytes": 4 * 1024 * 1024,
    "connect_timeout_s": 5.0,
    "read_timeout_s": 300.0,
    "request_timeout_s": 600.0,
    "max_attempts": 3,
    "kv_transfer_params": False,
    "health_interval_s": 2.0,
    "health_timeout_s": 2.0,
    "load_interval_s": 1.0,
    "kv_queue_size": 10_000,
    "log_level": "info",
}
"""Every ``[gateway]`` key (and its command-line option, dashes for underscores) with its
default; ``model_path`` is required and has none."""
KEYS = ("model_path", *DEFAULTS)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """Everything ``conductor serve`` runs with."""

    gateway: GatewayConfig
    scheduler: SchedulerConfig
    cost: CostModel
    policy: str
    model_path: Path
    log_level: str

    def describe(self) -> dict[str, object]:
        g = self.gateway
        return {
            "model_path": str(self.model_path),
            "model_name": g.model_name,
            "max_model_len": g.max_model_len,
            "block_size": g.block_size_tokens,
            "policy": self.policy,
            "admission": self.scheduler.admission,
            "cost_model": self.cost.name,
            "ttft_slo_s": self.scheduler.ttft_slo_s,
            "tbt_slo_s": self.scheduler.tbt_slo_s,
            "listen": f"{g.host}:{g.port}",
            "admin_api": g.admin_token is not None,
            "engines": [e.to_json() for e in g.engines],
        }


def load_toml(path: Path) -> tuple[dict[str, object], list[Mapping[str, object]]]:
    """The ``[gateway]`` table and the ``[[engines]]`` tables of a config file."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise InvalidInput("config", str(path), f"cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput("config", str(path), f"not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"gateway", "engines"})
    if unknown:
        raise InvalidInput(
            unknown[0], data[unknown[0]], "unknown table; use [gateway], [[engines]]"
        )
    gateway = data.get("gateway", {})
    if not isinstance(gateway, dict):
        raise InvalidInput("gateway", gateway, "must be a table")
    for key in gateway:
        if key not in KEYS:
            raise InvalidInput(f"gateway.{key}", gateway[key], f"unknown key; known: {KEYS}")
    engines = data.get("engines", [])
    if not isinstance(engines, list) or not all(isinstance(e, dict) for e in engines):
        raise InvalidInput("engines", engines, "must be an array of tables ([[engines]])")
    return dict(gateway), list(engines)


def parse_engine_spec(spec: str) -> dict[str, object]:
    """``URL,key=value,...`` (the URL may also be given as ``url=...``) -> key/value pairs."""
    values: dict[str, object] = {}
    for i, part in enumerate(p.strip() for p in spec.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep:
            if i != 0:
                raise InvalidInput("engine", spec, f"{part!r} is not key=value")
            key, value = "url", part
        key = key.strip()
        if key in values:
            raise InvalidInput("engine", spec, f"{key!r} given twice")
        values[key] = value.strip()
    return values


def _pick(name: str, cli: Mapping[str, object | None], toml: Mapping[str, object]) -> object | None:
    value = cli.get(name)
    if value is not None:
        return value
    if name in toml:
        return toml[name]
    return DEFAULTS.get(name)


class _Values:
    """Typed access to the resolved options (see :func:`_pick`)."""

    def __init__(self, cli: Mapping[str, object | None], toml: Mapping[str, object]) -> None:
        self.cli = cli
        self.toml = toml

    def raw(self, name: str) -> object | None:
        return _pick(name, self.cli, self.toml)

    def opt_str(self, name: str) -> str | None:
        value = self.raw(name)
        if value is None or isinstance(value, str):
            return value
        raise InvalidInput(name, value, "must be a string")

    def opt_int(self, name: str) -> int | None:
        value = self.raw(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidInput(name, value, "must be an integer")
        return value

    def opt_float(self, name: str) -> float | None:
        value = self.raw(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidInput(name, value, "must be a number")
        return float(value)

    def str_(self, name: str) -> str:
        value = self.opt_str(name)
        if value is None:
            raise InvalidInput(name, None, "is required")
        return value

    def int_(self, name: str) -> int:
        value = self.opt_int(name)
        if value is None:
            raise InvalidInput(name, None, "is required")
        return value

    def float_(self, name: str) -> float:
        value = self.opt_float(name)
        if value is None:
            raise InvalidInput(name, None, "is required")
        return value

    def bool_(self, name: str) -> bool:
        value = self.raw(name)
        if not isinstance(value, bool):
            raise InvalidInput(name, value, "must be true or false")
        return value


def build_settings(
    cli: Mapping[str, object | None],
    engine_specs: list[str],
    config_path: Path | None = None,
) -> ServeSettings:
    """Resolve options (see the module docstring) into :class:`ServeSettings`."""
    toml: dict[str, object] = {}
    toml_engines: list[Mapping[str, object]] = []
    if config_path is not None:
        toml, toml_engines = load_toml(config_path)

    v = _Values(cli, toml)
    raw_path = v.opt_str("model_path")
    if raw_path is None:
        raise InvalidInput("model_path", None, "is required (--model-path or gateway.model_path)")
    model_path = Path(raw_path)
    if not model_path.is_dir():
        raise InvalidInput("model_path", str(model_path), "is not a directory")
    block_size = v.int_("block_size")
    if block_size <= 0:
        raise InvalidInput("block_size", block_size, "must be > 0")
    max_model_len = v.opt_int("max_model_len")
    if max_model_len is None:
        max_model_len = read_max_model_len(model_path)
    if max_model_len is None:
        raise InvalidInput("max_model_len", None, f"not in {model_path}/config.json; set it")
    model_name = v.opt_str("model_name") or model_path.resolve().name

    engines: list[EngineConfig] = []
    for i, values in enumerate(toml_engines):
        engines.append(
            engine_from_mapping(values, default_block_size=block_size, where=f"engines[{i}]")
        )
    for j, spec in enumerate(engine_specs):
        engines.append(
            engine_from_mapping(
                parse_engine_spec(spec),
                default_block_size=block_size,
                where=f"engines[{len(toml_engines) + j}]",
            )
        )
    if not engines:
        raise InvalidInput("engines", [], "none given (--engine or [[engines]] in --config)")

    policy = v.str_("policy")
    if policy not in policy_names():
        raise InvalidInput("policy", policy, f"unknown; known: {', '.join(sorted(policy_names()))}")
    admission = v.opt_str("admission")
    if admission is not None and admission not in ADMISSION_MODES:
        raise InvalidInput("admission", admission, f"must be one of {ADMISSION_MODES}")
    defaults = policy_config_defaults(policy)
    log_level = v.str_("log_level").lower()
    if log_level not in LOG_LEVELS:
        raise InvalidInput("log_level", log_level, f"must be one of {LOG_LEVELS}")

    cost = with_overrides(
        gateway_preset(v.str_("preset")),
        prefill_tokens_per_s=v.opt_float("prefill_tokens_per_s"),
        decode_step_ms=v.opt_float("decode_step_ms"),
    )
    scheduler = SchedulerConfig(
        block_size_tokens=block_size,
        ttft_slo_s=v.float_("ttft_slo_s"),
        tbt_slo_s=v.float_("tbt_slo_ms") / 1e3,
        admission=admission or str(defaults.get("admission", "off")),
        # Chunked pipeline parallel prefill spans engines; vLLM cannot run it, so plans must
        # not contain it whatever the policy's defaults say.
        cpp_enabled=False,
        seed=v.int_("seed"),
    )
    gateway = GatewayConfig(
        model_name=model_name,
        max_model_len=max_model_len,
        block_size_tokens=block_size,
        engines=tuple(engines),
        host=v.str_("host"),
        port=v.int_("port"),
        admin_token=v.opt_str("admin_token"),
        max_body_bytes=v.int_("max_body_bytes"),
        upstream=UpstreamConfig(
            connect_timeout_s=v.float_("connect_timeout_s"),
            read_timeout_s=v.float_("read_timeout_s"),
            request_timeout_s=v.float_("request_timeout_s"),
            max_attempts=v.int_("max_attempts"),
            kv_transfer_params=v.bool_("kv_transfer_params"),
        ),
        monitor=MonitorConfig(
            health_interval_s=v.float_("health_interval_s"),
            health_timeout_s=v.float_("health_timeout_s"),
            load_interval_s=v.float_("load_interval_s"),
            kv_queue_size=v.int_("kv_queue_size"),
        ),
    )
    return ServeSettings(gateway, scheduler, cost, policy, model_path, log_level)
