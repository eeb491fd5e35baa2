"""Scheduler replicas in the simulator: lagging views herd, exact sync does not; the
run-level contract (`--replicas 1` is the plain scheduler; every request accounted for)."""

from __future__ import annotations

from dataclasses import replace

from conductor.core.config import SchedulerConfig
from conductor.core.events import PrefillFinished
from conductor.core.plan import Plan
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceSpec
from conductor.core.types import InstanceId, Request, RequestId, Role
from conductor.sim.config import SimConfig
from conductor.sim.replicas import ReplicaSet, make_scheduler
from conductor.sim.simulator import simulate
from conductor.workload.trace import (
    bundled_trace_path,
    generated_tokens,
    read_trace,
    records_to_requests,
)
from tests.core.helpers import LINEAR_COST, hashes


def replica_set(delay_s: float, stagger: bool) -> ReplicaSet:
    s = ReplicaSet(
        LINEAR_COST, "least_loaded", SchedulerConfig(block_size_tokens=4), 2, delay_s,
        stagger=stagger,
    )  # fmt: skip
    for i in range(2):
        s.add_instance(InstanceSpec(InstanceId(f"p{i}"), Role.PREFILL))
        s.add_instance(InstanceSpec(InstanceId(f"d{i}"), Role.DECODE))
    return s


def burst(s: Scheduler, t: float = 0.0) -> list[str]:
    out = []
    for k in range(2):
        p = s.schedule(Request(RequestId(f"r{k}@{t}"), 400, hashes(*range(100)), 10), t)
        assert isinstance(p, Plan)
        out.append(p.prefill)
    return out


def test_synced_replicas_spread_a_burst() -> None:
    assert burst(replica_set(0.0, stagger=False)) == ["p0", "p1"]


def test_lagging_replicas_herd_unless_they_stagger() -> None:
    assert burst(replica_set(0.010, stagger=False)) == ["p0", "p0"]
    assert burst(replica_set(0.010, stagger=True)) == ["p0", "p1"]


def test_views_catch_up_after_the_delay() -> None:
    s = replica_set(0.010, stagger=False)
    burst(s)
    peer = s.peers[1]
    assert peer.remote.count("r0") == 0  # not delivered yet
    s.on_event(PrefillFinished(RequestId("r0@0.0"), InstanceId("p0"), 0.005))
    burst(s, 0.020)  # replica 1 decides at 0.020: it has applied r0's plan and prefill end
    assert peer.remote.count("r0") == 1
    assert peer.remote.by_replica["r0"][RequestId("r0@0.0")].prefill_done


def test_one_replica_is_the_plain_scheduler_and_n_replicas_account_for_all() -> None:
    cfg = SimConfig()
    assert type(make_scheduler(cfg)) is Scheduler
    records = read_trace(bundled_trace_path(), limit=300).records
    requests, outputs = records_to_requests(records), generated_tokens(records)
    one = simulate(requests, cfg, outputs=outputs).summary
    four = simulate(requests, replace(cfg, replicas=4, sync_delay_s=0.01), outputs=outputs).summary
    assert four["requests"] == one["requests"] == 300
    assert four["completed"] + four["rejected"] == 300  # type: ignore[operator]
