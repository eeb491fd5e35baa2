"""``conductor demo``: start a gateway in front of an emulated 2-prefill + 2-decode cluster,
send a short load of conversations with shared prefixes, print what went where and how fast,
and stop everything it started."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from conductor.core.errors import InvalidInput
from conductor.core.policies import DEFAULT_POLICY, check_policy
from conductor.demo.cluster import Cluster, free_ports
from conductor.demo.load import Outcome, run_load
from conductor.demo.tokenizer import make_tokenizer

ROLES = ("prefill", "prefill", "decode", "decode")
MODEL = "demo"


def _print(outcomes: list[Outcome]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        "conv",
        "turn",
        "status",
        "prompt tok",
        "cached tok",
        "prefill",
        "decode",
        "TTFT ms",
        "total ms",
    )
    for o in outcomes:
        table.add_row(
            str(o.conversation),
            str(o.turn),
            str(o.status) + (f" {o.error[:40]}" if o.error else ""),
            str(o.prompt_tokens),
            str(o.cached_tokens),
            o.prefill,
            o.decode,
            f"{o.ttft_ms:.1f}",
            f"{o.total_ms:.1f}",
        )
    console = Console(width=160)
    console.print(table)
    ok = [o for o in outcomes if o.status == 200]
    if ok:
        ttft = sorted(o.ttft_ms for o in ok)
        prompt = sum(o.prompt_tokens for o in ok)
        cached = sum(o.cached_tokens for o in ok)
        console.print(
            f"{len(ok)}/{len(outcomes)} requests completed; TTFT p50 {ttft[len(ttft) // 2]:.1f} ms,"
            f" max {ttft[-1]:.1f} ms; cached {cached}/{prompt} prompt tokens"
            f" ({100 * cached / max(1, prompt):.0f}%)"
        )
        console.print(f"prefill engines: {dict(Counter(o.prefill for o in ok))}")
        console.print(f"decode engines:  {dict(Counter(o.decode for o in ok))}")


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo_cmd(
        conversations: Annotated[int, typer.Option("--conversations", min=1, max=32)] = 4,
        turns: Annotated[int, typer.Option("--turns", min=1, max=20)] = 5,
        speedup: Annotated[
            float, typer.Option("--speedup", help="emulated engines run X times faster")
        ] = 20.0,
        policy: Annotated[str, typer.Option("--policy")] = DEFAULT_POLICY,
        seed: Annotated[int, typer.Option("--seed")] = 0,
    ) -> None:
        """Gateway + emulated 2P/2D cluster + a short load; everything stops at the end."""
        # transformers warns at import that PyTorch is absent: only its tokenizers are used
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        try:
            check_policy(policy)
        except InvalidInput as exc:
            raise typer.BadParameter(
                f"{exc.why}, got {exc.value!r}", param_hint="--policy"
            ) from None
        if speedup <= 0:
            raise typer.BadParameter(f"must be > 0, got {speedup}", param_hint="--speedup")
        with tempfile.TemporaryDirectory(prefix="conductor-demo-") as tmp:
            work = Path(tmp)
            tokdir = work / "tokenizer"
            make_tokenizer(tokdir)
            cluster = Cluster(work)
            try:
                ports = free_ports(3 * len(ROLES) + 1)
                engine_args = []
                for i, role in enumerate(ROLES):
                    http, kv, replay = ports[3 * i : 3 * i + 3]
                    name = f"{role}-{i % 2}"
                    url = f"http://127.0.0.1:{http}"
                    cluster.start(
                        name,
                        [
                            "emulate",
                            "--port",
                            str(http),
                            "--role",
                            role,
                            "--kv-events-port",
                            str(kv),
                            "--replay-port",
                            str(replay),
                            "--speedup",
                            str(speedup),
                            "--model-path",
                            str(tokdir),
                            "--model",
                            MODEL,
                            "--engine-id",
                            name,
                            "--seed",
                            str(seed),
                        ],
                        url,
                    )
                    engine_args += [
                        "--engine",
                        f"{url},role={role},kv_events=tcp://127.0.0.1:{kv},"
                        f"replay=tcp://127.0.0.1:{replay},id={name},model={MODEL},block_size=32",
                    ]
                for proc in list(cluster.procs):
                    cluster.wait_healthy(proc)
                gport = ports[-1]
                gurl = f"http://127.0.0.1:{gport}"
                gateway = cluster.start(
                    "gateway",
                    [
                        "serve",
                        *engine_args,
                        "--model-path",
                        str(tokdir),
                        "--model-name",
                        MODEL,
                        "--block-size",
                        "32",
                        "--max-model-len",
                        "8192",
                        "--port",
                        str(gport),
                        "--policy",
                        policy,
                    ],
                    gurl,
                )
                cluster.wait_healthy(gateway)
                typer.echo(
                    f"gateway {gurl} ({policy}) in front of "
                    + ", ".join(p.name for p in cluster.procs if p is not gateway)
                )
                outcomes = asyncio.run(run_load(gurl, MODEL, conversations, turns, seed))
                _print(outcomes)
            except RuntimeError as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(1) from None
            finally:
                cluster.stop()
        typer.echo("stopped the gateway and the engines")
