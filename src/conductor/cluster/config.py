"""The replica-sync configuration (frozen; every default defined here once)."""

from __future__ import annotations

from dataclasses import dataclass

from conductor.core.checks import check_positive
from conductor.core.errors import InvalidInput

SUBJECT_PREFIX = "conductor.sync"


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """``url``: the NATS server (``nats://host:port``); ``replica_id``: this replica's name,
    unique in the cluster (empty: the CLI derives one from host and pid); ``cluster_name``
    scopes the subject, so several clusters can share one NATS server.
    ``heartbeat_s``: how often a replica says it is alive; ``expiry_s``: after how long
    without a word from a replica its reservations are dropped; ``reconnect_s``: the wait
    between connection attempts while NATS is unreachable; ``flush_s``: how long reservation
    events gather before they go out as one batch (a batch costs ~70 µs of CPU on the two
    ends, an event ~5-15 µs: ``bench/cluster_sync.py``; the lag it adds is harmless well
    beyond it, docs/cluster.md)."""

    url: str
    replica_id: str = ""
    cluster_name: str = "default"
    heartbeat_s: float = 0.5
    expiry_s: float = 2.0
    reconnect_s: float = 0.5
    flush_s: float = 0.002

    def __post_init__(self) -> None:
        if not self.url.startswith(("nats://", "tls://")):
            raise InvalidInput("cluster", self.url, "must be a nats:// URL")
        for name in ("heartbeat_s", "expiry_s", "reconnect_s", "flush_s"):
            check_positive(name, getattr(self, name))
        if self.expiry_s <= self.heartbeat_s:
            raise InvalidInput(
                "expiry_s", self.expiry_s, f"must be > heartbeat_s ({self.heartbeat_s})"
            )
        if "/" in self.replica_id or " " in self.replica_id:
            raise InvalidInput("replica_id", self.replica_id, "must not contain '/' or spaces")
        if not self.cluster_name or any(c in self.cluster_name for c in " .*>"):
            raise InvalidInput("cluster_name", self.cluster_name, "must be a non-empty NATS token")

    @property
    def subject(self) -> str:
        return f"{SUBJECT_PREFIX}.{self.cluster_name}"
