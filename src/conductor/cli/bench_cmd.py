"""``conductor bench ...``: benchmarks that print figures (never pass/fail on timings)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from conductor.cli.fields import config_error
from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import DEFAULT_PRESET, preset
from conductor.core.errors import ConductorError, InvalidInput
from conductor.core.policies import DEFAULT_POLICY, check_policy
from conductor.perf.decision import DEFAULT_REQUESTS, DEFAULT_WARMUP, format_result, run_repeated

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks of the scheduler itself.")

FLAGS = {"policy": "--policy", "preset": "--preset", "handoff": "--handoff"}
"""Option names of the fields ``conductor bench decision`` reports errors for."""


@bench_app.command("decision")
def decision(
    prefill: Annotated[int, typer.Option(min=1, help="Prefill instances.")] = 16,
    decode: Annotated[int, typer.Option(min=1, help="Decode instances.")] = 16,
    policy: Annotated[str, typer.Option(help="Prefill policy name.")] = DEFAULT_POLICY,
    requests: Annotated[int, typer.Option(min=1, help="Requests to time.")] = DEFAULT_REQUESTS,
    warmup: Annotated[
        int, typer.Option(min=0, help="Untimed requests scheduled first.")
    ] = DEFAULT_WARMUP,
    repeat: Annotated[int, typer.Option(min=1, help="Runs; the median-p99 one is shown.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of block placement and scheduler.")] = 0,
    preset_name: Annotated[
        str, typer.Option("--preset", help="Cost-model preset.")
    ] = DEFAULT_PRESET,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the result as JSON.")
    ] = None,
    handoff: Annotated[
        str,
        typer.Option(help="The hand-off the scheduler predicts: stream, serial or load."),
    ] = SchedulerConfig().handoff,
) -> None:
    """Time schedule() and the KV-event ingest rate on the bundled Mooncake trace."""
    try:
        check_policy(policy)
        preset(preset_name)
        SchedulerConfig(handoff=handoff)  # its check, named by the option
    except InvalidInput as exc:
        raise config_error(exc, FLAGS) from None
    try:
        result = run_repeated(
            prefill,
            decode,
            repeat=repeat,
            policy=policy,
            requests=requests,
            warmup=warmup,
            seed=seed,
            preset_name=preset_name,
            handoff=handoff,
        )
    except ConductorError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(format_result(result))
    if json_path is not None:
        json_path.write_text(json.dumps(result.to_json(), indent=2) + "\n")
        typer.echo(f"wrote {json_path}")
