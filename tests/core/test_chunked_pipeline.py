"""Chunked pipeline parallelism planning: exact outcomes."""

from __future__ import annotations

import pytest

from conductor.core.chunked_pipeline import pipelined_prefill_s, plan_pipeline, split_chunks
from conductor.core.costmodel import preset
from conductor.core.state import InstanceSpec, InstanceState
from conductor.core.types import RequestId, Role

from .helpers import iid

COST = preset("llama3-70b-a800x8")


def test_split_chunks_near_equal_and_bounded() -> None:
    assert split_chunks(100_000, 8192) == [7693] * 4 + [7692] * 9  # 13 chunks
    assert split_chunks(8192, 8192) == [8192]
    assert split_chunks(8193, 8192) == [4097, 4096]
    assert sum(split_chunks(65_536, 8192)) == 65_536


def test_one_stage_equals_a_single_node() -> None:
    chunks = split_chunks(65_536, 8192)
    one = pipelined_prefill_s(COST, 65_536, 0, chunks, 1, 87e9)
    # the fixed per-request cost is estimated as a 1-token prefill (the overhead + one
    # token's compute), paid once instead of per chunk: equal within that token's 0.15 ms
    # per chunk after the first (7 x 0.146 ms)
    assert one == pytest.approx(COST.prefill_s(65_536, 0), abs=1.1e-3)


def test_more_stages_are_faster_but_not_linearly() -> None:
    chunks = split_chunks(100_000, 8192)
    t = [pipelined_prefill_s(COST, 100_000, 0, chunks, x, 87e9) for x in (1, 2, 4)]
    assert t[0] > t[1] > t[2]
    assert t[2] > t[0] / 4  # pipeline fill/drain and hand-offs


def _pool(queues: dict[str, tuple[float, str]]) -> list[InstanceState]:
    pool = []
    for name, (q, rack) in queues.items():
        s = InstanceState(InstanceSpec(iid(name), Role.PREFILL, rack=rack))
        if q:
            s.prefill.assign(RequestId("x"), q, 0, 0.0)
        pool.append(s)
    return pool


def test_group_is_lead_plus_idle_same_rack_first() -> None:
    pool = _pool(
        {"a": (0.0, "r1"), "b": (0.0, "r2"), "c": (0.5, "r1"), "d": (9.0, "r1"), "e": (0.0, "r1")}
    )
    plan = plan_pipeline(
        COST,
        pool[0],
        pool,
        prompt_tokens=100_000,
        cached_tokens=0,
        now_s=0.0,
        prefill_chunk_tokens=8192,
        max_nodes=4,
        max_helper_queue_s=3.0,
    )
    assert plan is not None
    # d is too busy to help; e and c share a's rack (least queued first), then b
    assert plan.nodes == (iid("a"), iid("e"), iid("c"), iid("b"))
    assert plan.queue_s == pytest.approx(0.5)
    assert plan.chunk_tokens == tuple(split_chunks(100_000, 8192))


def test_no_plan_for_one_chunk_or_no_helpers() -> None:
    pool = _pool({"a": (0.0, "r1"), "b": (5.0, "r1")})
    kw = dict(cached_tokens=0, now_s=0.0, prefill_chunk_tokens=8192, max_nodes=4)
    assert plan_pipeline(COST, pool[0], pool, prompt_tokens=8000, **kw) is None  # type: ignore[arg-type]
    assert (
        plan_pipeline(COST, pool[0], pool, prompt_tokens=100_000, max_helper_queue_s=1.0, **kw)  # type: ignore[arg-type]
        is None
    )
