"""A decode engine's own prefix cache (``SimConfig.decode_cache``,
:mod:`conductor.sim.decode_cache`): a finished request's prompt blocks stay in the engine's
free KV blocks, its KV events reach the scheduler's decode index, and a later hand-off of a
prompt that starts with them carries only the rest."""

from __future__ import annotations

import pytest

from conductor.core.config import SchedulerConfig
from conductor.core.types import BlockHash, InstanceId, Request, RequestId
from conductor.sim import SimConfig, simulate
from conductor.sim.config import EngineConfig
from conductor.sim.simulator import _Simulation

PROMPT = 4096  # 8 trace blocks of 512 tokens
BLOCKS = tuple(BlockHash(b) for b in range(PROMPT // 512))


def _cfg(decode_cache: bool, kv_tokens: int | None = None) -> SimConfig:
    """Round robin, no admission, 1P+1D, the hand-off after the prefill (so its length
    shows in the join time)."""
    return SimConfig(
        policy="round_robin",
        n_prefill=1,
        n_decode=1,
        scheduler=SchedulerConfig(admission="off"),
        handoff="serial",
        decode_cache=decode_cache,
        engine=EngineConfig(kv_capacity_tokens=kv_tokens),
    )


def _two(second_blocks: tuple[BlockHash, ...]) -> list[Request]:
    """The second request arrives 60 s after the first, long after it finished."""
    return [
        Request(RequestId("r0"), PROMPT, BLOCKS, 4, 0.0),
        Request(RequestId("r1"), PROMPT + 512, second_blocks, 4, 60.0),
    ]


def _transfer(tokens: int) -> float:
    return SimConfig().cost.transfer_s(tokens)


def test_a_prompt_that_starts_with_a_decoded_one_hands_off_only_the_rest() -> None:
    reqs = _two((*BLOCKS, BlockHash(99)))
    on = simulate(reqs, _cfg(True), outputs=[4, 4]).records
    off = simulate(reqs, _cfg(False), outputs=[4, 4]).records
    assert [r.handoff_held_tokens for r in on] == [0, PROMPT]
    assert [r.handoff_held_tokens for r in off] == [0, 0]
    second = on[1]
    assert second.prefill_end_s is not None and second.decode_join_s is not None
    assert second.decode_join_s == pytest.approx(second.prefill_end_s + _transfer(512), abs=1e-12)
    assert off[1].decode_join_s == pytest.approx(
        second.prefill_end_s + _transfer(PROMPT + 512), abs=1e-12
    )
    assert simulate(reqs, _cfg(True), outputs=[4, 4]).summary["handoff_held_tokens"] == PROMPT


def test_only_the_leading_blocks_count() -> None:
    other = (BlockHash(50), *BLOCKS)  # the same blocks behind a different first one
    on = simulate(_two(other), _cfg(True), outputs=[4, 4]).records
    assert on[1].handoff_held_tokens == 0


def test_the_cache_lives_in_the_free_kv_blocks() -> None:
    """The engine has room for the second prompt and two more blocks: as the second joins,
    all of the first's blocks but its head two are evicted (its tail first, as vLLM frees
    them); once the second left, its two blocks are kept beside them."""
    reqs = _two((BlockHash(60), BlockHash(61)))
    sim = _Simulation(reqs, _cfg(True, kv_tokens=PROMPT + 1024 + 512), [4, 4])
    sim.run(None)
    cache = sim.engines[InstanceId("decode-0")].cache
    assert cache is not None
    assert [h in cache for h in BLOCKS] == [True, True] + [False] * (len(BLOCKS) - 2)
    assert [BlockHash(60) in cache, BlockHash(61) in cache] == [True, True]


def test_the_scheduler_sees_the_decode_engines_blocks_apart_from_the_prefill_index() -> None:
    reqs = _two((*BLOCKS, BlockHash(99)))
    sim = _Simulation(reqs, _cfg(True), [4, 4])
    sim.run(None)
    decode = InstanceId("decode-0")
    held = sim.scheduler.decode_index.held_blocks((*BLOCKS, BlockHash(99)))
    assert held == {decode: len(BLOCKS) + 1}
    assert decode not in sim.scheduler.index.match(BLOCKS).local_blocks
