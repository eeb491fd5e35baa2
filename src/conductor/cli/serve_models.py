"""``conductor serve`` with several models: the ``[[models]]`` tables of the config file.

Each table is one model, served by its own pool of engines with its own scheduler::

    [[models]]
    name = "chat"            # what clients send in "model" (required)
    path = "/models/chat"    # tokenizer + chat template, loaded locally (required)
    served_name = "Qwen/..." # what its engines serve ([[engines]] model = ...); default: name
    max_model_len = 8192     # default: the model's config.json
    block_size = 32          # its engines' KV block size; default: [gateway] block_size
    cost_file = "chat.cost.toml"  # or preset; and the other scheduling keys below

A key a table does not give comes from the command line or ``[gateway]`` (else its
default), as for one model. An engine joins the model whose served name its ``model``
names; an engine without ``model`` is asked (``GET /v1/models``) at start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from conductor.cli.cost_source import read_cost_file
from conductor.cli.serve_engines import parse_engine_spec
from conductor.cli.serve_values import Values
from conductor.core.checks import check_at_least, check_positive
from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import CostModel, preset
from conductor.core.errors import InvalidInput
from conductor.core.policies import check_policy, policy_config_defaults
from conductor.gateway.config import EngineConfig, engine_from_mapping
from conductor.gateway.costs import with_overrides
from conductor.gateway.model_config import ModelConfig
from conductor.gateway.tokenizer import read_max_model_len

MODEL_KEYS = ("name", "path", "served_name", "max_model_len", "block_size", "policy",
              "admission", "late_binding", "hold_horizon_ms", "preset", "cost_file",
              "prefill_tokens_per_s", "decode_step_ms", "ttft_slo_s", "tbt_slo_ms",
              "seed", "handoff")  # fmt: skip
"""The keys of a ``[[models]]`` table."""
ONE_MODEL_KEYS = ("model_path", "model_name", "max_model_len")
"""Keys of the one-model shorthand, which ``[[models]]`` replaces."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")

Discover = Callable[[str], str]
"""An engine's URL -> the one model it serves (raises ValueError saying why not)."""


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """One model: its pool's config, its local folder, and how its scheduler runs."""

    model: ModelConfig
    path: Path
    scheduler: SchedulerConfig
    cost: CostModel
    policy: str

    def describe(self) -> dict[str, object]:
        return {
            "name": self.model.name,
            "served_name": self.model.upstream_name,
            "path": str(self.path),
            "max_model_len": self.model.max_model_len,
            "block_size": self.model.block_size_tokens,
            "policy": self.policy,
            "admission": self.scheduler.admission,
            "late_binding": self.scheduler.policy_params.get("late_binding", 1.0) != 0.0,
            "hold_horizon_s": self.scheduler.policy_params.get("late_binding_horizon_s"),
            "cost_model": self.cost.name,
            "ttft_slo_s": self.scheduler.ttft_slo_s,
            "tbt_slo_s": self.scheduler.tbt_slo_s,
        }


def hold_params(late_binding: bool, horizon_ms: float | None) -> dict[str, float]:
    """The scheduler's ``policy_params`` for the hold queue: off, or its horizon when given
    (``hold_horizon_ms``, checked >= 0)."""
    if not late_binding:
        return {"late_binding": 0.0}
    if horizon_ms is None:
        return {}
    check_at_least("hold_horizon_ms", horizon_ms, 0)
    return {"late_binding_horizon_s": horizon_ms / 1e3}


def scheduling(
    v: Values, *, block_size: int, max_model_len: int
) -> tuple[SchedulerConfig, CostModel, str]:
    """The scheduler config, cost model and policy ``v`` resolves to (one model's)."""
    policy = v.str_("policy")
    check_policy(policy)
    cost_file = v.opt_str("cost_file")
    if cost_file is None:
        base = preset(v.str_("preset"))
    elif v.where("preset") != "preset":
        raise InvalidInput("cost_file", cost_file, f"excludes {v.where('preset')}; give one")
    else:
        base = read_cost_file(Path(cost_file), "cost_file").cost
    cost = with_overrides(
        base,
        prefill_tokens_per_s=v.opt_float("prefill_tokens_per_s"),
        decode_step_ms=v.opt_float("decode_step_ms"),
    )
    defaults = policy_config_defaults(policy)
    scheduler = SchedulerConfig(
        block_size_tokens=block_size,
        ttft_slo_s=v.float_("ttft_slo_s"),
        tbt_slo_s=v.float_("tbt_slo_ms") / 1e3,
        admission=v.opt_str("admission") or str(defaults.get("admission", "off")),
        # late_binding = false: the policy's hold queue off (conductor.core.late_binding)
        policy_params=hold_params(v.bool_("late_binding"), v.opt_float("hold_horizon_ms")),
        # Chunked pipeline parallel prefill spans engines; vLLM cannot run it, so plans must
        # not contain it whatever the policy's defaults say.
        cpp_enabled=False,
        seed=v.int_("seed"),
        context_tokens=max_model_len,  # a request without max_tokens may use the rest
        # the P/D legs (request_path.py): the client's first token is the decode engine's
        first_token="decode",
        handoff=v.str_("handoff"),
    )
    return scheduler, cost, policy


def _text(table: Mapping[str, object], key: str, where: str) -> str | None:
    value = table.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise InvalidInput(f"{where}.{key}", value, "must be a non-empty string")
    return value


def _tokenizer_bytes(path: Path) -> bytes:
    parts = [(path / f).read_bytes() if (path / f).is_file() else b"" for f in TOKENIZER_FILES]
    return b"\0".join(parts)


def _model(v: Values, table: Mapping[str, object], i: int) -> ModelSettings:
    where = f"models[{i}]"
    unknown = sorted(set(table) - set(MODEL_KEYS))
    if unknown:
        key = unknown[0]
        raise InvalidInput(f"{where}.{key}", table[key], f"unknown key; known: {MODEL_KEYS}")
    name, raw_path = _text(table, "name", where), _text(table, "path", where)
    if name is None or raw_path is None:
        raise InvalidInput(f"{where}.{'path' if name else 'name'}", None, "is required")
    path = Path(raw_path)
    if not path.is_dir():
        raise InvalidInput(f"{where}.path", raw_path, "is not a directory")
    mv = v.layered(table, where)
    try:
        block_size = mv.int_("block_size")
        check_positive("block_size", block_size)
        max_model_len = mv.opt_int("max_model_len") if "max_model_len" in table else None
        if max_model_len is None:
            max_model_len = read_max_model_len(path)
        if max_model_len is None:
            raise InvalidInput("max_model_len", None, f"not in {path}/config.json; set it")
        scheduler, cost, policy = scheduling(mv, block_size=block_size, max_model_len=max_model_len)
        model = ModelConfig(name, max_model_len, block_size, _text(table, "served_name", where))
    except InvalidInput as exc:
        if exc.field in ("name", "served_name"):
            raise InvalidInput(f"{where}.{exc.field}", exc.value, exc.why) from None
        raise mv.renamed(exc) from None
    return ModelSettings(model, path, scheduler, cost, policy)


def build_models(
    v: Values, tables: list[Mapping[str, object]], toml_gateway: Mapping[str, object]
) -> tuple[ModelSettings, ...]:
    """The models of the ``[[models]]`` tables; names unique (a second one of a name is an
    error naming both, and saying whether their tokenizers differ)."""
    for key in ONE_MODEL_KEYS:
        if key in toml_gateway or v.cli.get(key) is not None:
            raise InvalidInput(v.where(key), v.raw(key), "excludes [[models]]; set it per model")
    out: list[ModelSettings] = []
    for i, table in enumerate(tables):
        model = _model(v, table, i)
        for j, other in enumerate(out):
            if other.model.name == model.model.name:
                same = _tokenizer_bytes(other.path) == _tokenizer_bytes(model.path)
                raise InvalidInput(
                    f"models[{i}].name",
                    model.model.name,
                    f"also the name of models[{j}] ({other.path} and {model.path}, "
                    f"{'the same tokenizer' if same else 'different tokenizers'})",
                )
        out.append(model)
    if not out:
        raise InvalidInput("models", [], "none given")
    return tuple(out)


def model_engines(
    models: tuple[ModelSettings, ...],
    toml_engines: list[Mapping[str, object]],
    engine_specs: list[str],
    discover: Discover,
) -> tuple[EngineConfig, ...]:
    """The engines, each with its ``model`` (asked with ``discover`` when not given) and,
    unless given, its model's block size."""
    block_sizes = {m.model.upstream_name: m.model.block_size_tokens for m in models}
    default = models[0].model.block_size_tokens
    entries = [*toml_engines, *(parse_engine_spec(s) for s in engine_specs)]
    engines: list[EngineConfig] = []
    for i, values in enumerate(entries):
        where = f"engines[{i}]"
        values = dict(values)
        if values.get("model") is None and isinstance(values.get("url"), str):
            try:
                values["model"] = discover(str(values["url"]).rstrip("/"))
            except ValueError as exc:
                why = f"not given and not discovered: {exc}"
                raise InvalidInput(f"{where}.model", None, why) from None
        block = block_sizes.get(str(values.get("model")), default)
        engines.append(engine_from_mapping(values, default_block_size=block, where=where))
    if not engines:
        raise InvalidInput("engines", [], "none given (--engine or [[engines]] in --config)")
    return tuple(engines)
