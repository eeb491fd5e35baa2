"""``conductor simulate | compare | capacity``: trace replay through the simulated cluster."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import typer

from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import DEFAULT_PRESET, PRESETS, preset
from conductor.core.errors import ConductorError
from conductor.core.policies import policy_config_defaults, policy_names
from conductor.core.types import Request
from conductor.sim.capacity import find_capacity
from conductor.sim.config import SimConfig
from conductor.sim.report import (
    markdown_table,
    plot_comparison,
    plot_load,
    table_rows,
    to_json,
    write_json,
)
from conductor.sim.simulator import Progress, SimResult, simulate
from conductor.workload.trace import bundled_trace_path, read_trace, records_to_requests

PAPER_POLICIES = ("random", "least_loaded", "cache_aware_local", "mooncake")
PEER_POLICIES = ("round_robin", "weighted", "dynamo", "sglang", "lmetric", "llmd", "preble")


def default_policy() -> str:
    return "conductor" if "conductor" in policy_names() else "mooncake"


def default_compare_policies() -> list[str]:
    names = set(policy_names())
    order = [*PAPER_POLICIES, *PEER_POLICIES, "conductor"]
    return [p for p in order if p in names]


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
        help="off|baseline|early|predictive (default: the policy's own; off for baselines)",
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
DelayOpt = Annotated[
    float, typer.Option("--kv-event-delay-s", help="delay of KV events to the scheduler")
]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _check_policy(name: str, option: str = "--policy") -> None:
    if name not in policy_names():
        raise typer.BadParameter(
            f"unknown policy {name!r}; known: {', '.join(sorted(policy_names()))}",
            param_hint=option,
        )


def load_requests(
    trace: Path | None, limit: int | None, speed: float, skip_invalid: bool
) -> list[Request]:
    if speed <= 0:
        raise typer.BadParameter(f"must be > 0, got {speed}", param_hint="--speed")
    if limit is not None and limit <= 0:
        raise typer.BadParameter(f"must be > 0, got {limit}", param_hint="--limit")
    path = trace if trace is not None else bundled_trace_path()
    if not path.exists():
        raise typer.BadParameter(f"no such file: {path}", param_hint="--trace")
    try:
        result = read_trace(path, limit=limit, skip_invalid=skip_invalid)
        if result.skipped:
            typer.echo(f"skipped {len(result.skipped)} invalid line(s)", err=True)
        if not result.records:
            raise _fail(f"trace {path} has no valid requests")
        return records_to_requests(result.records, speed=speed)
    except ConductorError as exc:
        raise _fail(f"{path}: {exc}") from None


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    """The cluster, SLO and scheduler options ``simulate``, ``compare`` and ``capacity``
    share (as given on the command line)."""

    prefill: int
    decode: int
    preset_name: str
    ttft_slo_s: float
    tbt_slo_ms: float
    seed: int
    admission: str | None = None
    cpp: bool | None = None
    replication: bool = False
    cache_tokens: int | None = None
    unbounded: bool = False
    kv_event_delay_s: float = 0.0


def build_config(o: ClusterOptions, policy: str, *, sample_every_s: float = 0.0) -> SimConfig:
    """The simulated cluster; settings left as None take the policy's own defaults
    (``conductor`` brings admission and CPP), then the global ones."""
    try:
        cost = preset(o.preset_name)
    except ConductorError as exc:
        raise typer.BadParameter(str(exc), param_hint="--preset") from None
    for value, hint in ((o.prefill, "--prefill"), (o.decode, "--decode")):
        if value <= 0:
            raise typer.BadParameter(f"must be >= 1, got {value}", param_hint=hint)
    defaults = policy_config_defaults(policy)
    try:
        sched = SchedulerConfig(
            ttft_slo_s=o.ttft_slo_s,
            tbt_slo_s=o.tbt_slo_ms / 1e3,
            admission=o.admission or str(defaults.get("admission", "off")),
            cpp_enabled=bool(defaults.get("cpp_enabled", False)) if o.cpp is None else o.cpp,
            replication_enabled=o.replication,
            seed=o.seed,
        )
        return SimConfig(
            policy=policy,
            n_prefill=o.prefill,
            n_decode=o.decode,
            cost=cost,
            scheduler=sched,
            cache_capacity_tokens=None if o.unbounded else (o.cache_tokens or 3_000_000),
            kv_event_delay_s=o.kv_event_delay_s,
            seed=o.seed,
            load_sample_every_s=sample_every_s,
            replica_sample_every_s=30.0 if sample_every_s > 0 else 0.0,
        )
    except ConductorError as exc:
        raise _fail(str(exc)) from None


@contextmanager
def progress_bar(label: str, enabled: bool) -> Iterator[Progress | None]:
    if not enabled:
        yield None
        return
    from rich.progress import Progress as RichProgress

    with RichProgress(transient=True) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def _run(requests: list[Request], cfg: SimConfig) -> SimResult:
    with progress_bar(f"simulating {cfg.policy}", sys.stderr.isatty()) as cb:
        return simulate(requests, cfg, progress=cb)


def print_table(results: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    head, rows = table_rows(results)
    table = Table(*head)
    for r in rows:
        table.add_row(*r)
    Console(width=200).print(table)


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    def simulate_cmd(
        trace: TraceOpt = None,
        policy: Annotated[str | None, typer.Option("--policy", help="scheduling policy")] = None,
        prefill: PrefillOpt = 8,
        decode: DecodeOpt = 8,
        preset_name: PresetOpt = DEFAULT_PRESET,
        ttft_slo_s: TtftOpt = 30.0,
        tbt_slo_ms: TbtOpt = 100.0,
        speed: SpeedOpt = 1.0,
        limit: LimitOpt = None,
        seed: SeedOpt = 0,
        json_path: JsonOpt = None,
        admission: AdmissionOpt = None,
        cpp: CppOpt = None,
        replication: ReplOpt = False,
        skip_invalid: SkipOpt = False,
        cache_tokens: CacheOpt = None,
        unbounded_cache: UnboundedOpt = False,
        kv_event_delay_s: DelayOpt = 0.0,
        load_plot: Annotated[
            Path | None,
            typer.Option("--load-plot", help="PNG of prefill/decode load and replicas over time"),
        ] = None,
    ) -> None:
        """Replay a trace through a simulated P/D cluster with one policy."""
        name = policy or default_policy()
        _check_policy(name)
        requests = load_requests(trace, limit, speed, skip_invalid)
        options = ClusterOptions(
            prefill, decode, preset_name, ttft_slo_s, tbt_slo_ms, seed, admission, cpp,
            replication, cache_tokens, unbounded_cache, kv_event_delay_s,
        )  # fmt: skip
        cfg = build_config(options, name, sample_every_s=10.0 if load_plot is not None else 0.0)
        res = _run(requests, cfg)
        print_table([res.summary])
        _print_extras(res.summary)
        if json_path is not None:
            write_json(json_path, res.summary)
        if load_plot is not None:
            plot_load(res, load_plot)
            typer.echo(f"plot written to {load_plot}")

    @app.command("compare")
    def compare_cmd(
        trace: TraceOpt = None,
        policies: Annotated[
            str | None, typer.Option("--policies", help="comma-separated policy names")
        ] = None,
        prefill: PrefillOpt = 8,
        decode: DecodeOpt = 8,
        preset_name: PresetOpt = DEFAULT_PRESET,
        ttft_slo_s: TtftOpt = 30.0,
        tbt_slo_ms: TbtOpt = 100.0,
        speed: SpeedOpt = 1.0,
        limit: LimitOpt = None,
        seed: SeedOpt = 0,
        json_path: JsonOpt = None,
        plot: Annotated[Path | None, typer.Option("--plot", help="write a PNG here")] = None,
        markdown: Annotated[
            Path | None, typer.Option("--markdown", help="write the table as Markdown here")
        ] = None,
        admission: AdmissionOpt = None,
        admissions: Annotated[
            str | None,
            typer.Option("--admissions", help="run each policy under each of these modes"),
        ] = None,
        cpp: CppOpt = None,
        replication: ReplOpt = False,
        skip_invalid: SkipOpt = False,
        cache_tokens: CacheOpt = None,
        unbounded_cache: UnboundedOpt = False,
        kv_event_delay_s: DelayOpt = 0.0,
    ) -> None:
        """Run several policies on identical input and print one table."""
        names = (
            [p.strip() for p in policies.split(",") if p.strip()]
            if policies
            else default_compare_policies()
        )
        if not names:
            raise typer.BadParameter("no policy given", param_hint="--policies")
        for n in names:
            _check_policy(n, "--policies")
        requests = load_requests(trace, limit, speed, skip_invalid)
        modes: list[str | None] = (
            [m.strip() for m in admissions.split(",") if m.strip()] if admissions else [admission]
        )
        options = ClusterOptions(
            prefill, decode, preset_name, ttft_slo_s, tbt_slo_ms, seed, admission, cpp,
            replication, cache_tokens, unbounded_cache, kv_event_delay_s,
        )  # fmt: skip
        results: list[SimResult] = []
        for name, mode in [(n, m) for n in names for m in modes]:
            cfg = build_config(replace(options, admission=mode), name)
            results.append(_run(requests, cfg))
        summaries = [r.summary for r in results]
        print_table(summaries)
        if json_path is not None:
            write_json(json_path, summaries)
        if markdown is not None:
            markdown.write_text(markdown_table(summaries))
        if plot is not None:
            plot_comparison(results, plot, ttft_slo_s=ttft_slo_s, tbt_slo_ms=tbt_slo_ms)
            typer.echo(f"plot written to {plot}")

    @app.command("capacity")
    def capacity_cmd(
        trace: TraceOpt = None,
        policies: Annotated[
            str | None, typer.Option("--policies", help="comma-separated policy names")
        ] = None,
        tbt_slos_ms: Annotated[
            str, typer.Option("--tbt-slos-ms", help="TBT thresholds to test, comma-separated")
        ] = "100,200,300",
        prefill: PrefillOpt = 8,
        decode: DecodeOpt = 8,
        preset_name: PresetOpt = DEFAULT_PRESET,
        ttft_slo_s: TtftOpt = 30.0,
        target: Annotated[float, typer.Option("--target", help="SLO attainment to sustain")] = 0.9,
        limit: LimitOpt = None,
        seed: SeedOpt = 0,
        json_path: JsonOpt = None,
        admission: AdmissionOpt = None,
        cpp: CppOpt = None,
        skip_invalid: SkipOpt = False,
        bisect_steps: Annotated[int, typer.Option("--bisect-steps")] = 4,
    ) -> None:
        """Largest replay speed per policy whose SLO attainment stays >= target."""
        names = (
            [p.strip() for p in policies.split(",") if p.strip()]
            if policies
            else default_compare_policies()
        )
        for n in names:
            _check_policy(n, "--policies")
        try:
            thresholds = [float(x) for x in tbt_slos_ms.split(",") if x.strip()]
        except ValueError:
            raise typer.BadParameter(
                f"not a list of numbers: {tbt_slos_ms!r}", param_hint="--tbt-slos-ms"
            ) from None
        if not thresholds or any(t <= 0 for t in thresholds):
            raise typer.BadParameter(f"must be > 0: {tbt_slos_ms!r}", param_hint="--tbt-slos-ms")
        if not 0 < target <= 1:
            raise typer.BadParameter(f"must be in (0, 1], got {target}", param_hint="--target")
        requests = load_requests(trace, limit, 1.0, skip_invalid)
        options = ClusterOptions(
            prefill, decode, preset_name, ttft_slo_s, thresholds[0], seed, admission, cpp
        )
        out: list[dict[str, Any]] = []
        for name in names:
            row: dict[str, Any] = {"policy": name}
            for tbt in thresholds:
                cfg = build_config(replace(options, tbt_slo_ms=tbt), name)
                point = find_capacity(requests, cfg, target=target, bisect_steps=bisect_steps)
                row[f"tbt_{tbt:g}ms"] = {
                    "speed": round(point.speed, 4),
                    "rps": round(point.speed * len(requests) / _span(requests), 4),
                    "attainment": point.attainment,
                    "tested": [[s, a] for s, a in point.tested],
                }
                typer.echo(f"{name:>18s} TBT {tbt:g} ms: capacity x{point.speed:.3f}", err=True)
            out.append(row)
        _print_capacity(out, thresholds)
        if json_path is not None:
            write_json(json_path, out)


def _print_extras(summary: dict[str, Any]) -> None:
    by = summary["ttft_by_prompt_s"]
    parts = [
        f"{k}: {v['mean']:.2f}s" if v["mean"] is not None else f"{k}: -" for k, v in by.items()
    ]
    typer.echo(
        f"mean TTFT by prompt length: {', '.join(parts)}; CPP requests: {summary['cpp_requests']};"
        f" wasted prefill: {summary['wasted_prefill_s']:.0f}s"
    )


def _span(requests: list[Request]) -> float:
    span = requests[-1].arrival_s - requests[0].arrival_s
    return span if span > 0 else 1.0


def _print_capacity(rows: list[dict[str, Any]], thresholds: list[float]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("policy", *[f"TBT {t:g} ms: speed (req/s)" for t in thresholds])
    for row in rows:
        cells = []
        for t in thresholds:
            c = row[f"tbt_{t:g}ms"]
            cells.append(f"x{c['speed']:.3f} ({c['rps']:.2f})")
        table.add_row(row["policy"], *cells)
    Console(width=200).print(table)


__all__ = ["register", "to_json"]
