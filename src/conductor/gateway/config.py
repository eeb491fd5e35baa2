"""Gateway configuration: frozen dataclasses, built once by the CLI (or by tests).

Each engine is one :class:`EngineConfig`; the whole service is one :class:`GatewayConfig`.
Values are checked here (``__post_init__``) so that every way of building them — the TOML
file, ``--engine`` options, ``POST /admin/engines`` — fails the same way: an
:class:`~conductor.core.errors.InvalidInput` naming the field and the value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from conductor.core.checks import check_at_least, check_port, check_positive
from conductor.core.errors import InvalidInput
from conductor.core.state import SERIAL_PREFILL_LANES
from conductor.core.types import Role
from conductor.gateway.engines.registry import DEFAULT_KIND, check_kind
from conductor.gateway.model_config import ModelConfig, check_models
from conductor.web.limits import ServerLimits

ENGINE_KEYS = (
    "id",
    "url",
    "role",
    "kv_events",
    "replay",
    "model",
    "block_size",
    "topic",
    "kind",
    "max_blocks",
    "prefill_lanes",
    "prefill_chunk_tokens",
)
"""The keys an engine may be given (TOML table, ``--engine`` option, admin JSON body)."""

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$")


def _check_url(name: str, value: str, schemes: tuple[str, ...]) -> str:
    """``scheme://host:port`` with a scheme of ``schemes``; ``ipc://path`` too when "ipc" is
    one of them (ZMQ's local sockets)."""
    if not isinstance(value, str):
        raise InvalidInput(name, value, "must be a string")
    if "ipc" in schemes and value.startswith("ipc://") and len(value) > len("ipc://"):
        return value
    shapes = " or ".join(f"{s}://path" if s == "ipc" else f"{s}://host:port" for s in schemes)
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:  # a port that is not a number, or out of range
        raise InvalidInput(name, value, f"must look like {shapes}") from None
    if parts.scheme not in schemes or not parts.hostname or port is None:
        raise InvalidInput(name, value, f"must look like {shapes}")
    return value


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One upstream engine (an OpenAI server of some engine kind).

    ``url``: its HTTP base (``http://host:port``); ``role``: prefill, decode or both;
    ``kind``: the engine kind's registered name (:mod:`conductor.gateway.engines.registry`);
    ``kv_events``: its KV-event PUB endpoint (``tcp://host:port``; None: the gateway learns
    nothing about its cache); ``replay``: its replay ROUTER endpoint, if any; ``model``: the
    model name to send upstream (None: the gateway's own model name); ``block_size_tokens``:
    the engine's ``--block-size`` (must equal the gateway's); ``topic``: the KV-event topic
    to subscribe to ("" = all); ``max_blocks``: the most blocks its KV events may claim, over
    all tiers (its KV capacity; None: ``MonitorConfig.kv_max_blocks``); when given, also its
    prefix cache's size for the scheduler (``conductor`` prices what a placement there would
    evict; unknown, it prices nothing); ``prefill_lanes``: how many prompts it prefills side
    by side (vLLM with partial prefills: ``--max-num-batched-tokens`` over
    ``--long-prefill-token-threshold``; 1, its default: one after another), which the
    scheduler's predicted waits follow; ``prefill_chunk_tokens``: with several lanes, that
    ``--long-prefill-token-threshold`` (0, unknown: the scheduler takes the prompts side by
    side as sharing the engine's speed). ``kv_events`` and ``replay`` may be ``ipc://``
    paths.
    """

    engine_id: str
    url: str
    role: Role
    kv_events: str | None = None
    replay: str | None = None
    model: str | None = None
    block_size_tokens: int = 16
    topic: str = ""
    kind: str = DEFAULT_KIND
    max_blocks: int | None = None
    prefill_lanes: int = SERIAL_PREFILL_LANES
    prefill_chunk_tokens: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.engine_id, str) or not _ID_RE.match(self.engine_id):
            raise InvalidInput(
                "id", self.engine_id, "must be 1-128 of [A-Za-z0-9_.:@-], starting alphanumeric"
            )
        check_kind(self.kind)
        _check_url("url", self.url, ("http", "https"))
        if self.url.endswith("/"):
            raise InvalidInput("url", self.url, "must not end with '/'")
        if self.kv_events is not None:
            _check_url("kv_events", self.kv_events, ("tcp", "ipc"))
        if self.replay is not None:
            _check_url("replay", self.replay, ("tcp", "ipc"))
            if self.kv_events is None:
                raise InvalidInput("replay", self.replay, "needs kv_events as well")
        check_positive("block_size", self.block_size_tokens)
        if self.max_blocks is not None:
            check_at_least("max_blocks", self.max_blocks, 1)
        check_at_least("prefill_lanes", self.prefill_lanes, 1)
        check_at_least("prefill_chunk_tokens", self.prefill_chunk_tokens, 0)
        if self.model is not None and not self.model:
            raise InvalidInput("model", self.model, "must not be empty")

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.engine_id,
            "url": self.url,
            "role": self.role.value,
            "kv_events": self.kv_events,
            "replay": self.replay,
            "model": self.model,
            "block_size": self.block_size_tokens,
            "topic": self.topic,
            "kind": self.kind,
            "max_blocks": self.max_blocks,
            "prefill_lanes": self.prefill_lanes,
            "prefill_chunk_tokens": self.prefill_chunk_tokens,
        }


def default_engine_id(url: str) -> str:
    """``host:port`` of ``url`` (the id an engine gets when none is given)."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


def engine_from_mapping(
    values: Mapping[str, object], *, default_block_size: int, where: str = "engine"
) -> EngineConfig:
    """Build an :class:`EngineConfig` from loose key/value pairs (TOML table, ``--engine``
    pairs, admin JSON). Unknown keys and wrong types raise :class:`InvalidInput` whose field
    is prefixed with ``where`` (e.g. ``engines[1].role``)."""
    unknown = sorted(set(values) - set(ENGINE_KEYS))
    if unknown:
        raise InvalidInput(
            f"{where}.{unknown[0]}", values[unknown[0]], f"unknown key; known: {ENGINE_KEYS}"
        )

    def text(key: str, required: bool = False) -> str | None:
        value = values.get(key)
        if value is None:
            if required:
                raise InvalidInput(f"{where}.{key}", None, "is required")
            return None
        if not isinstance(value, str):
            raise InvalidInput(f"{where}.{key}", value, "must be a string")
        return value

    url = text("url", required=True)
    assert url is not None
    role_text = text("role", required=True)
    try:
        role = Role(role_text)
    except ValueError:
        raise InvalidInput(
            f"{where}.role", role_text, "must be one of prefill, decode, both"
        ) from None

    def integer(key: str, default: int | None) -> int | None:
        value = values.get(key, default)
        if value is None:
            return None
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidInput(f"{where}.{key}", value, "must be an integer")
        return value

    block_size = integer("block_size", default_block_size)
    assert block_size is not None
    max_blocks = integer("max_blocks", None)
    lanes = integer("prefill_lanes", SERIAL_PREFILL_LANES)
    assert lanes is not None
    chunk = integer("prefill_chunk_tokens", 0)
    assert chunk is not None
    engine_id = text("id") or default_engine_id(url)
    kv_events, replay, model = text("kv_events"), text("replay"), text("model")
    topic, kind = text("topic") or "", text("kind") or DEFAULT_KIND
    try:
        return EngineConfig(
            engine_id=engine_id,
            url=url,
            role=role,
            kv_events=kv_events,
            replay=replay,
            model=model,
            block_size_tokens=block_size,
            topic=topic,
            kind=kind,
            max_blocks=max_blocks,
            prefill_lanes=lanes,
            prefill_chunk_tokens=chunk,
        )
    except InvalidInput as exc:
        raise InvalidInput(f"{where}.{exc.field}", exc.value, exc.why) from None


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    """Timeouts and retries of the calls to engines (seconds)."""

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 300.0
    """Longest wait for the next bytes of a response (a non-streamed answer: all of it)."""
    request_timeout_s: float = 600.0
    """Longest an accepted request may take from scheduling to its last byte."""
    max_attempts: int = 3
    """Schedules per request: retries go to another engine after a failure to start."""
    kv_transfer_params: bool = False
    """Disaggregated flow for NIXL/Mooncake connectors: the prefill leg carries
    :data:`~conductor.gateway.engines.vllm.KV_TRANSFER_PARAMS_PREFILL` and its answer's
    ``kv_transfer_params`` go to the decode leg. Off for vLLM's ExampleConnector (shared
    folder), which needs none."""

    def __post_init__(self) -> None:
        for name in ("connect_timeout_s", "read_timeout_s", "request_timeout_s"):
            check_positive(name, getattr(self, name))
        check_at_least("max_attempts", self.max_attempts, 1)


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    """Background checks of each engine (seconds)."""

    health_interval_s: float = 2.0
    health_timeout_s: float = 2.0
    load_interval_s: float = 1.0
    kv_queue_size: int = 10_000
    """Bound of each engine's KV-event queue (events; overflow marks the engine for resync)."""
    health_timeouts_to_unhealthy: int = 3
    """Consecutive health probes that time out before an engine is taken out (a busy engine
    answers slowly; a refused connection or a bad status takes it out at once)."""
    kv_max_blocks: int = 131_072
    """The most blocks one engine's KV events may claim (2M tokens at block size 16), unless
    its ``max_blocks`` says otherwise; stores beyond it are dropped and counted."""
    kv_silent_after_requests: int = 20
    """An engine with ``kv_events`` that served this many requests without a single KV
    event is reported silent (log, metric, ``/ready``): its publisher is misconfigured."""

    def __post_init__(self) -> None:
        for name in ("health_interval_s", "health_timeout_s", "load_interval_s"):
            check_positive(name, getattr(self, name))
        check_at_least("kv_queue_size", self.kv_queue_size, 1)
        check_at_least("health_timeouts_to_unhealthy", self.health_timeouts_to_unhealthy, 1)
        check_at_least("kv_max_blocks", self.kv_max_blocks, 1)
        check_at_least("kv_silent_after_requests", self.kv_silent_after_requests, 1)


DEFAULT_MAX_JSON_DEPTH = 64
"""Nesting allowed in a request body (OpenAI tool schemas nest a dozen levels)."""
DEFAULT_TEMPLATE_KWARGS = ("enable_thinking", "thinking", "reasoning_effort")
"""The ``chat_template_kwargs`` a client may set (never ``chat_template`` itself)."""


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one OpenAI request may ask for. ``allowed_template_kwargs``: the
    ``chat_template_kwargs`` keys accepted (others get 400; a client template never runs);
    ``max_json_depth``: nesting of the body; ``max_n``: choices per request;
    ``inline_work_chars``: bodies up to this size are rendered and tokenized on the event
    loop, bigger ones in a worker thread."""

    allowed_template_kwargs: tuple[str, ...] = DEFAULT_TEMPLATE_KWARGS
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    max_n: int = 16
    inline_work_chars: int = 4096

    def __post_init__(self) -> None:
        if not isinstance(self.allowed_template_kwargs, tuple) or not all(
            isinstance(k, str) and k for k in self.allowed_template_kwargs
        ):
            raise InvalidInput(
                "allowed_template_kwargs", self.allowed_template_kwargs, "must be names"
            )
        if "chat_template" in self.allowed_template_kwargs:
            raise InvalidInput(
                "allowed_template_kwargs", "chat_template", "a client template is never run"
            )
        check_at_least("max_json_depth", self.max_json_depth, 4)
        check_at_least("max_n", self.max_n, 1)
        check_at_least("inline_work_chars", self.inline_work_chars, 0)


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """The whole service. ``model_name`` is the name clients use; ``max_model_len`` bounds
    prompt + output tokens; ``block_size_tokens`` is the engines' KV block size (every engine
    must use it: one prefix index, one hash chain); ``admin_token`` None disables the admin
    API.

    ``models`` empty: one model (the shorthand: ``model_name``, ``max_model_len``,
    ``block_size_tokens``; every engine serves it, its ``model`` only the name sent
    upstream). Else the models served, one pool each (:meth:`for_models` builds it; the
    three fields above are then the first model's): each engine's ``model`` must be one
    model's served name, it hashes at that model's block size, and per-pool metrics carry
    a ``model`` label."""

    model_name: str
    max_model_len: int
    block_size_tokens: int
    engines: tuple[EngineConfig, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8000
    admin_token: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    http: ServerLimits = field(default_factory=ServerLimits)
    requests: RequestLimits = field(default_factory=RequestLimits)
    models: tuple[ModelConfig, ...] = ()

    @classmethod
    def for_models(cls, models: tuple[ModelConfig, ...], **values: Any) -> GatewayConfig:
        """Several models (at least one); ``values``: the other fields."""
        if not models:
            raise InvalidInput("models", [], "none given")
        first = models[0]
        return cls(
            model_name=first.name,
            max_model_len=first.max_model_len,
            block_size_tokens=first.block_size_tokens,
            models=models,
            **values,
        )

    @property
    def several_models(self) -> bool:
        """Whether models were declared (``[[models]]``), not the one-model shorthand."""
        return bool(self.models)

    def pool_models(self) -> tuple[ModelConfig, ...]:
        """The models served, in order (the shorthand: one, named ``model_name``)."""
        if self.models:
            return self.models
        return (ModelConfig(self.model_name, self.max_model_len, self.block_size_tokens),)

    def model_of(self, engine: EngineConfig, *, where: str = "engine") -> ModelConfig:
        """The model whose pool ``engine`` joins; :class:`InvalidInput` if none."""
        if not self.models:
            return self.pool_models()[0]
        for model in self.models:
            if engine.model == model.upstream_name:
                return model
        served = [m.upstream_name for m in self.models]
        if engine.model is None:
            raise InvalidInput(f"{where}.model", None, f"is required; served models: {served}")
        raise InvalidInput(f"{where}.model", engine.model, f"no model serves it; known: {served}")

    def __post_init__(self) -> None:
        if not self.model_name:
            raise InvalidInput("model_name", self.model_name, "must not be empty")
        check_at_least("max_model_len", self.max_model_len, 2)
        check_positive("block_size", self.block_size_tokens)
        check_port("port", self.port)
        check_at_least("max_body_bytes", self.max_body_bytes, 1024)
        if self.admin_token is not None and len(self.admin_token) < 8:
            raise InvalidInput("admin_token", "<hidden>", "must be at least 8 characters")
        check_models(self.models)
        if self.models and (
            self.models[0].name,
            self.models[0].max_model_len,
            self.models[0].block_size_tokens,
        ) != (self.model_name, self.max_model_len, self.block_size_tokens):
            raise InvalidInput("model_name", self.model_name, "must describe models[0]")
        seen: set[str] = set()
        for i, engine in enumerate(self.engines):
            model = self.model_of(engine, where=f"engines[{i}]")
            check_engine_fits(engine, model.block_size_tokens, where=f"engines[{i}]")
            if engine.engine_id in seen:
                raise InvalidInput(f"engines[{i}].id", engine.engine_id, "duplicate engine id")
            seen.add(engine.engine_id)


def check_engine_fits(engine: EngineConfig, block_size_tokens: int, *, where: str) -> None:
    """An engine must hash at the gateway's block size (one index for all engines)."""
    if engine.block_size_tokens != block_size_tokens:
        raise InvalidInput(
            f"{where}.block_size",
            engine.block_size_tokens,
            f"must equal the gateway block size {block_size_tokens}",
        )
