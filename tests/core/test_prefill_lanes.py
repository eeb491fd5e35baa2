"""Engines that prefill several prompts side by side (``InstanceSpec.prefill_lanes``): the
predicted wait of a new prefill is processor sharing among at most ``lanes`` prompts, first
come first served, not the whole queue. Exact values.

Cost model (helpers): prefill 1 ms per new token, block 4 tokens.
"""

from __future__ import annotations

import pytest

from conductor.core.plan import Plan
from conductor.core.scheduler import Scheduler
from conductor.core.state import InstanceSpec, PrefillState, lanes_end
from conductor.core.types import InstanceId, RequestId, Role

from .helpers import hashes, make_conductor, req


def _state(*preds: float) -> PrefillState:
    p = PrefillState()
    for k, s in enumerate(preds):
        p.assign(RequestId(f"q{k}"), s, 1000, 0.0)
    return p


def test_one_lane_is_the_queue() -> None:
    p = _state(20.0, 5.0)
    assert p.wait_s(0.0, 0.1, 1) == 25.0 == p.queue_s(0.0)
    assert p.wait_s(30.0, 0.1, 2) == 0.0  # nothing left


def test_a_short_prefill_shares_the_engine_with_a_long_one() -> None:
    """Behind one 20 s prefill, a 0.1 s one runs beside it at half speed: ends at 0.2 s."""
    assert _state(20.0).wait_s(0.0, 0.1, 2) == pytest.approx(0.1)
    # three lanes, two long ones running: a third of the speed
    assert _state(20.0, 20.0).wait_s(0.0, 0.1, 3) == pytest.approx(0.2)


def test_behind_as_many_prefills_as_lanes_it_waits_for_the_first_to_end() -> None:
    """Two 20 s prefills share two lanes and both end at 40 s; the new one then runs alone.
    Five seconds in, the backlog is 35 s: the oldest counts as 5 s done, ends at 30 s."""
    p = _state(20.0, 20.0)
    assert p.wait_s(0.0, 0.1, 2) == pytest.approx(40.0)
    assert p.wait_s(5.0, 0.1, 2) == pytest.approx(30.1)  # shares with the other from 30 s


def _two_lanes(n_prefill: int, policy: str) -> Scheduler:
    c = make_conductor(0, 1, policy=policy)
    for i in range(n_prefill):
        c.add_instance(InstanceSpec(InstanceId(f"p{i}"), Role.PREFILL, prefill_lanes=2))
    return c


@pytest.mark.parametrize("policy", ["conductor", "mooncake", "round_robin"])
def test_a_short_prompt_is_predicted_beside_a_long_one(policy: str) -> None:
    """One prefill engine with two lanes, busy with a 20,000-token prompt (20 s): a
    100-token prompt is predicted to end after 0.2 s, not after 20.1 s, by every policy's
    plan (the wait is the scheduler's) — and admitted under a 1 s TTFT SLO."""
    c = _two_lanes(1, policy)
    long = c.schedule(req("long", hashes(*range(1, 11)), 20_000), now_s=0.0)
    assert isinstance(long, Plan) and long.predicted_ttft_s == pytest.approx(20.0)
    short = c.schedule(req("short", hashes(50), 100).with_ttft_slo(1.0), now_s=0.0)
    assert isinstance(short, Plan), short
    assert short.queue_s == pytest.approx(0.1)
    assert short.predicted_ttft_s == pytest.approx(0.2)


def test_one_lane_keeps_the_queue_model() -> None:
    c = make_conductor(1, 1, policy="conductor")
    c.schedule(req("long", hashes(*range(1, 11)), 20_000), now_s=0.0)
    short = c.schedule(req("short", hashes(50), 100), now_s=0.0)
    assert isinstance(short, Plan) and short.predicted_ttft_s == pytest.approx(20.1)


def _tokens_state(*jobs: tuple[float, int]) -> PrefillState:
    p = PrefillState()
    for k, (s, n) in enumerate(jobs):
        p.assign(RequestId(f"q{k}"), s, n, 0.0)
    return p


def test_with_chunks_a_short_prompt_takes_one_step_as_long_as_both_chunks() -> None:
    """Chunks of 1,000 tokens: a 20 s prompt of 10,000 tokens takes 10 steps of 2 s alone.
    A 100-token prompt of 0.1 s beside it is one step: 2 s of the long one's chunk plus its
    own 0.1 s, so it waits 2 s (processor sharing would say 0.1 s)."""
    p = _tokens_state((20.0, 10_000))
    assert p.wait_s(0.0, 0.1, 2, 100, 1000) == pytest.approx(2.0)
    assert p.wait_s(0.0, 0.1, 2, 100, 0) == pytest.approx(0.1)
    # 3,000 tokens (3 chunks, 0.3 s): three steps of 2 + 0.1 s each
    assert p.wait_s(0.0, 0.3, 2, 3000, 1000) == pytest.approx(6.3 - 0.3)
    # half of the long one done (backlog 10 s): 5,000 tokens left, at a chunk's boundary
    assert p.wait_s(10.0, 0.1, 2, 100, 1000) == pytest.approx(2.0)
    # 1 s in, half of the long one's first chunk is done: it waits for that step's other
    # half (1 s), then shares the next (2 s)
    assert p.wait_s(1.0, 0.1, 2, 100, 1000) == pytest.approx(3.0)


def test_with_chunks_a_lane_frees_when_its_prompt_has_run_its_chunks() -> None:
    """Two lanes taken by a 4-chunk prompt (4 s) and a 2-chunk one (1 s): steps of 1.5 s
    while both run; the short one ends after 2 steps (3 s), the new 1-chunk prompt (0.2 s)
    then joins the long one's third step: 1 + 0.2 s, ending at 4.2 s."""
    p = _tokens_state((4.0, 4000), (1.0, 2000))
    assert p.wait_s(0.0, 0.2, 2, 500, 1000) == pytest.approx(4.2 - 0.2)
    assert lanes_end([4.0, 1.0, 0.2], [4000.0, 2000.0, 500.0], 0, 2, 1000) == pytest.approx(4.2)
    # one lane: after both, whatever the chunks
    assert p.wait_s(0.0, 0.2, 1, 500, 1000) == pytest.approx(5.0)


def test_the_scheduler_reads_the_engines_chunk() -> None:
    """The plan of a 100-token prompt beside a 20,000-token one on an engine with two lanes
    of 4,000-token chunks (5 of 4 s for the long prompt): one step, 4 s + its 0.1 s."""
    c = make_conductor(0, 1, policy="conductor")
    c.add_instance(
        InstanceSpec(InstanceId("p0"), Role.PREFILL, prefill_lanes=2, prefill_chunk_tokens=4000)
    )
    c.schedule(req("long", hashes(*range(1, 11)), 20_000), now_s=0.0)
    short = c.schedule(req("short", hashes(50), 100), now_s=0.0)
    assert isinstance(short, Plan), short
    assert short.queue_s == pytest.approx(4.0)
    assert short.predicted_ttft_s == pytest.approx(4.1)
