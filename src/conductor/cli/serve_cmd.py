"""``conductor serve``: the scheduler as an OpenAI-compatible gateway in front of vLLM engines.

This is the composition root of the gateway: it resolves the configuration
(:mod:`conductor.cli.serve_config`), loads the tokenizer, builds the
:class:`~conductor.core.scheduler.Scheduler`, the :class:`~conductor.gateway.service.Gateway`
and its HTTP server (:mod:`conductor.web`), and serves until SIGINT/SIGTERM. ``--check``
prints the resolved configuration and exits instead. Bad configuration exits with status 2
and names the field and the value.
"""

from __future__ import annotations

import gc
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from conductor.cli import cluster_serve
from conductor.cli.serve_config import DEFAULTS, ServeSettings, build_settings
from conductor.cli.serve_models import ModelSettings
from conductor.core.costmodel import PRESETS
from conductor.core.errors import ConductorError
from conductor.core.policies import policy_names
from conductor.core.policies.colocated import ColocatedDecode
from conductor.core.replication import ReplicaScheduler
from conductor.core.scheduler import Scheduler

if TYPE_CHECKING:
    from conductor.gateway.service import Gateway

ADMIN_TOKEN_ENV = "CONDUCTOR_ADMIN_TOKEN"
SHUTDOWN_GRACE_S = 10.0
log = logging.getLogger("conductor.serve")


def build_conductor(settings: ServeSettings | ModelSettings) -> Scheduler:
    """A scheduler for the gateway (of one model, with several): requests placed on a
    ``both`` engine decode there; a replica (sharing its reservations) with ``--cluster``."""
    conductor: Scheduler
    cluster = settings.cluster if isinstance(settings, ServeSettings) else None
    if cluster is None:
        conductor = Scheduler(settings.cost, policy=settings.policy, config=settings.scheduler)
    else:
        conductor = ReplicaScheduler(
            settings.cost, policy=settings.policy, config=settings.scheduler
        )  # its tie-break stagger is its rank, set by the replica sync
    conductor.decode_policy = ColocatedDecode(conductor.decode_policy)
    return conductor


def build_gateway(settings: ServeSettings) -> Gateway:
    """The gateway of ``settings``: a scheduler and a tokenizer per model."""
    from conductor.gateway.service import Gateway
    from conductor.hf.tokenizer import HfTokenizer

    if settings.models:
        pools = {
            m.model.name: (build_conductor(m), HfTokenizer.load(m.path)) for m in settings.models
        }
        return Gateway(settings.gateway, pools=pools)
    tokenizer = HfTokenizer.load(settings.model_path)
    return Gateway(settings.gateway, build_conductor(settings), tokenizer)


def run_server(settings: ServeSettings, reuse_port: bool = False) -> None:
    """Serve until SIGINT/SIGTERM (``--workers N``: supervise N of these, see
    :mod:`conductor.cli.cluster_serve`)."""
    if settings.workers > 1:
        cluster_serve.run_workers(settings, run_server)
        return
    from conductor.gateway import app
    from conductor.web.server import run, serve_until_stopped

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream call
    if settings.cluster is not None:
        settings = replace(settings, cluster=cluster_serve.replica_id(settings.cluster))
    gateway = build_gateway(settings)
    conductor = gateway.conductor
    host, port = settings.gateway.host, settings.gateway.port
    lifespan = app.lifespan(gateway)
    if settings.cluster is not None:
        assert isinstance(conductor, ReplicaScheduler)
        cluster = settings.cluster
        log.info("conductor serve: replica %s of %s", cluster.replica_id, cluster.url)
        lifespan = cluster_serve.with_sync(
            lifespan,
            cluster,
            conductor,
            gateway.metrics.registry,
            gateway.clock,
            gateway.pools.first.hold,
        )
    sock = cluster_serve.reuse_port_socket(host, port) if reuse_port else None

    def ready(server: object) -> None:
        # What start-up built (modules, tokenizer, config, the engines' state) lives as long
        # as the process: out of the collector's way, so a full collection under load walks
        # only what requests allocate (start-up's full collections took up to 64 ms here).
        gc.collect()
        gc.freeze()
        log.info("conductor serve: listening on http://%s:%d", host, port)

    async def main() -> None:
        await serve_until_stopped(
            app.server(gateway),
            host=host,
            port=port,
            lifespan=lifespan,
            grace_s=SHUTDOWN_GRACE_S,
            on_ready=ready,
            sock=sock,
        )

    run(main)


def _default(key: str) -> str:
    """A key's default as the help shows it: ``30`` for 30.0, ``off`` for False, ``4 MiB``."""
    value = DEFAULTS[key]
    if isinstance(value, bool):
        return "on" if value else "off"
    if key == "max_body_bytes" and isinstance(value, int) and value % (1 << 20) == 0:
        return f"{value >> 20} MiB"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve_cmd(
        config: Annotated[
            Path | None,
            typer.Option("--config", help="TOML file: [gateway], [[engines]], [[models]]"),
        ] = None,
        engine: Annotated[
            list[str] | None,
            typer.Option(
                "--engine",
                help="URL,role=prefill|decode|both[,kv_events=tcp://h:p][,replay=tcp://h:p]"
                "[,model=NAME][,block_size=N][,id=NAME][,topic=T]; repeatable",
            ),
        ] = None,
        model_path: Annotated[
            str | None,
            typer.Option("--model-path", help="local model folder (tokenizer, chat template)"),
        ] = None,
        model_name: Annotated[
            str | None, typer.Option("--model-name", help="model name clients use")
        ] = None,
        max_model_len: Annotated[
            int | None, typer.Option("--max-model-len", help="default: the model's config.json")
        ] = None,
        block_size: Annotated[
            int | None,
            typer.Option("--block-size", help=f"engines' KV block size [{_default('block_size')}]"),
        ] = None,
        policy: Annotated[
            str | None,
            typer.Option(
                "--policy", help=f"{', '.join(sorted(policy_names()))} [{_default('policy')}]"
            ),
        ] = None,
        admission: Annotated[
            str | None,
            typer.Option("--admission", help="off|baseline|early|predictive [policy's own]"),
        ] = None,
        preset: Annotated[
            str | None,
            typer.Option(
                "--preset", help=f"cost model: {', '.join(sorted(PRESETS))} [{_default('preset')}]"
            ),
        ] = None,
        cost_file: Annotated[
            str | None,
            typer.Option(
                "--cost-file", help="cost model from `conductor profile` (not with --preset)"
            ),
        ] = None,
        prefill_tokens_per_s: Annotated[
            float | None,
            typer.Option("--prefill-tokens-per-s", help="calibrate: measured prefill rate"),
        ] = None,
        decode_step_ms: Annotated[
            float | None,
            typer.Option("--decode-step-ms", help="calibrate: measured decode step time"),
        ] = None,
        ttft_slo_s: Annotated[
            float | None, typer.Option("--ttft-slo-s", help=f"TTFT SLO [{_default('ttft_slo_s')}]")
        ] = None,
        tbt_slo_ms: Annotated[
            float | None, typer.Option("--tbt-slo-ms", help=f"TBT SLO [{_default('tbt_slo_ms')}]")
        ] = None,
        admin_token: Annotated[
            str | None,
            typer.Option(
                "--admin-token",
                envvar=ADMIN_TOKEN_ENV,
                show_envvar=True,
                help="bearer token of the admin API (none: admin API disabled)",
            ),
        ] = None,
        host: Annotated[str | None, typer.Option("--host", help=f"[{_default('host')}]")] = None,
        port: Annotated[int | None, typer.Option("--port", help=f"[{_default('port')}]")] = None,
        max_body_bytes: Annotated[
            int | None, typer.Option("--max-body-bytes", help=f"[{_default('max_body_bytes')}]")
        ] = None,
        request_timeout_s: Annotated[
            float | None,
            typer.Option(
                "--request-timeout-s", help=f"per request [{_default('request_timeout_s')}]"
            ),
        ] = None,
        read_timeout_s: Annotated[
            float | None,
            typer.Option(
                "--read-timeout-s",
                help=f"between upstream bytes [{_default('read_timeout_s')}]",
            ),
        ] = None,
        connect_timeout_s: Annotated[
            float | None,
            typer.Option("--connect-timeout-s", help=f"[{_default('connect_timeout_s')}]"),
        ] = None,
        max_attempts: Annotated[
            int | None,
            typer.Option(
                "--max-attempts", help=f"schedules per request [{_default('max_attempts')}]"
            ),
        ] = None,
        kv_transfer_params: Annotated[
            bool | None,
            typer.Option(
                "--kv-transfer-params/--no-kv-transfer-params",
                help="P/D legs carry kv_transfer_params (NIXL/Mooncake connectors) "
                f"[{_default('kv_transfer_params')}]",
            ),
        ] = None,
        health_interval_s: Annotated[
            float | None,
            typer.Option("--health-interval-s", help=f"[{_default('health_interval_s')}]"),
        ] = None,
        load_interval_s: Annotated[
            float | None,
            typer.Option(
                "--load-interval-s",
                help=f"engine /metrics polls [{_default('load_interval_s')}]",
            ),
        ] = None,
        seed: Annotated[
            int | None, typer.Option("--seed", help=f"scheduler seed [{_default('seed')}]")
        ] = None,
        log_level: Annotated[
            str | None,
            typer.Option("--log-level", help=f"debug|info|warning|error [{_default('log_level')}]"),
        ] = None,
        max_connections: Annotated[
            int | None,
            typer.Option("--max-connections", help=f"[{_default('max_connections')}]"),
        ] = None,
        set_: Annotated[
            list[str] | None,
            typer.Option(
                "--set",
                help="KEY=VALUE: any [gateway] key (limits, timeouts...), value in TOML "
                "syntax; repeatable (docs/gateway.md lists the keys)",
            ),
        ] = None,
        cluster: Annotated[
            str | None,
            typer.Option("--cluster", help="nats://HOST:PORT: sync with the other replicas there"),
        ] = None,
        replica_id: Annotated[
            str | None,
            typer.Option("--replica-id", help="this replica's name [<hostname>-<pid>]"),
        ] = None,
        workers: Annotated[
            int | None,
            typer.Option(
                "--workers",
                help="gateway processes on one port (SO_REUSEPORT), synced like replicas "
                f"(a local nats-server without --cluster) [{_default('workers')}]",
            ),
        ] = None,
        check: Annotated[
            bool, typer.Option("--check", help="print the resolved configuration and exit")
        ] = False,
    ) -> None:
        """Serve the OpenAI API in front of vLLM engines, scheduled by conductor."""
        cli: dict[str, object | None] = {
            "model_path": model_path,
            "model_name": model_name,
            "max_model_len": max_model_len,
            "block_size": block_size,
            "policy": policy,
            "admission": admission,
            "preset": preset,
            "cost_file": cost_file,
            "prefill_tokens_per_s": prefill_tokens_per_s,
            "decode_step_ms": decode_step_ms,
            "ttft_slo_s": ttft_slo_s,
            "tbt_slo_ms": tbt_slo_ms,
            "admin_token": admin_token,
            "host": host,
            "port": port,
            "max_body_bytes": max_body_bytes,
            "request_timeout_s": request_timeout_s,
            "read_timeout_s": read_timeout_s,
            "connect_timeout_s": connect_timeout_s,
            "max_attempts": max_attempts,
            "kv_transfer_params": kv_transfer_params,
            "health_interval_s": health_interval_s,
            "load_interval_s": load_interval_s,
            "seed": seed,
            "log_level": log_level,
            "max_connections": max_connections,
            "cluster": cluster,
            "replica_id": replica_id,
            "workers": workers,
        }
        try:
            settings = build_settings(cli, list(engine or []), config, list(set_ or []))
        except ConductorError as exc:
            raise _fail(str(exc)) from None
        if check:
            typer.echo(json.dumps(settings.describe(), indent=2))
            return
        try:
            run_server(settings)
        except ConductorError as exc:
            raise _fail(str(exc)) from None


__all__ = ["build_conductor", "build_gateway", "register"]
