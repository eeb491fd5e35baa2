"""``conductor profile``: measure a live engine, print the fit's residuals, write a cost file.

Every option's default is the :class:`~conductor.profiling.config.ProfileConfig` field it
sets; bad values exit with status 2 naming the option.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from conductor.cli.fields import config_error, field_default
from conductor.core.errors import ConductorError, InvalidInput
from conductor.profiling.config import ProfileConfig

FLAGS = {
    "url": "--url",
    "model": "--model",
    "prefill_lengths": "--lengths",
    "cached_fractions": "--cached-fractions",
    "repeats": "--repeats",
    "warmup": "--warmup",
    "batch_sizes": "--batch-sizes",
    "decode_contexts": "--contexts",
    "decode_tokens": "--decode-tokens",
    "block_size_tokens": "--block-size",
    "kv_capacity_tokens": "--kv-capacity-tokens",
    "max_batch_size": "--max-batch-size",
    "kv_bytes_per_elem": "--kv-bytes-per-elem",
    "transfer_bytes_per_s": "--transfer-bytes-per-s",
    "transfer_latency_s": "--transfer-latency-s",
    "timeout_s": "--timeout-s",
    "seed": "--seed",
    "handoff_url": "--handoff-url",
    "handoff_lengths": "--handoff-lengths",
    "handoff_samples": "--handoff-samples",
}
"""ProfileConfig field -> its option."""


def _int(name: str) -> int:
    value = field_default(ProfileConfig, name)
    assert isinstance(value, int)
    return value


def _float(name: str) -> float:
    value = field_default(ProfileConfig, name)
    assert isinstance(value, float)
    return value


def _list_default(name: str) -> str:
    value = field_default(ProfileConfig, name)
    assert isinstance(value, tuple)
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise typer.BadParameter(f"not a list of integers: {text!r}", param_hint=flag) from None


def _floats(text: str, flag: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise typer.BadParameter(f"not a list of numbers: {text!r}", param_hint=flag) from None


def print_residuals(result: object) -> None:
    from rich.console import Console
    from rich.table import Table

    from conductor.profiling.fit import rms
    from conductor.profiling.run import ProfileResult

    assert isinstance(result, ProfileResult)
    f = result.fit
    console = Console(width=120)
    for title, residuals in (("prefill", f.prefill_residuals), ("decode step", f.decode_residuals)):
        table = Table("sample", "measured ms", "fit ms", "error", title=f"{title} fit")
        for r in residuals:
            table.add_row(
                r.what, f"{r.measured_s * 1e3:.2f}", f"{r.fitted_s * 1e3:.2f}", f"{r.error:+.1%}"
            )
        table.add_section()
        table.add_row("rms error", "", "", f"{rms(residuals):.1%}")
        console.print(table)
    p, d = f.prefill, f.decode
    console.print(
        f"prefill s = {p.c0:.4g} + {p.c1:.4g} m + {p.c2:.4g} N + {p.c3:.4g} m N;"
        f" decode step s = {d.c0:.4g} + {d.c1:.4g} B + {d.c2:.4g} C"
    )
    h = result.handoff_fit
    if h is not None:
        table = Table(
            "prompt tokens", "prefill ms", "P/D ms", "hand-off ms", "decode step ms",
            "KV move fit ms",
        )  # fmt: skip
        table.title = "hand-off fit (the KV move: the hand-off less the profiled decode step)"
        for s in result.measurements.handoff:
            table.add_row(
                str(s.prompt_tokens),
                f"{s.prefill_s * 1e3:.2f}",
                f"{s.pd_ttft_s * 1e3:.2f}",
                f"{s.handoff_s * 1e3:.2f}",
                f"{result.cost.decode_step_s(1, s.prompt_tokens) * 1e3:.2f}",
                f"{h.at(s.prompt_tokens) * 1e3:.2f}",
            )
        console.print(table)
        c = result.cost
        console.print(
            f"KV move s = {h.latency_s:.4g} + {h.s_per_token:.4g} x prompt tokens"
            f" (max residual {h.max_residual_s * 1e3:.2f} ms): "
            + (
                f"[transfer] bytes_per_s {c.transfer_bytes_per_s:.4g}, latency_s"
                f" {c.transfer_latency_s:.4g}"
                if result.transfer_measured
                else "not usable as a transfer (it did not grow with the prompt): option values"
                " kept"
            ),
            markup=False,
        )


def register(app: typer.Typer) -> None:
    @app.command("profile")
    def profile_cmd(
        url: Annotated[str, typer.Option("--url", help="engine base URL (http://host:port)")],
        model_path: Annotated[
            Path, typer.Option("--model-path", help="the served model's folder (config, tokenizer)")
        ],
        out: Annotated[Path, typer.Option("--out", help="write the cost file (TOML) here")],
        name: Annotated[
            str | None, typer.Option("--name", help="cost model name [MODEL-profiled]")
        ] = None,
        model: Annotated[
            str | None, typer.Option("--model", help="served model name [first of /v1/models]")
        ] = None,
        lengths: Annotated[
            str, typer.Option("--lengths", help="prefill prompt lengths, comma-separated")
        ] = _list_default("prefill_lengths"),
        cached_fractions: Annotated[
            str, typer.Option("--cached-fractions", help="cached share of each prefill prompt")
        ] = _list_default("cached_fractions"),
        repeats: Annotated[int, typer.Option("--repeats", help="runs per point (median)")] = _int(
            "repeats"
        ),
        warmup: Annotated[int, typer.Option("--warmup", help="unmeasured requests first")] = _int(
            "warmup"
        ),
        batch_sizes: Annotated[
            str, typer.Option("--batch-sizes", help="decode batch sizes, comma-separated")
        ] = _list_default("batch_sizes"),
        contexts: Annotated[
            str, typer.Option("--contexts", help="decode prompt lengths, comma-separated")
        ] = _list_default("decode_contexts"),
        decode_tokens: Annotated[
            int, typer.Option("--decode-tokens", help="tokens per decode stream")
        ] = _int("decode_tokens"),
        block_size: Annotated[
            int | None, typer.Option("--block-size", help="KV block size [the engine's]")
        ] = None,
        kv_capacity_tokens: Annotated[
            int | None, typer.Option("--kv-capacity-tokens", help="KV room [the engine's]")
        ] = None,
        max_batch_size: Annotated[
            int, typer.Option("--max-batch-size", help="the engine's max running requests")
        ] = _int("max_batch_size"),
        kv_bytes_per_elem: Annotated[
            int, typer.Option("--kv-bytes-per-elem", help="KV dtype size (bf16: 2)")
        ] = _int("kv_bytes_per_elem"),
        transfer_bytes_per_s: Annotated[
            float,
            typer.Option(
                "--transfer-bytes-per-s", help="KV transfer bandwidth, unless --handoff-url"
            ),
        ] = _float("transfer_bytes_per_s"),
        transfer_latency_s: Annotated[
            float,
            typer.Option("--transfer-latency-s", help="KV transfer latency, unless --handoff-url"),
        ] = _float("transfer_latency_s"),
        handoff_url: Annotated[
            str | None,
            typer.Option(
                "--handoff-url",
                help="a disaggregated gateway (prefill engine like --url + a decode engine):"
                " measure the KV hand-off for [transfer]",
            ),
        ] = None,
        handoff_lengths: Annotated[
            str, typer.Option("--handoff-lengths", help="hand-off prompt lengths, comma-separated")
        ] = _list_default("handoff_lengths"),
        handoff_samples: Annotated[
            int, typer.Option("--handoff-samples", help="hand-off pairs per length")
        ] = _int("handoff_samples"),
        timeout_s: Annotated[float, typer.Option("--timeout-s", help="per request")] = _float(
            "timeout_s"
        ),
        seed: Annotated[int, typer.Option("--seed", help="prompt seed")] = _int("seed"),
    ) -> None:
        """Measure a live OpenAI-compatible engine and write a cost file (--cost-file)."""
        try:
            cfg = ProfileConfig(
                url=url.rstrip("/"),
                model=model,
                prefill_lengths=_ints(lengths, "--lengths"),
                cached_fractions=_floats(cached_fractions, "--cached-fractions"),
                repeats=repeats,
                warmup=warmup,
                batch_sizes=_ints(batch_sizes, "--batch-sizes"),
                decode_contexts=_ints(contexts, "--contexts"),
                decode_tokens=decode_tokens,
                block_size_tokens=block_size,
                kv_capacity_tokens=kv_capacity_tokens,
                max_batch_size=max_batch_size,
                kv_bytes_per_elem=kv_bytes_per_elem,
                transfer_bytes_per_s=transfer_bytes_per_s,
                transfer_latency_s=transfer_latency_s,
                timeout_s=timeout_s,
                seed=seed,
                handoff_url=handoff_url.rstrip("/") if handoff_url else None,
                handoff_lengths=_ints(handoff_lengths, "--handoff-lengths"),
                handoff_samples=handoff_samples,
            )
        except InvalidInput as exc:
            raise config_error(exc, FLAGS) from None
        if not model_path.is_dir():
            raise typer.BadParameter(f"not a directory: {model_path}", param_hint="--model-path")
        import httpx

        from conductor.profiling.measure import ProfileError, planned_steps
        from conductor.profiling.run import profile

        try:
            if sys.stderr.isatty():
                from rich.progress import Progress

                with Progress(transient=True) as bar:
                    task = bar.add_task("profiling", total=planned_steps(cfg))

                    def step(label: str) -> None:
                        bar.update(task, advance=1, description=label)

                    result = profile(cfg, model_path, name=name, step=step)
            else:
                result = profile(cfg, model_path, name=name)
        except InvalidInput as exc:
            flags = {"model_path": "--model-path", "url": "--url", "handoff_url": "--handoff-url"}
            raise config_error(exc, flags) from None
        except (ConductorError, ProfileError, httpx.HTTPError, OSError) as exc:
            typer.echo(f"error: profiling {cfg.url}: {exc}", err=True)
            raise typer.Exit(1) from None
        print_residuals(result)
        out.write_text(result.text)
        typer.echo(
            f"cost file written to {out} ({result.measurements.requests} requests,"
            f" {result.wall_s:.1f} s)"
        )
