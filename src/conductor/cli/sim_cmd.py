"""``conductor simulate | compare | capacity``: trace replay through the simulated cluster."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from conductor.cli.cost_source import CostFileOpt, cost_from_options
from conductor.cli.fields import config_error
from conductor.cli.sim_options import (
    DEFAULT_TBT_SLO_MS,
    DEFAULTS,
    AdmissionOpt,
    BatchTokensOpt,
    BothOpt,
    BundleOpt,
    CacheOpt,
    ClusterOptions,
    CorrectionOpt,
    CostBiasOpt,
    CostErrorOpt,
    CppOpt,
    DecodeOpt,
    DelayOpt,
    JsonOpt,
    KvBlockOpt,
    LimitOpt,
    LongPrefillOpt,
    MaxTokensOpt,
    OracleOpt,
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
    build_config,
    footing,
    load_requests,
    parse_max_tokens,
    print_extras,
)
from conductor.core.costmodel import DEFAULT_PRESET
from conductor.core.errors import InvalidInput
from conductor.core.policies import check_policy, policy_names
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

PAPER_POLICIES = ("random", "least_loaded", "cache_aware_local", "mooncake")
PEER_POLICIES = ("round_robin", "weighted", "dynamo", "sglang", "lmetric", "llmd", "preble")


def default_compare_policies() -> list[str]:
    names = set(policy_names())
    order = [*PAPER_POLICIES, *PEER_POLICIES, "conductor"]
    return [p for p in order if p in names]


def _check_policies(names: list[str], flag: str) -> None:
    for name in names:
        try:
            check_policy(name)
        except InvalidInput as exc:
            raise config_error(exc, {"policy": flag}) from None


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


def _run(requests: list[Request], outputs: list[int], cfg: SimConfig) -> SimResult:
    with progress_bar(f"simulating {cfg.policy}", sys.stderr.isatty()) as cb:
        return simulate(requests, cfg, outputs=outputs, progress=cb)


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
        ctx: typer.Context,
        trace: TraceOpt = None,
        policy: Annotated[str | None, typer.Option("--policy", help="scheduling policy")] = None,
        prefill: PrefillOpt = DEFAULTS.n_prefill,
        decode: DecodeOpt = DEFAULTS.n_decode,
        preset_name: PresetOpt = DEFAULT_PRESET,
        cost_file: CostFileOpt = None,
        ttft_slo_s: TtftOpt = DEFAULTS.scheduler.ttft_slo_s,
        tbt_slo_ms: TbtOpt = DEFAULT_TBT_SLO_MS,
        speed: SpeedOpt = 1.0,
        limit: LimitOpt = None,
        seed: SeedOpt = DEFAULTS.seed,
        json_path: JsonOpt = None,
        admission: AdmissionOpt = None,
        cpp: CppOpt = None,
        replication: ReplOpt = DEFAULTS.scheduler.replication_enabled,
        skip_invalid: SkipOpt = False,
        cache_tokens: CacheOpt = None,
        unbounded_cache: UnboundedOpt = False,
        kv_event_delay_s: DelayOpt = DEFAULTS.kv_event_delay_s,
        both: BothOpt = DEFAULTS.n_both,
        max_num_batched_tokens: BatchTokensOpt = DEFAULTS.engine.max_num_batched_tokens,
        max_num_seqs: SeqsOpt = DEFAULTS.engine.max_num_seqs,
        kv_block_tokens: KvBlockOpt = DEFAULTS.engine.block_size_tokens,
        long_prefill_tokens: LongPrefillOpt = DEFAULTS.engine.long_prefill_token_threshold,
        max_tokens: MaxTokensOpt = "none",
        oracle_lengths: OracleOpt = DEFAULTS.oracle_lengths,
        cost_error: CostErrorOpt = DEFAULTS.cost_error,
        cost_bias: CostBiasOpt = DEFAULTS.cost_bias,
        correction: CorrectionOpt = DEFAULTS.scheduler.cost_correction,
        replicas: ReplicasOpt = DEFAULTS.replicas,
        sync_delay_ms: SyncDelayOpt = DEFAULTS.sync_delay_s * 1e3,
        load_plot: Annotated[
            Path | None,
            typer.Option("--load-plot", help="PNG of prefill/decode load and replicas over time"),
        ] = None,
    ) -> None:
        """Replay a trace through a simulated P/D cluster with one policy."""
        name = policy or DEFAULTS.policy
        _check_policies([name], "--policy")
        mt = parse_max_tokens(max_tokens)
        requests, outputs = load_requests(trace, limit, speed, skip_invalid, mt)
        options = ClusterOptions(
            prefill, decode, preset_name, ttft_slo_s, tbt_slo_ms, seed, admission, cpp,
            replication, cache_tokens, unbounded_cache, kv_event_delay_s,
            oracle_lengths=oracle_lengths, both=both,
            max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
            kv_block_tokens=kv_block_tokens, long_prefill_tokens=long_prefill_tokens,
            cost_error=cost_error, cost_bias=cost_bias, correction=correction,
            replicas=replicas, sync_delay_ms=sync_delay_ms,
            cost=cost_from_options(ctx, cost_file),
        )  # fmt: skip
        cfg = build_config(options, name, load_plot=load_plot is not None)
        res = _run(requests, outputs, cfg)
        res.summary["max_tokens"] = str(mt)
        print_table([res.summary])
        print_extras(res.summary)
        if json_path is not None:
            write_json(json_path, res.summary)
        if load_plot is not None:
            plot_load(res, load_plot)
            typer.echo(f"plot written to {load_plot}")

    @app.command("compare")
    def compare_cmd(
        ctx: typer.Context,
        trace: TraceOpt = None,
        policies: Annotated[
            str | None, typer.Option("--policies", help="comma-separated policy names")
        ] = None,
        prefill: PrefillOpt = DEFAULTS.n_prefill,
        decode: DecodeOpt = DEFAULTS.n_decode,
        preset_name: PresetOpt = DEFAULT_PRESET,
        cost_file: CostFileOpt = None,
        ttft_slo_s: TtftOpt = DEFAULTS.scheduler.ttft_slo_s,
        tbt_slo_ms: TbtOpt = DEFAULT_TBT_SLO_MS,
        speed: SpeedOpt = 1.0,
        limit: LimitOpt = None,
        seed: SeedOpt = DEFAULTS.seed,
        json_path: JsonOpt = None,
        plot: Annotated[Path | None, typer.Option("--plot", help="write a PNG here")] = None,
        markdown: Annotated[
            Path | None, typer.Option("--markdown", help="write the table as Markdown here")
        ] = None,
        admission: Annotated[
            str | None,
            typer.Option(
                "--admission",
                help="off|baseline|early|reserve|predictive, the same for every policy"
                " (default: early)",
            ),
        ] = None,
        admissions: Annotated[
            str | None,
            typer.Option("--admissions", help="run each policy under each of these modes"),
        ] = None,
        cpp: CppOpt = None,
        replication: ReplOpt = DEFAULTS.scheduler.replication_enabled,
        skip_invalid: SkipOpt = False,
        cache_tokens: CacheOpt = None,
        unbounded_cache: UnboundedOpt = False,
        kv_event_delay_s: DelayOpt = DEFAULTS.kv_event_delay_s,
        both: BothOpt = DEFAULTS.n_both,
        max_num_batched_tokens: BatchTokensOpt = DEFAULTS.engine.max_num_batched_tokens,
        max_num_seqs: SeqsOpt = DEFAULTS.engine.max_num_seqs,
        kv_block_tokens: KvBlockOpt = DEFAULTS.engine.block_size_tokens,
        long_prefill_tokens: LongPrefillOpt = DEFAULTS.engine.long_prefill_token_threshold,
        max_tokens: MaxTokensOpt = "none",
        oracle_lengths: OracleOpt = DEFAULTS.oracle_lengths,
        bundle: BundleOpt = True,
        cost_error: CostErrorOpt = DEFAULTS.cost_error,
        cost_bias: CostBiasOpt = DEFAULTS.cost_bias,
        correction: CorrectionOpt = DEFAULTS.scheduler.cost_correction,
    ) -> None:
        """Run several policies on identical input, all under one admission mode and one
        CPP setting, and print one table (plus a row per policy that brings its own
        bundle, labelled)."""
        names = (
            [p.strip() for p in policies.split(",") if p.strip()]
            if policies
            else default_compare_policies()
        )
        if not names:
            raise typer.BadParameter("no policy given", param_hint="--policies")
        _check_policies(names, "--policies")
        mt = parse_max_tokens(max_tokens)
        requests, outputs = load_requests(trace, limit, speed, skip_invalid, mt)
        modes: list[str | None] = (
            [m.strip() for m in admissions.split(",") if m.strip()] if admissions else [admission]
        )
        options = ClusterOptions(
            prefill, decode, preset_name, ttft_slo_s, tbt_slo_ms, seed, admission, cpp,
            replication, cache_tokens, unbounded_cache, kv_event_delay_s,
            oracle_lengths=oracle_lengths, both=both,
            max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
            kv_block_tokens=kv_block_tokens, long_prefill_tokens=long_prefill_tokens,
            cost_error=cost_error, cost_bias=cost_bias, correction=correction,
            cost=cost_from_options(ctx, cost_file),
        )  # fmt: skip
        results: list[SimResult] = []
        for row in footing(names, modes, cpp, bundle=bundle):
            o = replace(options, admission=row.admission, cpp=row.cpp)
            cfg = build_config(o, row.policy, policy_flag="--policies")
            res = _run(requests, outputs, cfg)
            res.summary["max_tokens"] = str(mt)
            res.summary["bundle"] = row.bundle
            results.append(res)
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
        ctx: typer.Context,
        trace: TraceOpt = None,
        policies: Annotated[
            str | None, typer.Option("--policies", help="comma-separated policy names")
        ] = None,
        tbt_slos_ms: Annotated[
            str, typer.Option("--tbt-slos-ms", help="TBT thresholds to test, comma-separated")
        ] = "100,200,300",
        prefill: PrefillOpt = DEFAULTS.n_prefill,
        decode: DecodeOpt = DEFAULTS.n_decode,
        preset_name: PresetOpt = DEFAULT_PRESET,
        cost_file: CostFileOpt = None,
        ttft_slo_s: TtftOpt = DEFAULTS.scheduler.ttft_slo_s,
        target: Annotated[float, typer.Option("--target", help="SLO attainment to sustain")] = 0.9,
        limit: LimitOpt = None,
        seed: SeedOpt = DEFAULTS.seed,
        json_path: JsonOpt = None,
        admission: Annotated[
            str | None,
            typer.Option(
                "--admission",
                help="off|baseline|early|reserve|predictive, the same for every policy"
                " (default: early)",
            ),
        ] = None,
        cpp: CppOpt = None,
        skip_invalid: SkipOpt = False,
        bisect_steps: Annotated[int, typer.Option("--bisect-steps")] = 4,
        both: BothOpt = DEFAULTS.n_both,
        max_num_batched_tokens: BatchTokensOpt = DEFAULTS.engine.max_num_batched_tokens,
        max_num_seqs: SeqsOpt = DEFAULTS.engine.max_num_seqs,
        kv_block_tokens: KvBlockOpt = DEFAULTS.engine.block_size_tokens,
        long_prefill_tokens: LongPrefillOpt = DEFAULTS.engine.long_prefill_token_threshold,
        max_tokens: MaxTokensOpt = "none",
        oracle_lengths: OracleOpt = DEFAULTS.oracle_lengths,
        bundle: BundleOpt = True,
        cost_error: CostErrorOpt = DEFAULTS.cost_error,
        cost_bias: CostBiasOpt = DEFAULTS.cost_bias,
        correction: CorrectionOpt = DEFAULTS.scheduler.cost_correction,
    ) -> None:
        """Largest replay speed per policy whose SLO attainment stays >= target, every
        policy under one admission mode and one CPP setting (plus bundle rows)."""
        names = (
            [p.strip() for p in policies.split(",") if p.strip()]
            if policies
            else default_compare_policies()
        )
        _check_policies(names, "--policies")
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
        mt = parse_max_tokens(max_tokens)
        requests, outputs = load_requests(trace, limit, 1.0, skip_invalid, mt)
        options = ClusterOptions(
            prefill, decode, preset_name, ttft_slo_s, thresholds[0], seed, admission, cpp,
            oracle_lengths=oracle_lengths, both=both,
            max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
            kv_block_tokens=kv_block_tokens, long_prefill_tokens=long_prefill_tokens,
            cost_error=cost_error, cost_bias=cost_bias, correction=correction,
            cost=cost_from_options(ctx, cost_file),
        )  # fmt: skip
        out: list[dict[str, Any]] = []
        for line in footing(names, [admission], cpp, bundle=bundle):
            name = line.policy
            o = replace(options, admission=line.admission, cpp=line.cpp)
            row: dict[str, Any] = {"policy": name, "label": line.label}
            row.update(admission=line.admission, cpp=line.cpp, bundle=line.bundle)
            row["max_tokens"] = str(mt)
            for tbt in thresholds:
                cfg = build_config(replace(o, tbt_slo_ms=tbt), name, policy_flag="--policies")
                row["admission"] = cfg.scheduler.admission
                row["cpp"] = cfg.scheduler.cpp_enabled
                point = find_capacity(
                    requests, cfg, outputs=outputs, target=target, bisect_steps=bisect_steps
                )
                row[f"tbt_{tbt:g}ms"] = {
                    "speed": round(point.speed, 4),
                    "rps": round(point.speed * len(requests) / _span(requests), 4),
                    "attainment": point.attainment,
                    "tested": [[s, a] for s, a in point.tested],
                }
                typer.echo(f"{line.label} TBT {tbt:g} ms: capacity x{point.speed:.3f}", err=True)
            out.append(row)
        _print_capacity(out, thresholds)
        if json_path is not None:
            write_json(json_path, out)


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
        table.add_row(row["label"], *cells)
    Console(width=200).print(table)


__all__ = ["register", "to_json"]
