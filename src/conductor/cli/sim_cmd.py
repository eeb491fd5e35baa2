"""``conductor simulate | compare | capacity``: trace replay through the simulated cluster
(or, for a trace naming several models, one pool per model: docs/simulator.md)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from conductor.cli.fields import config_error
from conductor.cli.sim_inputs import TraceInput, Workload, make_pools, pools_for, shared_options
from conductor.cli.sim_options import (
    DEFAULTS,
    AdmissionOpt,
    BundleOpt,
    ClusterOptions,
    JsonOpt,
    build_config,
)
from conductor.cli.sim_rows import (
    footing,
    markdown_table,
    print_capacity,
    print_extras,
    print_table,
)
from conductor.core.errors import InvalidInput
from conductor.core.policies import check_policy, policy_names
from conductor.core.types import Request
from conductor.sim.capacity import CapacityPoint, find_capacity
from conductor.sim.config import SimConfig
from conductor.sim.pools import PoolShape, find_pools_capacity, simulate_pools
from conductor.sim.report import plot_comparison, plot_load, to_json, write_json
from conductor.sim.simulator import Progress, SimResult, simulate

PAPER_POLICIES = ("random", "least_loaded", "cache_aware_local", "mooncake")
PEER_POLICIES = ("round_robin", "weighted", "dynamo", "sglang", "lmetric", "llmd", "preble")

CompareAdmissionOpt = Annotated[
    str | None,
    typer.Option(
        "--admission",
        help="off|baseline|early|reserve|predictive, the same for every policy (default: early)",
    ),
]
PoliciesOpt = Annotated[str | None, typer.Option("--policies", help="comma-separated policy names")]
Shapes = dict[str, PoolShape] | None
"""Each model's pool, or None for one cluster (:func:`~conductor.cli.sim_inputs.pools_for`)."""


def default_compare_policies() -> list[str]:
    names = set(policy_names())
    order = [*PAPER_POLICIES, *PEER_POLICIES, "conductor"]
    return [p for p in order if p in names]


def _policy_list(policies: str | None) -> list[str]:
    names = (
        [p.strip() for p in policies.split(",") if p.strip()]
        if policies
        else default_compare_policies()
    )
    if not names:
        raise typer.BadParameter("no policy given", param_hint="--policies")
    _check_policies(names, "--policies")
    return names


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


def _run_policy(
    workload: Workload,
    shapes: Shapes,
    options: ClusterOptions,
    policy: str,
    *,
    policy_flag: str = "--policy",
    load_plot: bool = False,
) -> tuple[SimResult, dict[str, SimResult]]:
    """One run of ``policy``: the result (pooled: the totals, with ``per_model``) and each
    pool's own result (empty for one cluster). Every summary gets ``max_tokens``."""
    cfg = build_config(options, policy, load_plot=load_plot, policy_flag=policy_flag)
    if shapes is None:
        res, parts = _run(*workload.single(), cfg), {}
    else:
        pooled = simulate_pools(make_pools(workload, shapes, cfg))
        res, parts = pooled.total, pooled.pools
    _stamp(res, max_tokens=str(workload.max_tokens))
    return res, parts


def _stamp(res: SimResult, **fields: object) -> None:
    """Set ``fields`` in ``res``'s summary and in each of its ``per_model`` summaries."""
    res.summary.update(fields)
    per_model: Any = res.summary.get("per_model", {})
    for part in per_model.values():
        part.update(fields)


def _plot_path(path: Path, model: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model)
    return path.with_name(f"{path.stem}.{safe}{path.suffix}")


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    @shared_options()
    def simulate_cmd(
        options: ClusterOptions,
        source: TraceInput,
        policy: Annotated[str | None, typer.Option("--policy", help="scheduling policy")] = None,
        admission: AdmissionOpt = None,
        json_path: JsonOpt = None,
        load_plot: Annotated[
            Path | None,
            typer.Option(
                "--load-plot",
                help="PNG of prefill/decode load and replicas over time (several models:"
                " one per pool, NAME.MODEL.png)",
            ),
        ] = None,
    ) -> None:
        """Replay a trace through a simulated P/D cluster with one policy (one pool per
        model for a trace naming several)."""
        name = policy or DEFAULTS.policy
        _check_policies([name], "--policy")
        workload = source.load()
        shapes = pools_for(options, workload)
        o = replace(options, admission=admission)
        res, parts = _run_policy(workload, shapes, o, name, load_plot=load_plot is not None)
        print_table([res.summary])
        print_extras(res.summary)
        if json_path is not None:
            write_json(json_path, res.summary)
        if load_plot is not None:
            plots = {_plot_path(load_plot, m): r for m, r in parts.items()} or {load_plot: res}
            for path, result in plots.items():
                plot_load(result, path)
                typer.echo(f"plot written to {path}")

    @app.command("compare")
    @shared_options()
    def compare_cmd(
        options: ClusterOptions,
        source: TraceInput,
        policies: PoliciesOpt = None,
        admission: CompareAdmissionOpt = None,
        admissions: Annotated[
            str | None,
            typer.Option("--admissions", help="run each policy under each of these modes"),
        ] = None,
        bundle: BundleOpt = True,
        json_path: JsonOpt = None,
        plot: Annotated[Path | None, typer.Option("--plot", help="write a PNG here")] = None,
        markdown: Annotated[
            Path | None, typer.Option("--markdown", help="write the table as Markdown here")
        ] = None,
    ) -> None:
        """Run several policies on identical input, all under one admission mode and one
        CPP setting, and print one table (plus a row per policy that brings its own
        bundle, labelled; with several models, a row per model under each)."""
        names = _policy_list(policies)
        workload = source.load()
        shapes = pools_for(options, workload)
        modes: list[str | None] = (
            [m.strip() for m in admissions.split(",") if m.strip()] if admissions else [admission]
        )
        results: list[SimResult] = []
        for row in footing(names, modes, options.cpp, bundle=bundle):
            o = replace(options, admission=row.admission, cpp=row.cpp)
            res, _ = _run_policy(workload, shapes, o, row.policy, policy_flag="--policies")
            _stamp(res, bundle=row.bundle)
            results.append(res)
        summaries = [r.summary for r in results]
        print_table(summaries)
        if json_path is not None:
            write_json(json_path, summaries)
        if markdown is not None:
            markdown.write_text(markdown_table(summaries))
        if plot is not None:
            slos = {"ttft_slo_s": options.ttft_slo_s, "tbt_slo_ms": options.tbt_slo_ms}
            plot_comparison(results, plot, **slos)
            typer.echo(f"plot written to {plot}")

    @app.command("capacity")
    @shared_options(tbt=False, speed=False)
    def capacity_cmd(
        options: ClusterOptions,
        source: TraceInput,
        policies: PoliciesOpt = None,
        tbt_slos_ms: Annotated[
            str, typer.Option("--tbt-slos-ms", help="TBT thresholds to test, comma-separated")
        ] = "100,200,300",
        target: Annotated[float, typer.Option("--target", help="SLO attainment to sustain")] = 0.9,
        admission: CompareAdmissionOpt = None,
        bisect_steps: Annotated[int, typer.Option("--bisect-steps")] = 4,
        bundle: BundleOpt = True,
        json_path: JsonOpt = None,
    ) -> None:
        """Largest replay speed per policy whose SLO attainment stays >= target, every
        policy under one admission mode and one CPP setting (plus bundle rows; with several
        models every pool sped up together, the target on the total attainment)."""
        names = _policy_list(policies)
        thresholds = _thresholds(tbt_slos_ms)
        if not 0 < target <= 1:
            raise typer.BadParameter(f"must be in (0, 1], got {target}", param_hint="--target")
        workload = source.load()
        shapes = pools_for(options, workload)
        out: list[dict[str, Any]] = []
        for line in footing(names, [admission], options.cpp, bundle=bundle):
            name = line.policy
            o = replace(options, admission=line.admission, cpp=line.cpp)
            row: dict[str, Any] = {"policy": name, "label": line.label}
            row.update(admission=line.admission, cpp=line.cpp, bundle=line.bundle)
            row["max_tokens"] = str(workload.max_tokens)
            if shapes is not None:
                row["pools"] = {m: str(shape) for m, shape in shapes.items()}
            for tbt in thresholds:
                cfg = build_config(replace(o, tbt_slo_ms=tbt), name, policy_flag="--policies")
                row["admission"] = cfg.scheduler.admission
                row["cpp"] = cfg.scheduler.cpp_enabled
                point, cell = _capacity(workload, shapes, cfg, target, bisect_steps)
                row[f"tbt_{tbt:g}ms"] = cell
                typer.echo(f"{line.label} TBT {tbt:g} ms: capacity x{point.speed:.3f}", err=True)
            out.append(row)
        print_capacity(out, thresholds)
        if json_path is not None:
            write_json(json_path, out)


def _capacity(
    workload: Workload,
    shapes: Shapes,
    cfg: SimConfig,
    target: float,
    bisect_steps: int,
) -> tuple[CapacityPoint, dict[str, Any]]:
    """The capacity point of ``cfg`` (pooled: every pool ``cfg`` with its own size) and its
    JSON cell."""
    per_model: dict[str, float] | None = None
    if shapes is None:
        requests, outputs = workload.single()
        point = find_capacity(
            requests, cfg, outputs=outputs, target=target, bisect_steps=bisect_steps
        )
    else:
        pools = make_pools(workload, shapes, cfg)
        point, per_model = find_pools_capacity(pools, target=target, bisect_steps=bisect_steps)
    every = workload.requests
    cell: dict[str, Any] = {
        "speed": round(point.speed, 4),
        "rps": round(point.speed * len(every) / _span(every), 4),
        "attainment": point.attainment,
        "tested": [[s, a] for s, a in point.tested],
    }
    if per_model is not None:
        cell["per_model"] = per_model
    return point, cell


def _thresholds(text: str) -> list[float]:
    try:
        thresholds = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"not a list of numbers: {text!r}", param_hint="--tbt-slos-ms"
        ) from None
    if not thresholds or any(t <= 0 for t in thresholds):
        raise typer.BadParameter(f"must be > 0: {text!r}", param_hint="--tbt-slos-ms")
    return thresholds


def _span(requests: list[Request]) -> float:
    arrivals = [r.arrival_s for r in requests]
    span = max(arrivals) - min(arrivals)
    return span if span > 0 else 1.0


__all__ = ["print_table", "register", "to_json"]
