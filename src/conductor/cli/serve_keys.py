"""The keys of ``conductor serve``: each ``[gateway]`` TOML key (and option), the config field
it sets and its default, read off that field; ``--set key=value`` parsing.

The serve-only options (no library config holds them) are :class:`ServeOptions`.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from typing import Any

from conductor.cli.fields import field_default
from conductor.cluster.config import ClusterConfig
from conductor.core.checks import check_at_least, check_choice
from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import DEFAULT_PRESET, preset
from conductor.core.errors import InvalidInput
from conductor.core.policies import DEFAULT_POLICY, check_policy
from conductor.gateway.config import (
    EngineConfig,
    GatewayConfig,
    MonitorConfig,
    RequestLimits,
    UpstreamConfig,
)
from conductor.web.limits import ServerLimits

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """The options of ``conductor serve`` that no library config holds, with their defaults.

    ``model_name`` None: the model folder's name; ``max_model_len`` None: the model's
    ``config.json``; ``admission`` None: the policy's own; ``late_binding`` False: no
    late-binding queue even if the policy has one (``policy_params["late_binding"] = 0``);
    ``hold_horizon_ms``: that queue releases a request once its instance is predicted free
    within this long (``policy_params["late_binding_horizon_s"]``; None: the policy's own);
    ``preset``: a
    :data:`~conductor.core.costmodel.PRESETS` name, or ``cost_file``: a file ``conductor
    profile`` wrote (not both); either recalibrated by ``prefill_tokens_per_s`` /
    ``decode_step_ms`` when given. Invariant:
    ``policy`` is registered, ``preset`` exists, ``log_level`` is one of :data:`LOG_LEVELS`.
    """

    model_path: str | None = None
    model_name: str | None = None
    max_model_len: int | None = None
    policy: str = DEFAULT_POLICY
    admission: str | None = None
    late_binding: bool = True
    hold_horizon_ms: float | None = None
    preset: str = DEFAULT_PRESET
    cost_file: str | None = None
    prefill_tokens_per_s: float | None = None
    decode_step_ms: float | None = None
    log_level: str = "info"
    cluster: str | None = None
    workers: int = 1

    def __post_init__(self) -> None:
        check_at_least("workers", self.workers, 1)
        check_policy(self.policy)
        preset(self.preset)
        check_choice("log_level", self.log_level, LOG_LEVELS)


@dataclass(frozen=True, slots=True)
class Key:
    """A ``[gateway]`` key (and its option, dashes for underscores): the config field it
    sets and the factor from the field's unit to the key's (``tbt_slo_ms``: 1000)."""

    config: type[Any]
    field: str
    scale: float = 1.0

    def default(self) -> object:
        value = field_default(self.config, self.field)
        if self.scale != 1.0 and isinstance(value, int | float):
            return value * self.scale
        return value


KEYS: dict[str, Key] = {
    "model_path": Key(ServeOptions, "model_path"),
    "model_name": Key(ServeOptions, "model_name"),
    "max_model_len": Key(ServeOptions, "max_model_len"),
    "block_size": Key(EngineConfig, "block_size_tokens"),
    "policy": Key(ServeOptions, "policy"),
    "admission": Key(ServeOptions, "admission"),
    "late_binding": Key(ServeOptions, "late_binding"),
    "hold_horizon_ms": Key(ServeOptions, "hold_horizon_ms"),
    "preset": Key(ServeOptions, "preset"),
    "cost_file": Key(ServeOptions, "cost_file"),
    "prefill_tokens_per_s": Key(ServeOptions, "prefill_tokens_per_s"),
    "decode_step_ms": Key(ServeOptions, "decode_step_ms"),
    "ttft_slo_s": Key(SchedulerConfig, "ttft_slo_s"),
    "tbt_slo_ms": Key(SchedulerConfig, "tbt_slo_s", 1e3),
    "seed": Key(SchedulerConfig, "seed"),
    "handoff": Key(SchedulerConfig, "handoff"),
    "host": Key(GatewayConfig, "host"),
    "port": Key(GatewayConfig, "port"),
    "admin_token": Key(GatewayConfig, "admin_token"),
    "max_body_bytes": Key(GatewayConfig, "max_body_bytes"),
    "connect_timeout_s": Key(UpstreamConfig, "connect_timeout_s"),
    "read_timeout_s": Key(UpstreamConfig, "read_timeout_s"),
    "request_timeout_s": Key(UpstreamConfig, "request_timeout_s"),
    "max_attempts": Key(UpstreamConfig, "max_attempts"),
    "kv_transfer_params": Key(UpstreamConfig, "kv_transfer_params"),
    "health_interval_s": Key(MonitorConfig, "health_interval_s"),
    "health_timeout_s": Key(MonitorConfig, "health_timeout_s"),
    "load_interval_s": Key(MonitorConfig, "load_interval_s"),
    "kv_queue_size": Key(MonitorConfig, "kv_queue_size"),
    "health_timeouts_to_unhealthy": Key(MonitorConfig, "health_timeouts_to_unhealthy"),
    "kv_max_blocks": Key(MonitorConfig, "kv_max_blocks"),
    "kv_silent_after_requests": Key(MonitorConfig, "kv_silent_after_requests"),
    "max_header_bytes": Key(ServerLimits, "max_header_bytes"),
    "max_headers": Key(ServerLimits, "max_headers"),
    "head_timeout_s": Key(ServerLimits, "head_timeout_s"),
    "body_timeout_s": Key(ServerLimits, "body_timeout_s"),
    "keep_alive_s": Key(ServerLimits, "keep_alive_s"),
    "max_connections": Key(ServerLimits, "max_connections"),
    "linger_s": Key(ServerLimits, "linger_s"),
    "allowed_template_kwargs": Key(RequestLimits, "allowed_template_kwargs"),
    "max_json_depth": Key(RequestLimits, "max_json_depth"),
    "max_n": Key(RequestLimits, "max_n"),
    "inline_work_chars": Key(RequestLimits, "inline_work_chars"),
    "log_level": Key(ServeOptions, "log_level"),
    "cluster": Key(ServeOptions, "cluster"),
    "replica_id": Key(ClusterConfig, "replica_id"),
    "cluster_name": Key(ClusterConfig, "cluster_name"),
    "cluster_heartbeat_s": Key(ClusterConfig, "heartbeat_s"),
    "cluster_expiry_s": Key(ClusterConfig, "expiry_s"),
    "workers": Key(ServeOptions, "workers"),
}
"""Every ``[gateway]`` key and its command-line option; ``model_path`` is required."""
DEFAULTS: dict[str, object] = {key: k.default() for key, k in KEYS.items()}
"""Each key's default, read off the config dataclasses."""
FIELD_KEYS = {
    "block_size_tokens": "block_size",
    "tbt_slo_s": "tbt_slo_ms",
    "heartbeat_s": "cluster_heartbeat_s",
    "expiry_s": "cluster_expiry_s",
}
"""Config fields whose key has another name."""


def parse_set(spec: str) -> tuple[str, object]:
    """``key=value`` of ``--set``: a ``[gateway]`` key and its value in TOML syntax (a bare
    word that is not TOML is taken as a string)."""
    key, sep, text = spec.partition("=")
    key = key.strip()
    if not sep or not key:
        raise InvalidInput("set", spec, "must be key=value")
    if key not in KEYS:
        raise InvalidInput("set", spec, f"unknown key {key!r}; known: {tuple(KEYS)}")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    return key, value
