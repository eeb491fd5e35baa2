"""``conductor replay``: replay a trace against a live OpenAI-compatible endpoint, open loop,
and report it exactly as ``conductor simulate`` reports a simulated run.

The replay's outcomes become the simulator's :class:`~conductor.sim.records.RequestRecord`
(TTFT = first streamed token minus the due time; TBT = FAST's mean of the longest 10% of the
token intervals, :func:`~conductor.sim.records.tail_mean_tbt`) and go through the same
:func:`~conductor.sim.records.summarize`, so ``--json`` has ``simulate --json``'s schema and
the two can be compared field by field. Ctrl-C (or SIGTERM) stops sending and writes what
finished.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from conductor.cli.fields import config_error, field_default
from conductor.cli.sim_options import (
    DEFAULT_TBT_SLO_MS,
    DEFAULTS,
    JsonOpt,
    LimitOpt,
    SkipOpt,
    SpeedOpt,
    TbtOpt,
    TtftOpt,
    load_requests,
)
from conductor.core.errors import InvalidInput
from conductor.replay.config import ReplayConfig
from conductor.replay.runner import Outcome, Replayer
from conductor.sim.records import RequestRecord, summarize, tail_mean_tbt
from conductor.sim.report import write_json
from conductor.web.signals import on_stop_signals

FLAGS = {
    "url": "--url",
    "model": "--model",
    "speed": "--speed",
    "limit": "--limit",
    "token_scale": "--token-scale",
    "output_scale": "--output-scale",
    "trace_block_tokens": "--trace-block-size",
    "block_size_tokens": "--block-size",
    "max_prompt_tokens": "--max-prompt-tokens",
    "max_output_tokens": "--max-output-tokens",
    "timeout_s": "--timeout-s",
    "seed": "--seed",
}
"""ReplayConfig field -> its option."""
ADMISSION_LABEL = "endpoint"
"""The ``admission`` of a replay's summary: whatever the endpoint does."""


def to_record(o: Outcome) -> RequestRecord:
    """A replayed request as the simulator records one."""
    rec = RequestRecord(o.request_id, o.arrival_s, o.prompt_tokens, o.output_tokens)
    rec.prefill, rec.decode = o.prefill, o.decode
    if not o.ok:
        rec.rejected = f"HTTP {o.status}" if o.status not in (0, 200) else (o.error or "failed")
        return rec
    rec.local_tokens = o.cached_tokens or 0
    rec.prefill_start_s = o.sent_s
    rec.prefill_end_s = o.token_times_s[0]
    rec.decode_join_s = o.token_times_s[0]
    rec.finish_s = o.done_s if o.done_s is not None else o.token_times_s[-1]
    if len(o.token_times_s) >= 2:
        rec.tbt_s = tail_mean_tbt(np.diff(np.asarray(o.token_times_s)))
    return rec


def summary(
    outcomes: Sequence[Outcome],
    *,
    label: str,
    ttft_slo_s: float,
    tbt_slo_s: float,
    duration_s: float,
    wall_s: float,
) -> dict[str, Any]:
    """The replay in ``simulate --json``'s schema (``sim_wall_s``: the replay's wall time).
    The simulator's own settings (CPP, cost error, ...) are the endpoint's business: null here;
    the requests carry the trace's output lengths as ``max_tokens``."""
    records = [to_record(o) for o in sorted(outcomes, key=lambda o: o.arrival_s)]
    return {
        "policy": label,
        "admission": ADMISSION_LABEL,
        "cpp": None,
        "oracle_lengths": False,
        "cost_error": None,
        "cost_bias": None,
        "cost_correction": None,
        "kv_fetch": None,
        "prefill_lanes": None,
        **summarize(records, ttft_slo_s=ttft_slo_s, tbt_slo_s=tbt_slo_s, duration_s=duration_s),
        "sim_wall_s": round(wall_s, 3),
        "max_tokens": "trace",
    }


def per_request(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """One row per finished request (``--requests-json``), in arrival order."""
    rows = []
    for o in sorted(outcomes, key=lambda o: o.arrival_s):
        rec = to_record(o)
        rows.append(
            {
                "request_id": o.request_id,
                "arrival_s": round(o.arrival_s, 6),
                "prompt_tokens": o.prompt_tokens,
                "output_tokens": o.output_tokens,
                "cached_tokens": o.cached_tokens,
                "ttft_s": None if rec.ttft_s is None else round(rec.ttft_s, 6),
                "tbt_s": None if rec.tbt_s is None else round(rec.tbt_s, 6),
                "tokens": len(o.token_times_s),
                "status": o.status,
                "error": o.error,
                "sent_s": round(o.sent_s, 6),
                "done_s": None if rec.finish_s is None else round(rec.finish_s, 6),
                "prefill": o.prefill,
                "decode": o.decode,
                "queued_s": o.queued_s,
                "predicted_ttft_s": o.predicted_ttft_s,
            }
        )
    return rows


def _model(url: str, model: str | None) -> str:
    if model is not None:
        return model
    import httpx

    try:
        r = httpx.get(f"{url}/v1/models", timeout=10.0)
        r.raise_for_status()
        return str(r.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise typer.BadParameter(
            f"cannot list the models at {url}/v1/models ({exc}); give --model",
            param_hint="--url",
        ) from None


def _pool(model_path: Path | None) -> tuple[int, ...] | None:
    if model_path is None:
        return None
    from conductor.core.errors import ConductorError
    from conductor.hf.tokenizer import HfTokenizer
    from conductor.hf.words import WORDS
    from conductor.workload.prompts import word_pool

    try:
        tok = HfTokenizer.load(model_path)
    except ConductorError as exc:
        raise typer.BadParameter(str(exc), param_hint="--model-path") from None
    return word_pool(lambda t: tok.encode(t, add_special_tokens=False), WORDS)


async def _until_stopped(replayer: Replayer) -> signal.Signals | None:
    """Runs the replay; returns the signal that stopped it early (SIGINT, SIGTERM: handled
    even where the shell that started it left SIGINT ignored), or None."""
    main = asyncio.current_task()
    assert main is not None
    stopped: list[signal.Signals] = []

    def stop(sig: signal.Signals) -> None:
        stopped.append(sig)
        main.cancel()

    with on_stop_signals(stop):
        try:
            await replayer.run()
        except asyncio.CancelledError:
            if not stopped:
                raise
    return stopped[0] if stopped else None


def _run(replayer: Replayer, total: int) -> signal.Signals | None:
    """Runs the replay with a progress bar on a terminal; returns the signal that stopped it
    early (SIGINT, SIGTERM), or None."""
    try:
        if sys.stderr.isatty():
            from rich.progress import Progress

            with Progress(transient=True) as bar:
                task = bar.add_task("replaying", total=total)
                replayer.on_done = lambda o: bar.update(task, advance=1)
                return asyncio.run(_until_stopped(replayer))
        return asyncio.run(_until_stopped(replayer))
    except KeyboardInterrupt:  # a signal handler could not be installed: Python's own
        return signal.SIGINT


def _int(name: str) -> int:
    value = field_default(ReplayConfig, name)
    assert isinstance(value, int)
    return value


def _float(name: str) -> float:
    value = field_default(ReplayConfig, name)
    assert isinstance(value, float)
    return value


DEFAULT_SPEED = _float("speed")


def register(app: typer.Typer) -> None:
    @app.command("replay")
    def replay_cmd(
        url: Annotated[str, typer.Option("--url", help="endpoint base URL (http://host:port)")],
        trace: Annotated[
            Path | None, typer.Option("--trace", help="Mooncake JSONL trace (default: bundled)")
        ] = None,
        speed: SpeedOpt = DEFAULT_SPEED,
        limit: LimitOpt = None,
        json_path: JsonOpt = None,
        requests_json: Annotated[
            Path | None,
            typer.Option("--requests-json", help="write one row per request (JSON) here"),
        ] = None,
        model: Annotated[
            str | None, typer.Option("--model", help="model name [first of /v1/models]")
        ] = None,
        model_path: Annotated[
            Path | None,
            typer.Option("--model-path", help="tokenizer folder: prompts of its word tokens"),
        ] = None,
        token_scale: Annotated[
            float, typer.Option("--token-scale", help="prompt lengths x this (small models)")
        ] = _float("token_scale"),
        output_scale: Annotated[
            float, typer.Option("--output-scale", help="output lengths x this")
        ] = _float("output_scale"),
        trace_block_size: Annotated[
            int, typer.Option("--trace-block-size", help="tokens per hash id in the trace")
        ] = _int("trace_block_tokens"),
        block_size: Annotated[
            int | None,
            typer.Option("--block-size", help="tokens per hash id sent [trace's x token scale]"),
        ] = None,
        max_prompt_tokens: Annotated[
            int | None, typer.Option("--max-prompt-tokens", help="cut longer prompts")
        ] = None,
        max_output_tokens: Annotated[
            int | None, typer.Option("--max-output-tokens", help="cap max_tokens")
        ] = None,
        ttft_slo_s: TtftOpt = DEFAULTS.scheduler.ttft_slo_s,
        tbt_slo_ms: TbtOpt = DEFAULT_TBT_SLO_MS,
        label: Annotated[
            str, typer.Option("--label", help="the run's name (the 'policy' column)")
        ] = "replay",
        timeout_s: Annotated[float, typer.Option("--timeout-s", help="per request")] = _float(
            "timeout_s"
        ),
        seed: Annotated[int, typer.Option("--seed", help="token seed")] = _int("seed"),
        skip_invalid: SkipOpt = False,
    ) -> None:
        """Replay a trace open-loop against an OpenAI-compatible endpoint; report like simulate."""
        try:
            cfg = ReplayConfig(
                url=url.rstrip("/"),
                model=model,
                speed=speed,
                limit=limit,
                token_scale=token_scale,
                output_scale=output_scale,
                trace_block_tokens=trace_block_size,
                block_size_tokens=block_size,
                max_prompt_tokens=max_prompt_tokens,
                max_output_tokens=max_output_tokens,
                timeout_s=timeout_s,
                seed=seed,
            )
        except InvalidInput as exc:
            raise config_error(exc, FLAGS) from None
        for name, value in (("--ttft-slo-s", ttft_slo_s), ("--tbt-slo-ms", tbt_slo_ms)):
            if not value > 0:
                raise typer.BadParameter(f"must be > 0, got {value}", param_hint=name)
        requests, outputs = load_requests(
            trace, limit, speed, skip_invalid, block_size_tokens=cfg.trace_block_tokens
        )
        pool = _pool(model_path)
        served = _model(cfg.url, cfg.model)
        replayer = (
            Replayer(cfg, served, requests, outputs)
            if pool is None
            else Replayer(cfg, served, requests, outputs, pool=pool)
        )
        start = time.perf_counter()
        stopped_by = _run(replayer, len(requests))
        wall = time.perf_counter() - start
        done = list(replayer.outcomes)
        if stopped_by is not None:
            typer.echo(
                f"interrupted ({stopped_by.name}): {len(done)} of {len(requests)} "
                "requests finished",
                err=True,
            )
        span = requests[-1].arrival_s - requests[0].arrival_s if requests else 0.0
        result = summary(
            done,
            label=label,
            ttft_slo_s=ttft_slo_s,
            tbt_slo_s=tbt_slo_ms / 1e3,
            duration_s=span,
            wall_s=wall,
        )
        from conductor.cli.sim_cmd import print_table

        print_table([result])
        failed = [o for o in done if not o.ok]
        if failed:
            typer.echo(f"{len(failed)} request(s) failed, e.g. {failed[0].error}", err=True)
        if json_path is not None:
            write_json(json_path, result)
            typer.echo(f"results written to {json_path}")
        if requests_json is not None:
            write_json(requests_json, per_request(done))
        if stopped_by is not None:
            raise typer.Exit(128 + stopped_by.value)
