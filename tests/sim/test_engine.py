"""The vLLM-like engine model on hand-made tiny clusters, with exact expectations: chunked
prefill interleaving, preemption order and its TBT gap, NIC sharing, role=both mixing.

The cost model is chosen so that every number is checkable by hand: a prefill of N new
tokens costs P(N, 0) = 20 ms + 10 us/token (F = P(1, 0) = 20.01 ms), a decode step 10 ms."""

from __future__ import annotations

import pytest

from conductor.core.costmodel import LinearDecode, PolynomialPrefill, preset
from conductor.core.errors import InvalidInput
from conductor.core.types import BlockHash, Request, RequestId
from conductor.sim import SimConfig, max_tokens_outputs, simulate
from conductor.sim.config import EngineConfig

BASE = preset("llama3-70b-a800x8")
COST = BASE.with_(
    prefill=PolynomialPrefill(0.02, 1e-5, 0.0, 0.0), decode=LinearDecode(0.01, 0.0, 0.0)
)
P = COST.prefill_s
F = COST.prefill_s(1, 0)


def _req(i: int, t: float, prompt: int, out: int) -> Request:
    return Request(RequestId(f"r{i}"), prompt, (), out, t)


def test_a_prefills_computed_chunks_are_reused_before_it_ends() -> None:
    """vLLM caches a prompt's blocks chunk by chunk. A 40k prompt takes the whole
    8192-token budget for four steps; a 33k prompt sharing its first 64 blocks (32,768
    tokens) arrives during the first and is admitted in the fifth, next to the last
    7232-token chunk: the 32,768 tokens computed by then are cached, so it computes only
    its last 232 tokens and ends in that step (with blocks cached only at the prefill's
    end it would have found nothing)."""
    reqs = [
        Request(RequestId("r0"), 40_000, tuple(BlockHash(b) for b in range(1, 79)), 1, 0.0),
        Request(RequestId("r1"), 33_000, tuple(BlockHash(b) for b in range(1, 65)), 1, 0.001),
    ]
    plain = EngineConfig(long_prefill_token_threshold=0)
    cfg = SimConfig(policy="round_robin", n_prefill=1, n_decode=1, cost=COST, engine=plain)
    long, short = simulate(reqs, cfg, outputs=max_tokens_outputs(reqs)).records
    assert short.local_tokens == 32_768 and short.fetched_tokens == 0
    four = sum(P(e + 8192, e) for e in range(0, 32_768, 8192))
    last = F + (P(40_000, 32_768) - F) + (P(33_000, 32_768) - F)
    assert long.prefill_end_s == pytest.approx(four + last)
    assert short.prefill_end_s == pytest.approx(four + last)


@pytest.mark.parametrize("lanes", [1, 2])
def test_the_scheduler_told_of_the_engines_lanes_predicts_the_short_prompts_wait(
    lanes: int,
) -> None:
    """The same two prompts as below, the scheduler told that each engine prefills two
    prompts side by side (``prefill_lanes``, what these engines do, with their 4,096-token
    chunks) or not: the short prompt's predicted TTFT is the rest of the long prompt's step
    under way, then one step, its own prefill beside another of the long prompt's chunks
    (taken as equal: 0.113 s), against its wait for the whole long prompt; it really ends
    after 0.131 s (the long prompt's first step, then the second)."""
    reqs = [_req(0, 0.0, 40_000, 1), _req(1, 0.001, 1000, 1)]
    assert EngineConfig().lanes() == 2  # 8192-token budget, 4096 tokens per prompt and step
    cfg = SimConfig(policy="round_robin", n_prefill=1, n_decode=1, cost=COST, prefill_lanes=lanes)
    _, short = simulate(reqs, cfg, outputs=max_tokens_outputs(reqs)).records
    assert short.ttft_s == pytest.approx(P(4096, 0) + P(8192, 4096) + P(1000, 0) - F - 0.001)
    rest = 1 - 40_000 * 0.001 / P(40_000, 0) / 4096  # of the first step, 1 ms in
    shared = (rest + 1) * (P(40_000, 0) - 0.001) / (9 + rest) + P(1000, 0)
    queued = P(40_000, 0) - 0.001 + P(1000, 0)
    assert short.predicted_ttft_s == pytest.approx(shared if lanes == 2 else queued)


def test_a_short_prompt_does_not_wait_behind_a_long_one() -> None:
    """A 40k prompt takes 4096 tokens a step (the long-prefill cap); a 1k prompt arriving
    during its first step shares the second step and is done after it."""
    reqs = [_req(0, 0.0, 40_000, 1), _req(1, 0.001, 1000, 1)]
    res = simulate(
        reqs,
        SimConfig(policy="round_robin", n_prefill=1, n_decode=1, cost=COST),
        outputs=max_tokens_outputs(reqs),
    )
    long, short = res.records
    step1 = P(4096, 0)
    step2 = F + (P(8192, 4096) - F) + (P(1000, 0) - F)
    assert short.prefill_end_s == pytest.approx(step1 + step2)
    # the long one: 10 steps (9 x 4096 + 3136), the second shared with the short one
    steps = [P(min(e + 4096, 40_000), e) for e in range(0, 40_000, 4096)]
    assert len(steps) == 10
    assert long.prefill_end_s == pytest.approx(sum(steps) + P(1000, 0) - F)
    # without the cap (vLLM's default when partial prefills are off) the long one takes the
    # whole 8192-token budget each step and the short one waits for its last, short, chunk
    plain = EngineConfig(long_prefill_token_threshold=0)
    res0 = simulate(
        reqs,
        SimConfig(policy="round_robin", n_prefill=1, n_decode=1, cost=COST, engine=plain),
        outputs=max_tokens_outputs(reqs),
    )
    long0, short0 = res0.records
    steps0 = [P(min(e + 8192, 40_000), e) for e in range(0, 40_000, 8192)]
    assert len(steps0) == 5  # the last chunk is 7232 tokens: 960 left for the short one
    last = F + (P(40_000, 32_768) - F) + (P(960, 0) - F)
    assert long0.prefill_end_s == pytest.approx(sum(steps0[:4]) + last)
    assert short0.prefill_end_s == pytest.approx(sum(steps0[:4]) + last + P(1000, 960))


def test_the_newest_request_is_preempted_and_its_tbt_shows_the_gap() -> None:
    """Three 32-token prompts decode 39 tokens each on an engine of 10 blocks of 16 tokens.
    r0 joins first and runs step 0 alone; r1 and r2 join at step 1 (3 blocks each, 9 used).
    At step 17 r1 and r2 both need a 4th block with 1 free: r2, the newest, is preempted
    (recompute) after 16 tokens. It is readmitted when r0 finishes (step 38), recomputing
    its 49 tokens in step 39 beside r1's last token, and emits its 23 remaining tokens."""
    reqs = [_req(i, 0.0, 32, 40) for i in range(3)]
    small = EngineConfig(kv_capacity_tokens=160)
    cfg = SimConfig(policy="round_robin", n_prefill=3, n_decode=1, cost=COST, engine=small)
    res = simulate(reqs, cfg, outputs=max_tokens_outputs(reqs))
    r0, r1, r2 = res.records
    assert [r.preemptions for r in res.records] == [0, 0, 1]
    assert res.summary["preemptions"] == 1
    join = P(32, 0)
    assert r0.decode_join_s == r1.decode_join_s == r2.decode_join_s == pytest.approx(join)
    recompute_step = 0.01 + P(49, 0) - F
    assert r0.finish_s == pytest.approx(join + 39 * 0.01)
    assert r1.finish_s == pytest.approx(join + 39 * 0.01 + recompute_step)
    assert r2.finish_s == pytest.approx(join + 39 * 0.01 + recompute_step + 22 * 0.01)
    # r2's intervals: 0.02 (it joined a step late), 15 x 10 ms, the gap from step 16's end
    # to step 39's, 22 x 10 ms; TBT = mean of the longest 10% (4 of 39)
    gap = (39 - 17) * 0.01 + recompute_step
    assert r2.tbt_s == pytest.approx((gap + 0.02 + 0.01 + 0.01) / 4)
    assert r1.tbt_s == pytest.approx((0.02 + recompute_step + 0.01 + 0.01) / 4)
    assert r0.tbt_s == pytest.approx(0.01)


def test_a_partial_prefill_that_runs_out_of_blocks_preempts_the_newest() -> None:
    """8 blocks of 16 tokens, 64-token steps, at most 32 tokens per prefill per step. A and B
    (100 tokens each) arrive together; A runs step 1 alone, both run step 2 (6 blocks). In
    step 3 A takes its 6th block and B, the newest, finds none: B preempts itself (its 32
    tokens are lost) and nothing is admitted in that step. B fits again once A is done."""
    small = EngineConfig(
        max_num_batched_tokens=64, long_prefill_token_threshold=32, kv_capacity_tokens=128
    )
    reqs = [_req(0, 0.0, 100, 1), _req(1, 0.0, 100, 1)]
    cfg = SimConfig(policy="round_robin", n_prefill=1, n_decode=1, cost=COST, engine=small)
    res = simulate(reqs, cfg, outputs=max_tokens_outputs(reqs))
    a, b = res.records
    assert (a.preemptions, b.preemptions) == (0, 1)
    chunk = 1e-5  # per token beyond the first
    a_end = P(32, 0) + (F + 2 * 31 * chunk) + P(96, 64) + P(100, 96)
    assert a.prefill_end_s == pytest.approx(a_end)
    alone = P(32, 0) + P(64, 32) + P(96, 64) + P(100, 96)
    assert b.prefill_end_s == pytest.approx(a_end + alone)
    # B's lost chunk (its share of step 2: its own tokens and half the pass) counts as spent
    assert b.prefill_compute_s == pytest.approx(31 * chunk + F / 2 + alone)


def test_kv_transfers_into_one_decode_engine_share_its_nic() -> None:
    """Two equal prompts prefill at once on two engines; each KV hand-off takes 2 s on a slow
    NIC. The first streams during its prefill and ends 2 s after that prefill began; the
    second has to wait for the decode engine's ingress, so it joins 2 s later."""
    kv = COST.kv_bytes_per_token
    prompt = 1000
    slow = COST.with_(transfer_bytes_per_s=prompt * kv / (2.0 - COST.transfer_latency_s))
    assert slow.transfer_s(prompt) == pytest.approx(2.0)
    reqs = [_req(0, 0.0, prompt, 3), _req(1, 0.0, prompt, 3)]
    res = simulate(
        reqs,
        SimConfig(policy="round_robin", n_prefill=2, n_decode=1, cost=slow),
        outputs=max_tokens_outputs(reqs),
    )
    a, b = res.records
    assert (a.prefill, b.prefill, a.decode, b.decode) == (
        "prefill-0",
        "prefill-1",
        "decode-0",
        "decode-0",
    )
    assert a.prefill_end_s == b.prefill_end_s == pytest.approx(P(prompt, 0))
    assert a.decode_join_s == pytest.approx(2.0)
    assert b.decode_join_s == pytest.approx(4.0)
    # two decode engines (a per-request decode cost spreads them): two ingress NICs, no
    # waiting (the egresses differ too)
    spread = slow.with_(decode=LinearDecode(0.01, 1e-4, 0.0))
    res2 = simulate(
        reqs,
        SimConfig(policy="round_robin", n_prefill=2, n_decode=2, cost=spread),
        outputs=max_tokens_outputs(reqs),
    )
    assert [r.decode for r in res2.records] == ["decode-0", "decode-1"]
    assert [r.decode_join_s for r in res2.records] == pytest.approx([2.0, 2.0])


def test_role_both_mixes_a_prefill_chunk_into_a_decode_step() -> None:
    """One role=both engine: r0 (1000 tokens) prefills in 30 ms then decodes 10 ms steps;
    r1 arrives during r0's third decode step and is prefilled in the next step beside r0's
    token: that step costs 10 ms + P(2000, 0) - F, which is r0's longest interval."""
    pe = P(1000, 0)
    reqs = [_req(0, 0.0, 1000, 10), _req(1, pe + 0.025, 2000, 3)]
    res = simulate(
        reqs,
        SimConfig(policy="round_robin", n_prefill=0, n_decode=0, n_both=1, cost=COST),
        outputs=max_tokens_outputs(reqs),
    )
    r0, r1 = res.records
    assert (r0.prefill, r0.decode, r1.prefill, r1.decode) == ("both-0",) * 4
    mixed = 0.01 + P(2000, 0) - F
    assert r0.prefill_end_s == pytest.approx(pe)
    assert r1.prefill_end_s == pytest.approx(pe + 0.03 + mixed)
    assert r0.tbt_s == pytest.approx(mixed)  # 9 intervals: the longest 10% is that one
    assert r0.finish_s == pytest.approx(pe + 8 * 0.01 + mixed)
    assert r1.finish_s == pytest.approx(pe + 0.03 + mixed + 2 * 0.01)
    assert r1.tbt_s == pytest.approx(0.01)


def test_a_cost_bias_slows_the_engines_and_not_the_schedulers_model() -> None:
    """``cost_bias=1`` runs the engines 2x slower, chunked prefill and mixed steps alike;
    the scheduler predicts with ``cost`` (no correction), so its predicted TTFT is half."""
    reqs = [_req(0, 0.0, 10_000, 1)]
    cfg = SimConfig(policy="round_robin", n_prefill=1, n_decode=1, cost=COST, cost_bias=1.0)
    (r,) = simulate(reqs, cfg, outputs=max_tokens_outputs(reqs)).records
    steps = [P(min(e + 4096, 10_000), e) for e in range(0, 10_000, 4096)]
    assert r.ttft_s == pytest.approx(2 * sum(steps))
    assert r.predicted_ttft_s == pytest.approx(P(10_000, 0))


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_num_batched_tokens", 0), ("block_size_tokens", 0), ("long_prefill_token_threshold", -1)],
)
def test_bad_engine_settings_name_the_field(field: str, value: int) -> None:
    with pytest.raises(InvalidInput) as err:
        EngineConfig(**{field: value})
    assert err.value.field == field
