"""The options ``conductor simulate | compare | capacity`` share, and how they become a
:class:`~conductor.sim.config.SimConfig` and a request list.

Defaults are read off a default :class:`SimConfig` (and its :class:`SchedulerConfig`); values
are checked by those dataclasses, and their errors name the option
(``error: invalid --ttft-slo-s=-1.0: must be > 0``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from conductor.cli.fields import config_error
from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import PRESETS, CostModel, preset
from conductor.core.errors import ConductorError, InvalidInput
from conductor.core.policies import check_policy, policy_config_defaults
from conductor.core.types import Request
from conductor.sim.config import EngineConfig, SimConfig
from conductor.sim.pools import PoolShape
from conductor.workload.max_tokens import NO_MAX_TOKENS, MaxTokens
from conductor.workload.trace import (
    bundled_trace_path,
    generated_tokens,
    read_trace,
    records_to_requests,
)
from conductor.workload.trace_format import DEFAULT_BLOCK_SIZE_TOKENS, TraceRecord

DEFAULTS = SimConfig()
"""The defaults of every option that sets a :class:`SimConfig` field."""
DEFAULT_TBT_SLO_MS = DEFAULTS.scheduler.tbt_slo_s * 1e3
LOAD_SAMPLE_EVERY_S = 10.0
"""How often ``simulate --load-plot`` samples the load."""
REPLICA_SAMPLE_EVERY_S = 30.0
"""How often ``simulate --load-plot`` samples the replicas of popular blocks."""

FLAGS = {
    "policy": "--policy",
    "n_prefill": "--prefill",
    "n_decode": "--decode",
    "preset": "--preset",
    "ttft_slo_s": "--ttft-slo-s",
    "tbt_slo_s": "--tbt-slo-ms",
    "seed": "--seed",
    "admission": "--admission",
    "cache_capacity_tokens": "--cache-tokens",
    "kv_event_delay_s": "--kv-event-delay-s",
    "n_both": "--both",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_num_seqs": "--max-num-seqs",
    "block_size_tokens": "--kv-block-tokens",  # the engines' (the scheduler's is no flag)
    "long_prefill_token_threshold": "--long-prefill-tokens",
    "max_tokens": "--max-tokens",
    "cost_error": "--cost-error",
    "cost_bias": "--cost-bias",
    "replicas": "--replicas",
    "sync_delay_s": "--sync-delay-ms",
    "handoff": "--handoff",
    "first_token": "--first-token",
    "decode_cache": "--decode-cache",
    "kv_fetch": "--kv-fetch",
    "prefill_lanes": "--prefill-lanes",
}
"""Config field -> the option that sets it."""

TraceOpt = Annotated[
    Path | None, typer.Option("--trace", help="Mooncake JSONL trace (default: bundled)")
]
PrefillOpt = Annotated[int, typer.Option("--prefill", help="prefill instances")]
DecodeOpt = Annotated[int, typer.Option("--decode", help="decode instances")]
PresetOpt = Annotated[
    str, typer.Option("--preset", help=f"cost model preset: {', '.join(sorted(PRESETS))}")
]
TtftOpt = Annotated[float, typer.Option("--ttft-slo-s", help="TTFT SLO in seconds")]
TbtOpt = Annotated[float, typer.Option("--tbt-slo-ms", help="TBT SLO in milliseconds")]
SpeedOpt = Annotated[float, typer.Option("--speed", help="replay speed (2 = twice the rate)")]
LimitOpt = Annotated[int | None, typer.Option("--limit", help="use only the first N requests")]
SeedOpt = Annotated[int, typer.Option("--seed", help="random seed")]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="write results as JSON here")]
AdmissionOpt = Annotated[
    str | None,
    typer.Option(
        "--admission",
        help="off|baseline|early|reserve|predictive (default: the policy's own; off for baselines)",
    ),
]
ReplOpt = Annotated[
    bool,
    typer.Option("--replication/--no-replication", help="background hot-spot replication"),
]
CppOpt = Annotated[
    bool | None,
    typer.Option("--cpp/--no-cpp", help="chunked pipeline parallel prefill (default: policy's)"),
]
SkipOpt = Annotated[
    bool, typer.Option("--skip-invalid", help="skip malformed trace lines and count them")
]
CacheOpt = Annotated[
    int | None,
    typer.Option("--cache-tokens", help="KV cache per prefill instance in tokens (default 3M)"),
]
UnboundedOpt = Annotated[
    bool, typer.Option("--unbounded-cache", help="prefill caches without capacity limit")
]
BothOpt = Annotated[int, typer.Option("--both", help="instances that prefill and decode")]
BatchTokensOpt = Annotated[
    int,
    typer.Option("--max-num-batched-tokens", help="engines' token budget per step (vLLM's)"),
]
SeqsOpt = Annotated[
    int | None,
    typer.Option("--max-num-seqs", help="engines' most running requests (default: preset's)"),
]
KvBlockOpt = Annotated[
    int, typer.Option("--kv-block-tokens", help="engines' KV allocation block, in tokens")
]
LongPrefillOpt = Annotated[
    int,
    typer.Option("--long-prefill-tokens", help="most tokens one prefill takes per step (0: all)"),
]
MaxTokensOpt = Annotated[
    str,
    typer.Option(
        "--max-tokens",
        help="what requests send as max_tokens: none (cap = model context), trace (the true"
        " length), cap:N (N; the engine generates min(trace, N))",
    ),
]
OracleOpt = Annotated[
    bool,
    typer.Option(
        "--oracle-lengths",
        help="ablation: hand the scheduler every request's true output length",
    ),
]
BundleOpt = Annotated[
    bool,
    typer.Option(
        "--bundle/--no-bundle",
        help="add one labelled row per policy that brings its own admission/CPP bundle",
    ),
]
DelayOpt = Annotated[
    float, typer.Option("--kv-event-delay-s", help="delay of KV events to the scheduler")
]

CostErrorOpt = Annotated[
    float,
    typer.Option(
        "--cost-error",
        help="engines' per-job lognormal deviation from the cost model (sigma, mean-preserving)",
    ),
]
CostBiasOpt = Annotated[
    float,
    typer.Option("--cost-bias", help="engines (1 + B)x the cost model (0.3 = 30% slower)"),
]
CorrectionOpt = Annotated[
    bool,
    typer.Option(
        "--correction/--no-correction", help="correct the cost model online from engine timings"
    ),
]
ReplicasOpt = Annotated[
    int, typer.Option("--replicas", help="scheduler replicas the arrivals are spread over")
]
SyncDelayOpt = Annotated[
    float,
    typer.Option("--sync-delay-ms", help="how late replicas see each other's reservations"),
]
HandoffOpt = Annotated[
    str,
    typer.Option(
        "--handoff",
        help="how the P->D KV hand-off runs: stream (over the NICs, layer by layer during the"
        " prefill, as Mooncake), serial (over the NICs, after the prefill) or load (the decode"
        " engine reads it inside the step that admits the request, as vLLM's ExampleConnector)",
    ),
]
FirstTokenOpt = Annotated[
    str,
    typer.Option(
        "--first-token",
        help="which engine gives a P/D request's first token: prefill (Mooncake) or decode"
        " (vLLM's P/D proxy and conductor serve: TTFT holds the hand-off)",
    ),
]
DecodeCacheOpt = Annotated[
    bool,
    typer.Option(
        "--decode-cache/--no-decode-cache",
        help="decode engines keep finished prompts' KV cached in their free blocks and publish"
        " it (vLLM's prefix caching): a hand-off carries only what the engine lacks",
    ),
]
KvFetchOpt = Annotated[
    bool,
    typer.Option(
        "--kv-fetch/--no-kv-fetch",
        help="prefill instances can pull a prefix cached on another one (Mooncake Store);"
        " --no-kv-fetch: each reuses its own cache only, as behind conductor serve",
    ),
]
PoolOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--pool",
        metavar="MODEL=SHAPE",
        help="MODEL=SHAPE, e.g. a=4P+4D or b=2P+2D+1B (P prefill, D decode, B both): the pool"
        " of instances of one model of the trace (records without a model: 'default'), repeated"
        " for each (default with several models: --prefill/--decode/--both split equally over"
        " the models, by name)",
    ),
]


def fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def parse_max_tokens(text: str) -> MaxTokens:
    """``--max-tokens``'s value, or exit with an error naming the flag and the value."""
    try:
        return MaxTokens.parse(text)
    except InvalidInput as exc:
        raise config_error(exc, FLAGS) from None


def load_requests(
    trace: Path | None,
    limit: int | None,
    speed: float,
    skip_invalid: bool,
    max_tokens: MaxTokens = NO_MAX_TOKENS,
    block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS,
) -> tuple[list[Request], list[int]]:
    """The trace's requests (with ``max_tokens`` as ``--max-tokens`` says) and the number
    of tokens each will really generate (the simulator's ground truth)."""
    path, records = load_records(trace, limit, speed, skip_invalid, block_size_tokens)
    return to_requests(path, records, speed, max_tokens, block_size_tokens)


def load_records(
    trace: Path | None,
    limit: int | None,
    speed: float,
    skip_invalid: bool,
    block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS,
) -> tuple[Path, list[TraceRecord]]:
    """The trace file read (``--trace``, default the bundled trace) and its valid records;
    a bad option, file or line exits with an error naming it (``speed`` is only checked)."""
    if speed <= 0:
        raise typer.BadParameter(f"must be > 0, got {speed}", param_hint="--speed")
    if limit is not None and limit <= 0:
        raise typer.BadParameter(f"must be > 0, got {limit}", param_hint="--limit")
    path = trace if trace is not None else bundled_trace_path()
    if not path.exists():
        raise typer.BadParameter(f"no such file: {path}", param_hint="--trace")
    try:
        result = read_trace(
            path, limit=limit, skip_invalid=skip_invalid, block_size_tokens=block_size_tokens
        )
    except ConductorError as exc:
        raise fail(f"{path}: {exc}") from None
    if result.skipped:
        typer.echo(f"skipped {len(result.skipped)} invalid line(s)", err=True)
    if not result.records:
        raise fail(f"trace {path} has no valid requests")
    return path, result.records


def to_requests(
    path: Path,
    records: list[TraceRecord],
    speed: float,
    max_tokens: MaxTokens,
    block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS,
) -> tuple[list[Request], list[int]]:
    """``records`` (read from ``path``) as requests ``r0, r1, ...`` and what each generates."""
    try:
        requests = records_to_requests(
            records, speed=speed, max_tokens=max_tokens, block_size_tokens=block_size_tokens
        )
    except ConductorError as exc:
        raise fail(f"{path}: {exc}") from None
    return requests, generated_tokens(records, max_tokens)


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    """The cluster, SLO and scheduler options ``simulate``, ``compare`` and ``capacity``
    share (as given on the command line; None: the policy's own, then the config's)."""

    prefill: int
    decode: int
    preset_name: str
    ttft_slo_s: float
    tbt_slo_ms: float
    seed: int
    admission: str | None = None
    cpp: bool | None = None
    replication: bool = DEFAULTS.scheduler.replication_enabled
    cache_tokens: int | None = None
    unbounded: bool = False
    kv_event_delay_s: float = DEFAULTS.kv_event_delay_s
    both: int = DEFAULTS.n_both
    max_num_batched_tokens: int = DEFAULTS.engine.max_num_batched_tokens
    max_num_seqs: int | None = DEFAULTS.engine.max_num_seqs
    kv_block_tokens: int = DEFAULTS.engine.block_size_tokens
    long_prefill_tokens: int = DEFAULTS.engine.long_prefill_token_threshold
    oracle_lengths: bool = DEFAULTS.oracle_lengths
    cost_error: float = DEFAULTS.cost_error
    cost_bias: float = DEFAULTS.cost_bias
    correction: bool = DEFAULTS.scheduler.cost_correction
    cost: CostModel | None = None
    """From ``--cost-file``; None: the preset ``preset_name``."""
    replicas: int = DEFAULTS.replicas
    sync_delay_ms: float = DEFAULTS.sync_delay_s * 1e3
    pools: tuple[tuple[str, PoolShape], ...] = ()
    """From ``--pool``: each model's pool, in the order given (empty: none given)."""
    handoff: str = DEFAULTS.handoff
    first_token: str = DEFAULTS.first_token
    decode_cache: bool = DEFAULTS.decode_cache
    kv_fetch: bool = DEFAULTS.kv_fetch
    prefill_lanes: str = str(DEFAULTS.prefill_lanes)
    """``--prefill-lanes``: a count, or ``engine`` (the engines' own)."""


def build_config(
    o: ClusterOptions, policy: str, *, load_plot: bool = False, policy_flag: str = "--policy"
) -> SimConfig:
    """The simulated cluster; settings left as None take the policy's own defaults
    (``conductor`` brings admission and CPP), then the config's. A bad value exits with an
    error naming its option (``policy_flag`` for the policy)."""
    try:
        return _config(o, policy, load_plot)
    except InvalidInput as exc:
        flags = {**FLAGS, "policy": policy_flag}
        shown = {"tbt_slo_s": o.tbt_slo_ms, "sync_delay_s": o.sync_delay_ms}
        raise config_error(exc, flags, shown) from None


def _config(o: ClusterOptions, policy: str, load_plot: bool) -> SimConfig:
    defaults = policy_config_defaults(check_policy(policy))
    sched = SchedulerConfig(
        ttft_slo_s=o.ttft_slo_s,
        tbt_slo_s=o.tbt_slo_ms / 1e3,
        admission=o.admission or str(defaults.get("admission", DEFAULTS.scheduler.admission)),
        cpp_enabled=bool(defaults.get("cpp_enabled", DEFAULTS.scheduler.cpp_enabled))
        if o.cpp is None
        else o.cpp,
        replication_enabled=o.replication,
        cost_correction=o.correction,
        seed=o.seed,
        first_token=o.first_token,
        handoff=o.handoff,
    )
    engine = EngineConfig(
        max_num_batched_tokens=o.max_num_batched_tokens,
        max_num_seqs=o.max_num_seqs,
        block_size_tokens=o.kv_block_tokens,
        long_prefill_token_threshold=o.long_prefill_tokens,
    )
    lanes = o.prefill_lanes.strip()
    if lanes != "engine" and not lanes.isdigit():
        raise InvalidInput("prefill_lanes", o.prefill_lanes, "must be a count >= 1 or 'engine'")
    return SimConfig(
        policy=policy,
        n_prefill=o.prefill,
        n_decode=o.decode,
        n_both=o.both,
        engine=engine,
        cost=o.cost if o.cost is not None else preset(o.preset_name),
        scheduler=sched,
        cache_capacity_tokens=None
        if o.unbounded
        else (o.cache_tokens or DEFAULTS.cache_capacity_tokens),
        kv_event_delay_s=o.kv_event_delay_s,
        cost_error=o.cost_error,
        cost_bias=o.cost_bias,
        replicas=o.replicas,
        sync_delay_s=o.sync_delay_ms / 1e3,
        handoff=o.handoff,
        first_token=o.first_token,
        decode_cache=o.decode_cache,
        kv_fetch=o.kv_fetch,
        seed=o.seed,
        oracle_lengths=o.oracle_lengths,
        load_sample_every_s=LOAD_SAMPLE_EVERY_S if load_plot else 0.0,
        replica_sample_every_s=REPLICA_SAMPLE_EVERY_S if load_plot else 0.0,
        prefill_lanes=engine.lanes() if lanes == "engine" else int(lanes),
    )
