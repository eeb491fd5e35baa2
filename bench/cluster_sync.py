"""CPU cost of the replica sync per request: what one replica spends to publish its own
reservations and to apply another replica's (encode, decode, bookkeeping), and the round
trip through a real nats-server (started here on loopback).

    python bench/cluster_sync.py [--requests 20000] [--instances 16] [--json PATH]

The scheduler's own cost is measured plain and as a ``ReplicaScheduler`` alternately, three
times each (medians), since the host is shared.

Per request a replica publishes 3 events (plan committed, prefill done, released); with N
replicas at a cluster rate R, each replica decides R/N requests and applies R (N-1)/N
others', so its CPU is ``R/N * c_request + R (N-1)/N * c_apply`` (docs/cluster.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from conductor.cluster.config import ClusterConfig
from conductor.cluster.embedded import NatsServer
from conductor.cluster.nats_backend import NatsTransport
from conductor.cluster.protocol import Batch, decode, encode, from_wire, to_wire
from conductor.cluster.sync import ReplicaSync
from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import preset
from conductor.core.events import PrefillFinished, RequestFinished
from conductor.core.hashing import hash_blocks
from conductor.core.plan import Plan
from conductor.core.replication import ReplicaScheduler
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceSpec
from conductor.core.types import InstanceId, Request, RequestId, Role


def make(kind: type[Scheduler], n: int) -> Scheduler:
    s = kind(preset("llama3-70b-a800x8"), config=SchedulerConfig(admission="off"))
    for i in range(n):
        s.add_instance(InstanceSpec(InstanceId(f"p{i}"), Role.PREFILL))
        s.add_instance(InstanceSpec(InstanceId(f"d{i}"), Role.DECODE))
    return s


def requests(n: int) -> list[Request]:
    out = []
    for i in range(n):
        tokens = [i % 64] * 512 + list(range(i, i + 1536))
        out.append(Request(RequestId(f"r{i}"), len(tokens), tuple(hash_blocks(tokens, 512)), 64))
    return out


def lifecycle(s: Scheduler, reqs: list[Request]) -> float:
    """CPU seconds to schedule, prefill-finish and finish every request (in waves of 64)."""
    t0 = time.process_time()
    for k in range(0, len(reqs), 64):
        wave = reqs[k : k + 64]
        plans = [s.schedule(r, float(k)) for r in wave]
        for p in plans:
            assert isinstance(p, Plan)
            s.on_event(PrefillFinished(p.request_id, p.prefill, k + 0.5))
        for p in plans:
            assert isinstance(p, Plan)
            s.on_event(RequestFinished(p.request_id, p.decode, k + 1.0))
        if isinstance(s, ReplicaScheduler):
            s.outbox.clear()
    return time.process_time() - t0


def publish_apply(n_inst: int, reqs: list[Request]) -> tuple[float, float, int]:
    """(CPU s to encode the batches, CPU s to decode and apply them on a peer, bytes)."""
    a = make(ReplicaScheduler, n_inst)
    b = make(ReplicaScheduler, n_inst)
    assert isinstance(a, ReplicaScheduler) and isinstance(b, ReplicaScheduler)
    batches: list[bytes] = []
    enc = 0.0
    for k in range(0, len(reqs), 64):
        wave = reqs[k : k + 64]
        plans = [a.schedule(r, float(k)) for r in wave]
        for p in plans:
            assert isinstance(p, Plan)
            a.on_event(PrefillFinished(p.request_id, p.prefill, k + 0.5))
            a.on_event(RequestFinished(p.request_id, p.decode, k + 1.0))
        t0 = time.process_time()
        for i in range(0, len(a.outbox), 8):  # batches of 8 events, as a busy loop pass makes
            chunk = a.outbox[i : i + 8]
            batches.append(encode(Batch("A", len(batches) + 1, [to_wire(e) for e in chunk])))
        enc += time.process_time() - t0
        a.outbox.clear()
    t0 = time.process_time()
    for data in batches:
        msg = decode(data)
        assert isinstance(msg, Batch)
        for w in msg.events:
            b.remote.apply("A", from_wire(w), 1.0)
    apply = time.process_time() - t0
    return enc, apply, sum(len(x) for x in batches)


async def nats_round_trip(n_inst: int, reqs: list[Request], wave: int = 64) -> dict[str, float]:
    """Replica A schedules everything, ``wave`` requests per event-loop pass; the
    wall and CPU time (both replicas are in this process) until B has applied it all."""
    with NatsServer() as ns:
        syncs = []
        for name in ("A", "B"):
            cfg = ClusterConfig(url=ns.url, replica_id=name)
            sched = make(ReplicaScheduler, n_inst)
            assert isinstance(sched, ReplicaScheduler)
            syncs.append(
                ReplicaSync(
                    cfg, sched, NatsTransport(ns.url, cfg.subject, name, 0.5), time.monotonic
                )
            )
        a, b = syncs
        async with a.running(), b.running():
            while not (a.connected and b.connected and a.peers and b.peers):
                await asyncio.sleep(0.01)
            t0, c0 = time.perf_counter(), time.process_time()
            for k in range(0, len(reqs), wave):
                for r in reqs[k : k + wave]:
                    p = a.scheduler.schedule(r, time.monotonic())
                    assert isinstance(p, Plan)
                    a.scheduler.on_event(RequestFinished(p.request_id, p.decode, time.monotonic()))
                await asyncio.sleep(0)
            while b.counters["batches_received"] < a.counters["batches_sent"]:
                await asyncio.sleep(0.001)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {
            "requests": len(reqs),
            "requests_per_loop_pass": wave,
            "wall_s": round(wall, 3),
            "cpu_us_per_request": round(cpu / len(reqs) * 1e6, 1),
            "batches": a.counters["batches_sent"],
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--instances", type=int, default=16, help="prefill (and decode) instances")
    ap.add_argument("--json", dest="json_path", type=Path)
    args = ap.parse_args()
    reqs = requests(args.requests)
    n = len(reqs)
    plains, replicas = [], []
    for _ in range(3):  # alternating, medians: the host is shared
        plains.append(lifecycle(make(Scheduler, args.instances), reqs))
        replicas.append(lifecycle(make(ReplicaScheduler, args.instances), reqs))
    plain, replica = statistics.median(plains), statistics.median(replicas)
    enc, apply, size = publish_apply(args.instances, reqs)
    trip = asyncio.run(nats_round_trip(args.instances, reqs[:5000]))
    trip1 = asyncio.run(nats_round_trip(args.instances, reqs[:5000], wave=1))
    out = {
        "requests": n,
        "instances_each_side": args.instances,
        "scheduler_us_per_request": round(plain / n * 1e6, 2),
        "replica_scheduler_us_per_request": round(replica / n * 1e6, 2),
        "encode_us_per_request": round(enc / n * 1e6, 2),
        "apply_us_per_remote_request": round(apply / n * 1e6, 2),
        "wire_bytes_per_request": round(size / n, 1),
        "nats_round_trip": trip,
        "nats_round_trip_unbatched": trip1,
    }
    for k, v in out.items():
        print(f"{k}: {v}")
    if args.json_path:
        args.json_path.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
