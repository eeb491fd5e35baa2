"""Decode-only steps planned ahead (conductor.sim.cruise): the engine's step ends, context
and decode statistics are exactly those of the step-by-step arithmetic, with one queue event
per run of steps, and a request joining mid-run is seen at the first step end after it.

Cost: a decode step reading ``ctx`` tokens takes 10 ms + 0.1 ms per 1000 tokens."""

from __future__ import annotations

from conductor.core.costmodel import LinearDecode, preset
from conductor.core.types import InstanceId, Role
from conductor.sim import SimConfig
from conductor.sim.engine import EngineLoop
from conductor.sim.events import EngineStep, EventQueue
from conductor.sim.nodes import Engine, Seq
from conductor.sim.perturb import EngineCost
from conductor.sim.records import RequestRecord

COST = preset("llama3-70b-a800x8").with_(decode=LinearDecode(0.01, 0.0, 1e-7))


def _setup(n: int) -> tuple[EngineLoop, Engine, EventQueue]:
    records = [RequestRecord(f"r{i}", 0.0, 32, 10) for i in range(n)]
    q = EventQueue()
    loop = EngineLoop(EngineCost.of(SimConfig(cost=COST)), records, q)
    e = Engine(InstanceId("d0"), Role.DECODE, None, 1000, 8, 8192, 0, 16)
    loop.add(e)
    for i in range(n):
        loop.segments[i] = []
    return loop, e, q


def _joined(i: int, remaining: int) -> Seq:
    return Seq(i, None, 32, remaining, decodes=True, computed=32)  # its KV is here


def _run(loop: EngineLoop, q: EventQueue, until: float = float("inf")) -> list[float]:
    popped = []
    while q.heap and q.heap[0][0] < until:
        t, _, ev = q.pop()
        assert isinstance(ev, EngineStep)
        if ev.live:
            popped.append(t)
        loop.on_step_end(t, ev)
    return popped


def _by_hand(t: float, ctxs: list[int]) -> list[float]:
    ends = []
    for c in ctxs:
        t = t + (0.01 + 0.0 * 1 + 1e-7 * c)
        ends.append(t)
    return ends


def test_a_lone_decode_is_two_events_and_its_steps_are_exact() -> None:
    """10 tokens: step 0 (formed at the join), then its end plans steps 2..9 and pushes the
    10th end; the last token's end is the second and last event."""
    loop, e, q = _setup(1)
    loop.enqueue(0.0, e, _joined(0, 10))
    events = _run(loop, q)
    ends = _by_hand(0.0, [33 + i for i in range(10)])  # ctx after each step: 33, 34, ...
    assert events == [ends[0], ends[9]]
    assert e.step_ends == ends
    assert loop.segments[0] == [(e, 0, 9)]
    busy = 0.0
    for c in range(33, 43):
        busy += 0.01 + 0.0 * 1 + 1e-7 * c
    assert e.obs == [10, busy, 10, sum(range(33, 43))]  # no report yet (32 steps)
    assert not e.decoding and e.ctx == 0 and e.ahead_t == []


def test_a_join_during_a_planned_run_is_seen_at_the_next_step_end() -> None:
    """r1 joins between the 4th and 5th step ends of r0's run: the 5th end becomes an event,
    r1 decodes from step 5 on, and the steps after it read both requests' context."""
    loop, e, q = _setup(2)
    loop.enqueue(0.0, e, _joined(0, 20))
    alone = _by_hand(0.0, [33 + i for i in range(5)])
    assert _run(loop, q, until=alone[3]) == [alone[0]]  # the rest of the run is planned
    t_join = (alone[3] + alone[4]) / 2
    loop.enqueue(t_join, e, _joined(1, 3))
    events = _run(loop, q)
    # step 5 reads r0's 38 and r1's 32 + 1 (71), then 2 more a step; r1's last is step 7
    both = _by_hand(alone[4], [71, 73, 75])
    after = _by_hand(both[2], [41 + i for i in range(12)])  # r0's context alone again
    assert e.step_ends == alone + both + after
    # events: the cut end (step 5 formed with r1), step 5's end (plans 6), r1's last end,
    # then r0's last (its steps 9..19 planned at step 8's start, under the report's 32)
    assert events == [alone[4], both[0], both[2], after[-1]]
    assert loop.segments[1] == [(e, 5, 7)]
    assert loop.segments[0] == [(e, 0, 19)]
