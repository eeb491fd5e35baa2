"""The simulator's event queue: a total order by (time, seq), typed payloads."""

from __future__ import annotations

import heapq
from types import SimpleNamespace

import pytest

import conductor.sim.simulator as simulator
from conductor.core.config import SchedulerConfig
from conductor.core.events import BlocksRemoved, BlocksStored
from conductor.core.plan import Plan
from conductor.core.types import BlockHash, InstanceId, Request, RequestId, Role, Tier
from conductor.sim import SimConfig, max_tokens_outputs, simulate
from conductor.sim.cache import LruBlockCache
from conductor.sim.events import (
    Arrival,
    CopyDone,
    DecodeJoin,
    EngineStep,
    EventQueue,
    FetchDone,
    KvEventDue,
    SimEvent,
    Wakeup,
)
from conductor.sim.nodes import Engine, Seq

KINDS = (Arrival, FetchDone, DecodeJoin, EngineStep, KvEventDue, CopyDone, Wakeup)


def _engine(name: str, role: Role) -> Engine:
    cache = LruBlockCache(None) if role.prefills else None
    return Engine(InstanceId(name), role, cache, 1000, 4, 8192, 0, 16)


def _req(i: int, t: float, blocks: tuple[int, ...], out: int = 3) -> Request:
    hashes = tuple(BlockHash(b) for b in blocks)
    return Request(RequestId(f"r{i}"), 512 * len(blocks), hashes, out, t)


def test_queue_pops_by_time_then_push_order_with_exact_payloads() -> None:
    p = _engine("prefill-0", Role.PREFILL)
    d = _engine("decode-0", Role.DECODE)
    req = _req(0, 0.0, (1, 2))
    plan = Plan(req.request_id, p.iid, d.iid, "test", 0, None, 1.0, 0.0, 0.0, 1.0, 0.05)
    job = Seq(0, plan, req.prompt_tokens, 3, decodes=False)
    hashes = (BlockHash(1), BlockHash(2))
    kv = BlocksStored(p.iid, hashes, Tier.DRAM)
    q = EventQueue()
    pushed: list[tuple[float, SimEvent]] = [
        (2.0, Arrival(7)),
        (1.0, FetchDone(job, hashes)),
        (2.0, EngineStep(p)),
        (0.5, DecodeJoin(d.iid, 7)),
        (2.0, EngineStep(d)),
        (1.0, KvEventDue(kv)),
        (0.5, CopyDone(p, hashes)),
    ]
    for t, ev in pushed:
        q.push(t, ev)
    popped = [q.pop() for _ in pushed]
    assert not q.heap
    # ties at one time keep push order: seq is the push count
    assert [(t, seq, type(ev)) for t, seq, ev in popped] == [
        (0.5, 4, DecodeJoin),
        (0.5, 7, CopyDone),
        (1.0, 2, FetchDone),
        (1.0, 6, KvEventDue),
        (2.0, 1, Arrival),
        (2.0, 3, EngineStep),
        (2.0, 5, EngineStep),
    ]
    steps = [ev for _, _, ev in popped if isinstance(ev, EngineStep)]
    assert [s.engine for s in steps] == [p, d]
    by_kind = {type(ev): ev for _, _, ev in popped}
    arrival = by_kind[Arrival]
    assert isinstance(arrival, Arrival) and arrival.index == 7
    fetch = by_kind[FetchDone]
    assert isinstance(fetch, FetchDone) and fetch.seq is job and fetch.fetched == hashes
    join = by_kind[DecodeJoin]
    assert isinstance(join, DecodeJoin) and (join.decode, join.index) == (d.iid, 7)
    due = by_kind[KvEventDue]
    assert isinstance(due, KvEventDue) and due.event is kv
    copy = by_kind[CopyDone]
    assert isinstance(copy, CopyDone) and copy.engine is p and copy.hashes == hashes


def _record_pops(
    monkeypatch: pytest.MonkeyPatch,
) -> list[tuple[float, int, SimEvent]]:
    """Every ``(time, seq, event)`` the simulator's loop pops, in order."""
    popped: list[tuple[float, int, SimEvent]] = []

    def pop(heap: list[tuple[float, int, SimEvent]]) -> tuple[float, int, SimEvent]:
        item = heapq.heappop(heap)
        popped.append(item)
        return item

    monkeypatch.setattr(simulator, "heapq", SimpleNamespace(heappop=pop))
    return popped


@pytest.mark.parametrize(
    ("policy", "kinds"),
    [
        # sglang piles a hot prefix on one holder: background copies; KV events delayed
        ("sglang", {Arrival, DecodeJoin, EngineStep, KvEventDue, CopyDone}),
        # conductor fetches the prefix to a less loaded instance instead, and holds requests
        # until an instance is free (late binding: woken at its predicted end)
        ("conductor", {Arrival, FetchDone, DecodeJoin, EngineStep, KvEventDue, Wakeup}),
    ],
)
def test_a_run_pops_typed_events_in_time_then_seq_order(
    monkeypatch: pytest.MonkeyPatch, policy: str, kinds: set[type]
) -> None:
    hot = tuple(range(1, 61))
    reqs = [_req(0, 0.0, (*hot, 10_000, 20_000))]
    reqs += [
        _req(i, 10.0 + 0.1 * i, (*hot, 10_000 + i, 20_000 + i), out=2 + i % 3)
        for i in range(1, 120)
    ]
    popped = _record_pops(monkeypatch)
    sched = SchedulerConfig(replication_enabled=True)
    cfg = SimConfig(policy=policy, n_prefill=3, n_decode=1, scheduler=sched, kv_event_delay_s=0.01)
    res = simulate(reqs, cfg, outputs=max_tokens_outputs(reqs))
    assert res.summary["completed"] == len(reqs)
    keys = [(t, seq) for t, seq, _ in popped]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    seen = {type(ev) for _, _, ev in popped}
    assert seen == kinds
    assert sum(1 for _, _, ev in popped if type(ev) is Arrival) == len(reqs)
    assert sum(1 for _, _, ev in popped if type(ev) is CopyDone) == res.copies
    for _, _, ev in popped:
        assert type(ev) in KINDS
        if isinstance(ev, EngineStep):
            assert type(ev.engine) is Engine
        elif isinstance(ev, FetchDone):
            assert type(ev.seq) is Seq and type(ev.fetched) is tuple
        elif isinstance(ev, CopyDone):
            assert type(ev.engine) is Engine and type(ev.hashes) is tuple
        elif isinstance(ev, DecodeJoin):
            assert type(ev.decode) is str and type(ev.index) is int
        elif isinstance(ev, KvEventDue):
            assert type(ev.event) in (BlocksStored, BlocksRemoved)
