"""``conductor serve --cluster URL`` and ``--workers N``: replicas that sync over NATS.

With ``--cluster``, the gateway's scheduler is a
:class:`~conductor.core.replication.ReplicaScheduler` and a
:class:`~conductor.cluster.sync.ReplicaSync` over NATS runs beside the gateway (its gauges on
the gateway's ``/metrics``). With ``--workers N``, this process supervises N worker
processes that each serve the same port (``SO_REUSEPORT``: the kernel spreads connections
over them) and sync exactly like replicas: over ``--cluster`` when given, else over a
nats-server this process starts on loopback.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from conductor.cli.serve_config import ServeSettings
from conductor.cluster.config import ClusterConfig
from conductor.core.errors import InvalidInput
from conductor.core.late_binding_rule import claim_lag_s
from conductor.core.replication import ReplicaScheduler

if TYPE_CHECKING:
    from conductor.gateway.hold import Hold

log = logging.getLogger("conductor.serve")


def replica_id(cluster: ClusterConfig) -> ClusterConfig:
    """``cluster`` with a replica id: the one given, else ``<hostname>-<pid>``."""
    if cluster.replica_id:
        return cluster
    return replace(cluster, replica_id=f"{socket.gethostname()}-{os.getpid()}")


def with_sync(
    gateway_lifespan: AbstractAsyncContextManager[Any],
    cluster: ClusterConfig,
    conductor: ReplicaScheduler,
    registry: Any,
    clock: Callable[[], float],
    hold: Hold | None = None,
) -> AbstractAsyncContextManager[Any]:
    """The gateway's lifespan with the replica sync running inside it."""
    from conductor.cluster.nats_backend import NatsTransport
    from conductor.cluster.sync import ReplicaSync

    transport = NatsTransport(
        cluster.url, cluster.subject, f"conductor-{cluster.replica_id}", cluster.reconnect_s
    )
    sync = ReplicaSync(cluster, conductor, transport, clock)
    registry.register(sync.collector())
    if hold is not None:  # the hold queue claims freed instances in its turn
        lag_s = claim_lag_s(cluster.flush_s)
        sync.on_members = lambda: hold.set_claim(*sync.claim_slot(), lag_s)
        sync.on_members()

    @contextlib.asynccontextmanager
    async def both() -> AsyncIterator[None]:
        async with gateway_lifespan, sync.running():
            yield

    return both()


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket that other processes may bind too (``SO_REUSEPORT``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def run_workers(settings: ServeSettings, target: Callable[[ServeSettings, bool], None]) -> None:
    """Start ``settings.workers`` processes running ``target(worker_settings, True)`` and wait
    for them; SIGINT/SIGTERM are passed on. Without a cluster URL, a loopback nats-server is
    started for them and stopped at the end."""
    from conductor.cluster.embedded import NatsServer

    if settings.gateway.port == 0:
        raise InvalidInput("port", 0, "--workers > 1 share one fixed port; give one")
    logging.basicConfig(level=settings.log_level.upper())
    embedded: NatsServer | None = None
    cluster = settings.cluster
    if cluster is None:
        embedded = NatsServer().start()
        cluster = ClusterConfig(url=embedded.url, replica_id=settings.replica_id)
        log.info("conductor serve: embedded nats-server at %s", embedded.url)
    base = replica_id(cluster).replica_id
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(
            target=target,
            args=(
                replace(settings, workers=1, cluster=replace(cluster, replica_id=f"{base}-w{i}")),
                True,
            ),
            name=f"conductor-worker-{i}",
        )
        for i in range(settings.workers)
    ]

    def forward(signum: int, _frame: object) -> None:
        for p in procs:
            if p.pid is not None and p.is_alive():
                os.kill(p.pid, signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for p in procs:
            p.start()
        log.info("conductor serve: %d workers on port %d", len(procs), settings.gateway.port)
        for p in procs:
            p.join()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
        if embedded is not None:
            embedded.stop()
