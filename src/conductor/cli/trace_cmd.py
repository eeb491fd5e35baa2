"""``conductor trace ...``: synthesize workloads and summarize traces."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from conductor.core.errors import ConductorError
from conductor.core.state import CACHE_CAPACITY_TOKENS
from conductor.workload.analysis import infinite_cache_hits, lru_cache_hits, trace_stats
from conductor.workload.spread import DEFAULT_GAP_MS, spread_ties, ties
from conductor.workload.synth import KINDS, synthesize
from conductor.workload.trace import bundled_trace_path, read_trace, write_trace
from conductor.workload.trace_format import DEFAULT_BLOCK_SIZE_TOKENS, TraceRecord

__all__ = ["trace_app"]

trace_app = typer.Typer(
    help="Synthesize workloads and summarize Mooncake-format traces.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


# Values are checked by callbacks (not Click types) so every message names the value given:
# "Invalid value for '--rate': must be a finite number > 0, got 0.0".


def _known_kind(value: str) -> str:
    if value not in KINDS:
        raise typer.BadParameter(f"must be one of {', '.join(KINDS)}, got {value!r}")
    return value


def _positive_int(value: int) -> int:
    if value <= 0:
        raise typer.BadParameter(f"must be an integer > 0, got {value}")
    return value


def _non_negative_int(value: int) -> int:
    if value < 0:
        raise typer.BadParameter(f"must be an integer >= 0, got {value}")
    return value


def _positive_rate(value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"must be a finite number > 0, got {value}")
    return value


def _models(models: str | None, mix: str | None) -> dict[str, float] | None:
    """``--models a,b`` with ``--mix 0.7,0.3`` (default: equal weights) as name -> weight;
    a bad value exits naming the flag and the value."""
    if models is None:
        if mix is not None:
            raise typer.BadParameter("needs --models", param_hint="--mix")
        return None
    names = [name.strip() for name in models.split(",")]
    for name in names:
        if not name:
            raise typer.BadParameter(
                f"model names must be non-empty, got {models!r}", param_hint="--models"
            )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise typer.BadParameter(
            f"model names must be distinct, {', '.join(map(repr, repeated))} repeated in"
            f" {models!r}",
            param_hint="--models",
        )
    if mix is None:
        return dict.fromkeys(names, 1.0)
    try:
        weights = [float(weight) for weight in mix.split(",")]
    except ValueError:
        raise typer.BadParameter(f"not a list of numbers: {mix!r}", param_hint="--mix") from None
    if len(weights) != len(names):
        raise typer.BadParameter(
            f"{len(weights)} weight(s) in {mix!r} for {len(names)} model(s) in --models",
            param_hint="--mix",
        )
    if not all(math.isfinite(w) and w > 0 for w in weights):
        raise typer.BadParameter(
            f"every weight must be a finite number > 0, got {mix!r}", param_hint="--mix"
        )
    return dict(zip(names, weights, strict=True))


def _per_model(records: list[TraceRecord]) -> str:
    counts = Counter(record.model_name for record in records)
    return ", ".join(f"{name} {counts[name]}" for name in sorted(counts))


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=1)


def _tokens(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:.1f}"


@trace_app.command()
def synth(
    kind: Annotated[
        str, typer.Option(callback=_known_kind, metavar="|".join(KINDS), help="Workload kind.")
    ],
    out: Annotated[Path, typer.Option(help="Output file (Mooncake JSONL; gzip if .gz).")],
    requests: Annotated[
        int, typer.Option(callback=_positive_int, help="Number of requests.")
    ] = 1000,
    rate: Annotated[
        float, typer.Option(callback=_positive_rate, help="Mean arrival rate, requests/s.")
    ] = 2.0,
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same bytes).")] = 0,
    block_size: Annotated[
        int, typer.Option(callback=_positive_int, help="Tokens per hashed block.")
    ] = DEFAULT_BLOCK_SIZE_TOKENS,
    models: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated model names: each session (and its requests) is for one,"
            " with its own prefixes (default: no model field)."
        ),
    ] = None,
    mix: Annotated[
        str | None,
        typer.Option(help="Comma-separated weights of --models' names (default: equal)."),
    ] = None,
) -> None:
    """Write a synthetic workload and print a one-line summary."""
    weights = _models(models, mix)
    try:
        records = synthesize(
            kind,
            requests=requests,
            rate_rps=rate,
            seed=seed,
            block_size_tokens=block_size,
            models=weights,
        )
        write_trace(records, out)
    except ConductorError as exc:
        raise _fail(str(exc)) from exc
    except OSError as exc:
        raise _fail(f"cannot write {out}: {exc}") from exc
    stats = trace_stats(records)
    hits = infinite_cache_hits(records, block_size_tokens=block_size)
    typer.echo(
        f"wrote {stats.requests} {kind} requests to {out}: "
        f"mean input {stats.input_mean_tokens:.1f} tokens, "
        f"mean output {stats.output_mean_tokens:.1f} tokens, "
        f"infinite-cache prefix hit rate {hits.rate:.1%}"
        + (f"; requests per model: {_per_model(records)}" if weights is not None else "")
    )


@trace_app.command()
def stats(
    path: Annotated[
        Path | None,
        typer.Argument(
            exists=True,
            dir_okay=False,
            help="Trace file (JSONL, gzip if .gz); default: the bundled conversation trace.",
        ),
    ] = None,
    lru_tokens: Annotated[
        int, typer.Option(callback=_non_negative_int, help="Global LRU pool size, tokens.")
    ] = CACHE_CAPACITY_TOKENS,
    block_size: Annotated[
        int, typer.Option(callback=_positive_int, help="Tokens per hashed block.")
    ] = DEFAULT_BLOCK_SIZE_TOKENS,
    skip_invalid: Annotated[
        bool, typer.Option(help="Skip invalid lines (and count them) instead of failing.")
    ] = False,
) -> None:
    """Print a trace's size, rate, lengths, distinct blocks and prefix-cache hit rates."""
    source = path if path is not None else bundled_trace_path()
    try:
        result = read_trace(source, skip_invalid=skip_invalid, block_size_tokens=block_size)
        summary = trace_stats(result.records)
    except ConductorError as exc:
        raise _fail(f"{source}: {exc}") from exc
    except OSError as exc:
        raise _fail(f"cannot read {source}: {exc}") from exc
    records = result.records
    infinite = infinite_cache_hits(records, block_size_tokens=block_size)
    lru = lru_cache_hits(records, capacity_tokens=lru_tokens, block_size_tokens=block_size)
    rate = "n/a" if summary.mean_rate_rps is None else f"{summary.mean_rate_rps:.2f} req/s"
    tied = ties(records)
    lines = [
        f"trace: {source}",
        f"requests: {summary.requests}",
        f"skipped lines: {len(result.skipped)}" if skip_invalid else None,
        f"time span: {summary.span_s:.1f} s",
        f"mean rate: {rate}",
        f"simultaneous arrivals: {tied.tied} requests share a timestamp with an earlier one"
        f" (largest run {tied.largest_run}; `conductor trace spread` orders them in time)",
        f"requests per model: {_per_model(records)}"
        if any(record.model is not None for record in records)
        else None,
        f"input tokens: mean {summary.input_mean_tokens:.1f}, "
        f"median {_tokens(summary.input_median_tokens)}, max {summary.input_max_tokens}",
        f"output tokens: mean {summary.output_mean_tokens:.1f}",
        f"unique blocks: {summary.unique_blocks}",
        f"infinite-cache hit rate: {infinite.rate:.1%}",
        f"LRU hit rate at {lru_tokens} tokens ({lru_tokens // block_size} blocks): {lru.rate:.1%}",
    ]
    typer.echo("\n".join(line for line in lines if line is not None))


@trace_app.command()
def spread(
    path: Annotated[
        Path,
        typer.Argument(exists=True, dir_okay=False, help="Trace file (JSONL, gzip if .gz)."),
    ],
    out: Annotated[Path, typer.Option(help="Output file (Mooncake JSONL; gzip if .gz).")],
    gap_ms: Annotated[
        int,
        typer.Option(
            callback=_positive_int,
            help="Milliseconds between requests that shared a timestamp (less where the next"
            " timestamp comes sooner).",
        ),
    ] = DEFAULT_GAP_MS,
    block_size: Annotated[
        int, typer.Option(callback=_positive_int, help="Tokens per hashed block.")
    ] = DEFAULT_BLOCK_SIZE_TOKENS,
) -> None:
    """Give simultaneous arrivals an order in time: the k-th request of a run sharing one
    timestamp moves k x --gap-ms later, in file order (replay and simulate then agree on
    the order the requests arrive in; docs/fidelity.md)."""
    try:
        records = read_trace(path, block_size_tokens=block_size).records
        spread_records = spread_ties(records, gap_ms)
    except ConductorError as exc:
        raise _fail(f"{path}: {exc}") from exc
    except OSError as exc:
        raise _fail(f"cannot read {path}: {exc}") from exc
    try:
        write_trace(spread_records, out)
    except OSError as exc:
        raise _fail(f"cannot write {out}: {exc}") from exc
    before, after = ties(records), ties(spread_records)
    typer.echo(
        f"wrote {len(spread_records)} requests to {out}: {before.tied} shared a timestamp with"
        f" an earlier one (largest run {before.largest_run}), {after.tied} still do"
    )
