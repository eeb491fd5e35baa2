"""The distributed conductor: scheduler replicas that share their reservations.

``protocol`` the messages (msgspec) and the small :class:`~conductor.cluster.protocol.Transport`
protocol every backend implements; ``nats_backend`` the NATS transport; ``sync`` the replica
(publishing the local reservations, applying the others', membership by heartbeat, degraded
mode and resync); ``config`` its frozen configuration; ``embedded`` a local nats-server.
Imports only ``core`` (docs/architecture.md, "A replica-sync backend").
"""
