"""Build the gateway's frozen configuration from a TOML file and command-line options.

Precedence: a command-line option, else the TOML ``[gateway]`` table, else the default.
Engines come from the TOML ``[[engines]]`` tables followed by each ``--engine`` option::

    --engine http://10.0.0.5:8000,role=prefill,kv_events=tcp://10.0.0.5:5557,block_size=32

Every ``[gateway]`` key can also be given as ``--set key=value`` (the value in TOML syntax:
``--set max_headers=50``, ``--set 'allowed_template_kwargs=["enable_thinking"]'``); the
most used ones have their own option as well.

Each key's default is read off the config dataclass field it sets (:data:`KEYS`), and the
dataclasses check the values: every problem raises
:class:`~conductor.core.errors.InvalidInput` naming the option (``--port``) or TOML key
(``gateway.port``) the value came from, and the value.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from conductor.cli.serve_engines import _engines, parse_engine_spec
from conductor.cli.serve_keys import (
    DEFAULTS,
    FIELD_KEYS,
    KEYS,
    LOG_LEVELS,
    Key,
    ServeOptions,
    parse_set,
)
from conductor.cli.serve_models import (
    Discover,
    ModelSettings,
    build_models,
    model_engines,
    scheduling,
)
from conductor.cli.serve_values import Values
from conductor.cluster.config import ClusterConfig
from conductor.core.checks import check_positive
from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import CostModel
from conductor.core.errors import InvalidInput
from conductor.gateway.config import (
    EngineConfig,
    GatewayConfig,
    MonitorConfig,
    RequestLimits,
    UpstreamConfig,
)
from conductor.gateway.model_check import discover_model
from conductor.gateway.tokenizer import read_max_model_len
from conductor.web.limits import ServerLimits


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """Everything ``conductor serve`` runs with."""

    gateway: GatewayConfig
    scheduler: SchedulerConfig
    cost: CostModel
    policy: str
    model_path: Path
    log_level: str
    cluster: ClusterConfig | None = None
    workers: int = 1
    replica_id: str = ""  # also without a cluster URL: --workers names its workers after it
    models: tuple[ModelSettings, ...] = ()
    """The ``[[models]]`` (empty: the one-model shorthand; else the fields above that
    describe a model are the first one's)."""

    def describe(self) -> dict[str, object]:
        g = self.gateway
        extra: dict[str, object] = {}
        if self.models:
            extra["models"] = [m.describe() for m in self.models]
        return {
            "model_path": str(self.model_path),
            "model_name": g.model_name,
            "max_model_len": g.max_model_len,
            "block_size": g.block_size_tokens,
            "policy": self.policy,
            "admission": self.scheduler.admission,
            "late_binding": self.scheduler.policy_params.get("late_binding", 1.0) != 0.0,
            "hold_horizon_s": self.scheduler.policy_params.get("late_binding_horizon_s"),
            "cost_model": self.cost.name,
            "ttft_slo_s": self.scheduler.ttft_slo_s,
            "tbt_slo_s": self.scheduler.tbt_slo_s,
            "listen": f"{g.host}:{g.port}",
            "admin_api": g.admin_token is not None,
            "limits": {
                **{f: getattr(g.http, f) for f in g.http.__dataclass_fields__},
                **{f: getattr(g.requests, f) for f in g.requests.__dataclass_fields__},
                "max_body_bytes": g.max_body_bytes,
            },
            "engines": [e.to_json() for e in g.engines],
            "cluster": None if self.cluster is None else self.cluster.url,
            "replica_id": None if self.cluster is None else self.cluster.replica_id,
            "workers": self.workers,
            **extra,
        }


Tables = list[Mapping[str, object]]


def load_toml(path: Path) -> tuple[dict[str, object], Tables, Tables]:
    """The ``[gateway]`` table, the ``[[engines]]`` and the ``[[models]]`` tables of a
    config file."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise InvalidInput("config", str(path), f"cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput("config", str(path), f"not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"gateway", "engines", "models"})
    if unknown:
        raise InvalidInput(
            unknown[0], data[unknown[0]], "unknown table; use [gateway], [[engines]], [[models]]"
        )
    gateway = data.get("gateway", {})
    if not isinstance(gateway, dict):
        raise InvalidInput("gateway", gateway, "must be a table")
    for key in gateway:
        if key not in KEYS:
            raise InvalidInput(f"gateway.{key}", gateway[key], f"unknown key; known: {tuple(KEYS)}")
    engines = data.get("engines", [])
    if not isinstance(engines, list) or not all(isinstance(e, dict) for e in engines):
        raise InvalidInput("engines", engines, "must be an array of tables ([[engines]])")
    models = data.get("models", [])
    if not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
        raise InvalidInput("models", models, "must be an array of tables ([[models]])")
    return dict(gateway), list(engines), list(models)


def build_settings(
    cli: Mapping[str, object | None],
    engine_specs: list[str],
    config_path: Path | None = None,
    sets: list[str] | None = None,
    *,
    discover: Discover | None = None,
) -> ServeSettings:
    """Resolve options (see the module docstring) into :class:`ServeSettings`; an
    :class:`InvalidInput` names the option or key the faulty value came from. ``sets``:
    the ``--set key=value`` options (a dedicated option given too wins); ``discover``:
    how an engine's model is found when ``[[models]]`` are given and its entry names none
    (default: its ``GET /v1/models``)."""
    toml: dict[str, object] = {}
    toml_engines: Tables = []
    toml_models: Tables = []
    if config_path is not None:
        toml, toml_engines, toml_models = load_toml(config_path)
    merged = dict(cli)
    via_set: set[str] = set()
    for spec in sets or ():
        key, value = parse_set(spec)
        if merged.get(key) is None:
            merged[key] = value
            via_set.add(key)
    v = Values(merged, toml, frozenset(via_set))
    try:
        if toml_models:
            timeout_s = v.float_("health_timeout_s")
            models = build_models(v, toml_models, toml)
            engines = model_engines(
                models,
                toml_engines,
                engine_specs,
                discover or (lambda url: discover_model(url, timeout_s)),
            )
            return _build_models(v, models, engines)
        return _build(v, toml_engines, engine_specs)
    except InvalidInput as exc:
        raise v.renamed(exc) from None


def _build_models(
    v: Values, models: tuple[ModelSettings, ...], engines: tuple[EngineConfig, ...]
) -> ServeSettings:
    """Several models: replicas do not sync per model yet, so neither --cluster nor
    --workers."""
    if v.opt_str("cluster") is not None or v.int_("workers") > 1:
        name = "cluster" if v.opt_str("cluster") is not None else "workers"
        raise InvalidInput(name, v.raw(name), "not yet with several [[models]]")
    first = models[0]
    gateway = GatewayConfig.for_models(
        tuple(m.model for m in models), engines=engines, **_gateway_values(v)
    )
    options = ServeOptions(log_level=v.str_("log_level").lower())
    return ServeSettings(gateway, first.scheduler, first.cost, first.policy, first.path,
                         options.log_level, None, 1, v.str_("replica_id"), models)  # fmt: skip


def _build(v: Values, toml_engines: Tables, engine_specs: list[str]) -> ServeSettings:
    raw_path = v.opt_str("model_path")
    if raw_path is None:
        raise InvalidInput("model_path", None, "is required (--model-path or gateway.model_path)")
    model_path = Path(raw_path)
    if not model_path.is_dir():
        raise InvalidInput("model_path", str(model_path), "is not a directory")
    # Checked here as well as by GatewayConfig: the engines inherit it before that is built.
    block_size = v.int_("block_size")
    check_positive("block_size", block_size)
    max_model_len = v.opt_int("max_model_len")
    if max_model_len is None:
        max_model_len = read_max_model_len(model_path)
    if max_model_len is None:
        raise InvalidInput("max_model_len", None, f"not in {model_path}/config.json; set it")
    engines = _engines(block_size, toml_engines, engine_specs)

    options = ServeOptions(
        model_path=raw_path,
        model_name=v.opt_str("model_name"),
        max_model_len=max_model_len,
        policy=v.str_("policy"),
        admission=v.opt_str("admission"),
        late_binding=v.bool_("late_binding"),
        hold_horizon_ms=v.opt_float("hold_horizon_ms"),
        preset=v.str_("preset"),
        cost_file=v.opt_str("cost_file"),
        prefill_tokens_per_s=v.opt_float("prefill_tokens_per_s"),
        decode_step_ms=v.opt_float("decode_step_ms"),
        log_level=v.str_("log_level").lower(),
        cluster=v.opt_str("cluster"),
        workers=v.int_("workers"),
    )
    cluster = None if options.cluster is None else ClusterConfig(
        options.cluster, v.str_("replica_id"), v.str_("cluster_name"),
        v.float_("cluster_heartbeat_s"), v.float_("cluster_expiry_s"))  # fmt: skip
    scheduler, cost, _ = scheduling(v, block_size=block_size, max_model_len=max_model_len)
    gateway = GatewayConfig(
        model_name=options.model_name or model_path.resolve().name,
        max_model_len=max_model_len,
        block_size_tokens=block_size,
        engines=engines,
        **_gateway_values(v),
    )
    return ServeSettings(gateway, scheduler, cost, options.policy, model_path, options.log_level,
                         cluster, options.workers, v.str_("replica_id"))  # fmt: skip


class GatewayValues(TypedDict):
    """The ``GatewayConfig`` fields that are not about a model (nor its engines)."""

    host: str
    port: int
    admin_token: str | None
    max_body_bytes: int
    upstream: UpstreamConfig
    monitor: MonitorConfig
    http: ServerLimits
    requests: RequestLimits


def _gateway_values(v: Values) -> GatewayValues:
    """The ``GatewayConfig`` fields that are not about a model."""
    return GatewayValues(
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
            health_timeouts_to_unhealthy=v.int_("health_timeouts_to_unhealthy"),
            kv_max_blocks=v.int_("kv_max_blocks"),
            kv_silent_after_requests=v.int_("kv_silent_after_requests"),
        ),
        http=ServerLimits(
            max_header_bytes=v.int_("max_header_bytes"),
            max_headers=v.int_("max_headers"),
            head_timeout_s=v.float_("head_timeout_s"),
            body_timeout_s=v.float_("body_timeout_s"),
            keep_alive_s=v.float_("keep_alive_s"),
            max_connections=v.int_("max_connections"),
            linger_s=v.float_("linger_s"),
        ),
        requests=RequestLimits(
            allowed_template_kwargs=v.names("allowed_template_kwargs"),
            max_json_depth=v.int_("max_json_depth"),
            max_n=v.int_("max_n"),
            inline_work_chars=v.int_("inline_work_chars"),
        ),
    )


__all__ = [
    "DEFAULTS",
    "FIELD_KEYS",
    "KEYS",
    "LOG_LEVELS",
    "Key",
    "ServeOptions",
    "ServeSettings",
    "build_settings",
    "parse_engine_spec",
    "parse_set",
]
