"""The options ``conductor simulate | compare | capacity`` share, declared once, and what
they become: a :class:`ClusterOptions`, a :class:`TraceInput` to load, and, for a trace naming
several models, one pool per model.

:func:`shared_options` adds the shared options to a command's own (so each is declared, with
its default and help, in one place) and hands the command ``options`` and ``source``
instead of the individual values.

Pools (docs/simulator.md, "Several models"): with ``--pool MODEL=SHAPE`` given, every model
of the trace needs one and every pool's model must be in the trace; without, a trace naming
several models gets ``--prefill/--decode/--both`` split equally over its models, by name
(:func:`~conductor.sim.pools.split_cluster`). A trace of one model and no ``--pool`` is one
cluster, as before.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from conductor.cli.cost_source import CostFileOpt, cost_from_options
from conductor.cli.fields import config_error
from conductor.cli.sim_options import (
    DEFAULT_TBT_SLO_MS,
    DEFAULTS,
    BatchTokensOpt,
    BothOpt,
    CacheOpt,
    ClusterOptions,
    CorrectionOpt,
    CostBiasOpt,
    CostErrorOpt,
    CppOpt,
    DecodeCacheOpt,
    DecodeOpt,
    DelayOpt,
    FirstTokenOpt,
    HandoffOpt,
    KvBlockOpt,
    KvFetchOpt,
    LimitOpt,
    LongPrefillOpt,
    MaxTokensOpt,
    OracleOpt,
    PoolOpt,
    PrefillOpt,
    PresetOpt,
    ReplicasOpt,
    ReplOpt,
    SeedOpt,
    SeqsOpt,
    SkipOpt,
    SpeedOpt,
    SyncDelayOpt,
    TbtOpt,
    TraceOpt,
    TtftOpt,
    UnboundedOpt,
    fail,
    load_records,
    parse_max_tokens,
    to_requests,
)
from conductor.core.costmodel import DEFAULT_PRESET
from conductor.core.errors import InvalidInput
from conductor.core.types import Request
from conductor.sim.config import SimConfig
from conductor.sim.pools import Pool, PoolShape, parse_pool, split_cluster
from conductor.workload.max_tokens import MaxTokens
from conductor.workload.trace import split_by_model

PrefillLanesOpt = Annotated[
    str,
    typer.Option(
        "--prefill-lanes",
        help="what the scheduler assumes of prompts prefilled side by side per engine: 1 (one"
        " after another, its queue model), N, or engine (max-num-batched-tokens //"
        " long-prefill-tokens, what the simulated engines do)",
    ),
]

__all__ = ["TraceInput", "Workload", "pools_for", "shared_options"]

_Spec = tuple[str, Any, object]
"""(parameter name, annotated option type, default)."""

_CLUSTER: tuple[_Spec, ...] = (
    ("prefill", PrefillOpt, DEFAULTS.n_prefill),
    ("decode", DecodeOpt, DEFAULTS.n_decode),
    ("both", BothOpt, DEFAULTS.n_both),
    ("pool", PoolOpt, None),
    ("preset_name", PresetOpt, DEFAULT_PRESET),
    ("cost_file", CostFileOpt, None),
    ("ttft_slo_s", TtftOpt, DEFAULTS.scheduler.ttft_slo_s),
    ("tbt_slo_ms", TbtOpt, DEFAULT_TBT_SLO_MS),
    ("seed", SeedOpt, DEFAULTS.seed),
    ("cpp", CppOpt, None),
    ("replication", ReplOpt, DEFAULTS.scheduler.replication_enabled),
    ("cache_tokens", CacheOpt, None),
    ("unbounded", UnboundedOpt, False),
    ("kv_event_delay_s", DelayOpt, DEFAULTS.kv_event_delay_s),
    ("max_num_batched_tokens", BatchTokensOpt, DEFAULTS.engine.max_num_batched_tokens),
    ("max_num_seqs", SeqsOpt, DEFAULTS.engine.max_num_seqs),
    ("kv_block_tokens", KvBlockOpt, DEFAULTS.engine.block_size_tokens),
    ("long_prefill_tokens", LongPrefillOpt, DEFAULTS.engine.long_prefill_token_threshold),
    ("oracle_lengths", OracleOpt, DEFAULTS.oracle_lengths),
    ("cost_error", CostErrorOpt, DEFAULTS.cost_error),
    ("cost_bias", CostBiasOpt, DEFAULTS.cost_bias),
    ("correction", CorrectionOpt, DEFAULTS.scheduler.cost_correction),
    ("replicas", ReplicasOpt, DEFAULTS.replicas),
    ("sync_delay_ms", SyncDelayOpt, DEFAULTS.sync_delay_s * 1e3),
    ("handoff", HandoffOpt, DEFAULTS.handoff),
    ("first_token", FirstTokenOpt, DEFAULTS.first_token),
    ("decode_cache", DecodeCacheOpt, DEFAULTS.decode_cache),
    ("kv_fetch", KvFetchOpt, DEFAULTS.kv_fetch),
    ("prefill_lanes", PrefillLanesOpt, str(DEFAULTS.prefill_lanes)),
)
_TRACE: tuple[_Spec, ...] = (
    ("trace", TraceOpt, None),
    ("limit", LimitOpt, None),
    ("speed", SpeedOpt, 1.0),
    ("skip_invalid", SkipOpt, False),
    ("max_tokens", MaxTokensOpt, "none"),
)
_KEYWORD = inspect.Parameter.KEYWORD_ONLY
_SIZES = ("prefill", "decode", "both")
"""The options a ``--pool`` replaces."""
_FLAG = {"prefill": "--prefill", "decode": "--decode", "both": "--both"}


@dataclass(frozen=True, slots=True)
class Workload:
    """A loaded trace: per model (in order of first appearance), its requests ``r0, r1, ...``
    and what each generates; ``max_tokens`` as ``--max-tokens`` said."""

    by_model: dict[str, tuple[list[Request], list[int]]]
    max_tokens: MaxTokens

    @property
    def requests(self) -> list[Request]:
        """Every model's requests."""
        return [r for requests, _ in self.by_model.values() for r in requests]

    def single(self) -> tuple[list[Request], list[int]]:
        """The requests and outputs of a trace of one model."""
        (only,) = self.by_model.values()
        return only


@dataclass(frozen=True, slots=True)
class TraceInput:
    """``--trace``, ``--limit``, ``--speed``, ``--skip-invalid`` and ``--max-tokens``,
    loaded when the command has checked its own options (:meth:`load`)."""

    path: Path | None
    limit: int | None
    speed: float
    skip_invalid: bool
    max_tokens: MaxTokens

    def load(self) -> Workload:
        """The trace split by model; a bad file or line exits naming it."""
        path, records = load_records(self.path, self.limit, self.speed, self.skip_invalid)
        return Workload(
            {
                model: to_requests(path, part, self.speed, self.max_tokens)
                for model, part in split_by_model(records).items()
            },
            self.max_tokens,
        )


def _pools(texts: list[str] | None, ctx: typer.Context) -> tuple[tuple[str, PoolShape], ...]:
    if not texts:
        return ()
    for name in _SIZES:
        source = ctx.get_parameter_source(name)
        if source is not None and source.name != "DEFAULT":
            value = ctx.params.get(name)
            typer.echo(
                f"error: invalid {_FLAG[name]}={value}: not used with --pool"
                " (each --pool sizes its model's pool)",
                err=True,
            )
            raise typer.Exit(2)
    out: dict[str, PoolShape] = {}
    for text in texts:
        try:
            model, shape = parse_pool(text)
        except InvalidInput as exc:
            raise config_error(InvalidInput("--pool", text, exc.why), {}) from None
        if model in out:
            why = f"model {model!r} has two pools"
            raise config_error(InvalidInput("--pool", text, why), {}) from None
        out[model] = shape
    return tuple(out.items())


def shared_options(*, tbt: bool = True, speed: bool = True) -> Callable[..., Any]:
    """Decorator: add the shared cluster and trace options (``--tbt-slo-ms`` with ``tbt``,
    ``--speed`` with ``speed``) to a command, which takes ``options: ClusterOptions`` and
    ``source: TraceInput`` instead (``tbt_slo_ms`` the default without ``tbt``, ``speed`` 1
    without ``speed``)."""
    left_out = {name for name, keep in (("tbt_slo_ms", tbt), ("speed", speed)) if not keep}
    specs = [spec for spec in (*_CLUSTER, *_TRACE) if spec[0] not in left_out]

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        sig = inspect.signature(command, eval_str=True)
        own = [
            p.replace(kind=_KEYWORD)
            for p in sig.parameters.values()
            if p.name not in ("options", "source")
        ]
        wants_ctx = "ctx" in sig.parameters
        if not wants_ctx:  # typer hands the context to a parameter annotated so
            own.insert(0, inspect.Parameter("ctx", _KEYWORD, annotation=typer.Context))
        added = [inspect.Parameter(n, _KEYWORD, default=d, annotation=a)
                 for n, a, d in specs]  # fmt: skip

        @functools.wraps(command)
        def run(**kwargs: Any) -> None:
            given = {name: kwargs.pop(name) for name, _, _ in specs}
            ctx: typer.Context = kwargs["ctx"] if wants_ctx else kwargs.pop("ctx")
            mt = parse_max_tokens(given.pop("max_tokens"))
            source = TraceInput(
                given.pop("trace"),
                given.pop("limit"),
                given.pop("speed", 1.0),
                given.pop("skip_invalid"),
                mt,
            )
            pools = _pools(given.pop("pool"), ctx)
            cost = cost_from_options(ctx, given.pop("cost_file"))
            tbt_slo_ms = given.pop("tbt_slo_ms", DEFAULT_TBT_SLO_MS)
            options = ClusterOptions(tbt_slo_ms=tbt_slo_ms, cost=cost, pools=pools, **given)
            command(**kwargs, options=options, source=source)

        params = [*own, *added]
        run.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return decorate


def pools_for(options: ClusterOptions, workload: Workload) -> dict[str, PoolShape] | None:
    """Each model's pool shape (see the module doc), or None for one cluster; exits with an
    error naming the model or the ``--pool`` at fault."""
    models = workload.by_model
    if options.pools:
        given = dict(options.pools)
        for model in models:
            if model not in given:
                known = ", ".join(given)
                raise fail(
                    f"the trace names model {model!r} but no --pool gives it one"
                    f" (pools: {known}); add --pool {model}=SHAPE"
                )
        for model, shape in options.pools:
            if model not in models:
                raise fail(
                    f"invalid --pool='{model}={shape}': the trace has no request for model"
                    f" {model!r} (its models: {', '.join(sorted(models))})"
                )
        return given
    if len(models) == 1:
        return None
    try:
        return split_cluster(sorted(models), options.prefill, options.decode, options.both)
    except InvalidInput as exc:
        raise fail(f"{exc.why}") from None


def make_pools(workload: Workload, shapes: dict[str, PoolShape], cfg: SimConfig) -> list[Pool]:
    """One :class:`Pool` per model of ``shapes``: ``cfg`` with the pool's instance counts."""
    return [
        Pool(model, *workload.by_model[model], shape.config(cfg)) for model, shape in shapes.items()
    ]
