"""The emulated engine's steps: chunked FCFS prefill, continuous batching, one forward pass
per step, prefix reuse, KV events."""

from __future__ import annotations

import pytest

from conductor.core.costmodel import preset
from conductor.core.errors import InvalidInput
from conductor.core.events import BlocksRemoved, BlocksStored
from conductor.core.hashing import hash_block, hash_blocks
from conductor.core.types import InstanceId
from conductor.emulator.blocks import Removed, Stored
from conductor.emulator.engine import EngineCore, EngineRequest, Status, StepResult
from conductor.emulator.publisher import to_wire
from conductor.gateway.kv_ingest import EngineHashMapper
from conductor.wire.vllm_events import decode_event

COST = preset("llama3-8b-h100")
BS = 32
SEED = 99


def core(**kw: int) -> EngineCore:
    args = {
        "block_size_tokens": BS,
        "cache_blocks": 64,
        "max_model_len": 4096,
        "max_batch_size": 8,
        "max_batched_tokens": 8192,
        "engine_hash_seed": SEED,
    }
    args.update(kw)
    return EngineCore(COST, **args)


_n = 0


def request(prompt: list[int], max_tokens: int, *, remote_prefill: bool = False) -> EngineRequest:
    global _n
    _n += 1
    out = [1000 + i for i in range(max_tokens)]
    return EngineRequest(
        request_id=f"r{_n}",
        prompt_ids=list(prompt),
        out_ids=out,
        out_texts=[f"<{t}>" for t in out],
        remote_prefill=remote_prefill,
    )


def check(engine: EngineCore) -> None:
    engine.pool.check()
    for r in engine.running.values():
        assert r.status is Status.RUNNING
        assert r.n_blocks + r.reserved == engine.blocks_needed(r.prompt_tokens, r.max_tokens)
    private = sum(r.n_blocks - len(r.hashes) for r in engine.running.values())
    assert private == engine.pool.private
    assert sum(r.reserved for r in engine.running.values()) == engine.pool.reserved


def run(engine: EngineCore) -> list[StepResult]:
    steps = []
    while engine.has_work:
        steps.append(engine.step())
        check(engine)
    return steps


PROMPT = list(range(100))


def test_one_request_prefill_then_decode_steps() -> None:
    engine = core()
    req = request(PROMPT, 3)
    engine.add(req)
    s1, s2, s3 = run(engine)
    assert [(o.index, o.finished) for o in s1.outputs] == [(0, False)]
    assert s1.duration_s == pytest.approx(COST.prefill_s(100, 0))
    assert s2.duration_s == pytest.approx(COST.decode_step_s(1, 101))
    assert s3.duration_s == pytest.approx(COST.decode_step_s(1, 102))
    assert [(o.index, o.finished) for o in s3.outputs] == [(2, True)]
    hashes = tuple(int(h) for h in hash_blocks(PROMPT, BS, seed=SEED))
    assert s1.events == [Stored(hashes, None, tuple(PROMPT[:96]))]
    assert s2.events == s3.events == []
    assert req.status is Status.FINISHED and req.finish_reason == "length"
    assert req.tokens == [*PROMPT, 1000, 1001, 1002]
    assert (engine.pool.used, engine.pool.cached) == (0, 3)
    c = engine.counters
    assert (c.prefix_queries, c.prefix_hits, c.prompt_tokens, c.generation_tokens) == (
        100,
        0,
        100,
        3,
    )


def test_repeated_prompt_reuses_whole_blocks_but_recomputes_the_last_token() -> None:
    engine = core()
    engine.add(request(PROMPT, 1))
    run(engine)
    again = request(PROMPT, 1)
    engine.add(again)
    (step,) = run(engine)
    assert again.cached_tokens == 96
    assert step.duration_s == pytest.approx(COST.prefill_s(100, 96))
    assert step.events == []  # nothing new was cached
    aligned = list(range(500, 596))  # 3 full blocks
    engine.add(request(aligned, 1))
    run(engine)
    third = request(aligned, 1)
    engine.add(third)
    (step,) = run(engine)
    assert third.cached_tokens == 64  # at most prompt - 1 tokens: the last block is recomputed
    assert step.events == []  # ... and deduplicated against the cached copy
    assert engine.counters.prefix_hits == 96 + 64
    assert engine.pool.cached == 6


def test_generated_tokens_fill_and_publish_blocks() -> None:
    engine = core()
    prompt = list(range(30))
    req = request(prompt, 40)
    engine.add(req)
    steps = run(engine)
    stored = [(i, e) for i, s in enumerate(steps) for e in s.events]
    full = req.tokens  # 70 tokens; the last one's KV is never computed: 2 full blocks
    h0, h1 = (int(h) for h in hash_blocks(full, BS, seed=SEED)[:2])
    # Block 0 (30 prompt + 2 generated tokens) is computed once token 33 is sampled (step 2).
    assert stored == [
        (2, Stored((h0,), None, tuple(full[:32]))),
        (34, Stored((h1,), h0, tuple(full[32:64]))),
    ]


def test_events_map_to_the_schedulers_chained_hashes() -> None:
    engine = core()
    prompt = list(range(7, 7 + 150))
    engine.add(request(prompt, 20))
    events = [e for s in run(engine) for e in s.events]
    mapper = EngineHashMapper(InstanceId("emu"), hash_block)
    ours: list[int] = []
    for i, event in enumerate(to_wire(events, BS)):
        translated = mapper.translate(decode_event(event, index=i))
        assert isinstance(translated, BlocksStored)
        ours += translated.block_hashes
    full = prompt + [1000 + i for i in range(19)]  # 169 tokens computed -> 5 blocks
    assert ours == hash_blocks(full, BS)
    assert mapper.stats.missing_parent == 0


def test_continuous_batching_joins_new_requests_and_counts_context() -> None:
    engine = core()
    a = request(PROMPT, 3)
    engine.add(a)
    s1 = engine.step()
    b = request(list(range(200, 264)), 2)
    engine.add(b)
    s2 = engine.step()  # a decodes, b prefills in the same step
    assert [(o.request.request_id, o.index) for o in s2.outputs] == [
        (a.request_id, 1),
        (b.request_id, 0),
    ]
    # one forward pass: the decode step, plus the chunk's tokens without a second fixed part
    fixed = COST.prefill_s(1, 0)
    assert s2.duration_s == pytest.approx(
        COST.decode_step_s(1, 101) + COST.prefill_s(64, 0) - fixed
    )
    s3 = engine.step()
    assert s3.duration_s == pytest.approx(COST.decode_step_s(2, 102 + 65))
    assert [o.finished for o in s3.outputs] == [True, True]
    assert s1.prefilled == 1 and s2.prefilled == 1 and s3.decoded == 2
    assert not engine.has_work


def test_fcfs_batch_size_and_chunked_token_budget() -> None:
    engine = core(max_batch_size=2, max_batched_tokens=150)
    reqs = [request(list(range(k * 1000, k * 1000 + 100)), 3) for k in range(3)]
    for r in reqs:
        engine.add(r)
    fixed = COST.prefill_s(1, 0)
    s1 = engine.step()  # the first prompt whole, the second's first 50 tokens (the budget's rest)
    assert s1.prefilled == 2 and len(engine.running) == 2
    assert [(o.request.request_id, o.index) for o in s1.outputs] == [(reqs[0].request_id, 0)]
    assert (reqs[0].computed, reqs[1].computed) == (100, 50)
    assert s1.duration_s == pytest.approx(COST.prefill_s(100, 0) + COST.prefill_s(50, 0) - fixed)
    s2 = engine.step()  # the first decodes; the second's last 50 tokens; the batch is full
    assert s2.prefilled == 1 and s2.decoded == 1 and list(engine.waiting) == [reqs[2]]
    assert [(o.request.request_id, o.index) for o in s2.outputs] == [
        (reqs[0].request_id, 1),
        (reqs[1].request_id, 0),
    ]
    assert s2.duration_s == pytest.approx(
        COST.decode_step_s(1, 101) + COST.prefill_s(100, 50) - fixed
    )
    s3 = engine.step()
    assert s3.prefilled == 0 and list(engine.waiting) == [reqs[2]]
    assert reqs[0].status is Status.FINISHED  # its third token came in s3
    s4 = engine.step()
    assert s4.prefilled == 1
    run(engine)
    assert all(r.status is Status.FINISHED for r in reqs)


def test_a_chunked_prompt_publishes_its_blocks_as_they_are_computed() -> None:
    engine = core(max_batched_tokens=40)
    prompt = list(range(100))
    req = request(prompt, 1)
    engine.add(req)
    steps = run(engine)
    hashes = tuple(int(h) for h in hash_blocks(prompt, BS, seed=SEED))
    # chunks of 40, 40, 20 tokens: blocks 0 / 1 / 2 are full after 40 / 80 / 100 tokens
    assert [s.events for s in steps] == [
        [Stored(hashes[:1], None, tuple(prompt[:32]))],
        [Stored(hashes[1:2], hashes[0], tuple(prompt[32:64]))],
        [Stored(hashes[2:3], hashes[1], tuple(prompt[64:96]))],
    ]
    assert [len(s.outputs) for s in steps] == [0, 0, 1]
    assert [s.duration_s for s in steps] == pytest.approx(
        [COST.prefill_s(40, 0), COST.prefill_s(80, 40), COST.prefill_s(100, 80)]
    )


def test_memory_waits_then_evicts_lru_blocks() -> None:
    engine = core(cache_blocks=4)
    a = request(list(range(0, 64)), 30)  # fills ceil(93 / 32) = 3 blocks
    b = request(list(range(100, 164)), 30)  # 3 more: must wait for a
    engine.add(a)
    engine.add(b)
    engine.step()
    assert list(engine.waiting) == [b]
    while a.status is not Status.FINISHED:
        engine.step()
        check(engine)
    assert engine.pool.cached == 2  # a's two prompt blocks; its partial block was freed
    steps = run(engine)
    removed = [e for s in steps for e in s.events if isinstance(e, Removed)]
    # b takes the 2 free blocks, then evicts one cached block: the tail of a's chain.
    assert removed == [Removed((a.final_hashes[-1],))]
    assert b.status is Status.FINISHED


def test_removed_events_map_back_to_our_hashes() -> None:
    engine = core(cache_blocks=3)
    first = list(range(64))
    engine.add(request(first, 1))
    engine.add(request(list(range(100, 196)), 1))  # 3 blocks: evicts both of first's
    events = [e for s in run(engine) for e in s.events]
    mapper = EngineHashMapper(InstanceId("emu"), hash_block)
    translated = [mapper.translate(decode_event(e)) for e in to_wire(events, BS)]
    removed = [t for t in translated if isinstance(t, BlocksRemoved)]
    ours = hash_blocks(first, BS)
    assert [t.block_hashes for t in removed] == [(ours[1],), (ours[0],)]


def test_decode_leg_counts_external_hits_and_pays_the_transfer() -> None:
    engine = core()
    engine.add(request(PROMPT[:40], 1))  # caches block 0 locally
    run(engine)
    leg = request(PROMPT, 5, remote_prefill=True)
    engine.add(leg)
    s1 = engine.step()
    assert (leg.cached_tokens, leg.external_tokens) == (32, 64)
    expected = COST.prefill_s(100, 96) + COST.transfer_s(64)
    assert s1.duration_s == pytest.approx(expected)
    assert [e.hashes for e in s1.events if isinstance(e, Stored)] == [
        tuple(int(h) for h in hash_blocks(PROMPT, BS, seed=SEED)[1:3])
    ]
    run(engine)
    c = engine.counters
    assert (c.external_hits, c.external_queries, c.prefix_hits) == (64, 68, 32)


def test_abort_frees_waiting_and_running_requests() -> None:
    engine = core(max_batch_size=1)
    a, b = request(PROMPT, 50), request(list(range(300, 400)), 50)
    engine.add(a)
    engine.add(b)
    engine.step()
    engine.abort(b)
    assert b.status is Status.ABORTED and not engine.waiting
    engine.abort(a)
    check(engine)
    assert a.status is Status.ABORTED and not engine.has_work
    assert engine.pool.used == 0 and engine.pool.reserved == 0
    engine.abort(a)  # no-op


def test_validation() -> None:
    engine = core(cache_blocks=4, max_model_len=200)
    with pytest.raises(InvalidInput, match="maximum context length"):
        engine.validate(150, 51)
    with pytest.raises(InvalidInput, match="KV blocks"):
        engine.validate(129, 10)  # 5 blocks > 4
    with pytest.raises(InvalidInput):
        engine.validate(0, 1)
    with pytest.raises(InvalidInput):
        engine.validate(1, 0)
    engine.validate(100, 28)


def test_reset_prefix_cache() -> None:
    engine = core()
    engine.add(request(PROMPT, 2))
    engine.step()
    assert not engine.reset_prefix_cache()
    run(engine)
    assert engine.reset_prefix_cache()
    assert engine.pool.cached == 0
