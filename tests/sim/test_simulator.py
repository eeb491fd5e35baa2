from __future__ import annotations

import random
from dataclasses import replace

import pytest

from conductor.core.config import SchedulerConfig
from conductor.core.costmodel import LinearDecode, PolynomialPrefill, preset
from conductor.core.errors import InvalidInput
from conductor.core.types import BlockHash, Request, RequestId
from conductor.sim import SimConfig, max_tokens_outputs, simulate
from conductor.sim.cache import LruBlockCache
from conductor.sim.config import EngineConfig

BASE = preset("llama3-70b-a800x8")


def _req(i: int, t: float, prompt: int, blocks: tuple[int, ...], out: int = 4) -> Request:
    return Request(RequestId(f"r{i}"), prompt, tuple(BlockHash(b) for b in blocks), out, t)


def test_md1_queue_matches_closed_form() -> None:
    """One prefill instance running one request per step (``max_num_seqs=1``),
    deterministic service D, Poisson arrivals at rho = 0.5:
    mean TTFT = D + rho D / (2 (1 - rho)) = 1.5 D (Pollaczek-Khinchine)."""
    d = 1.0
    cost = BASE.with_(prefill=PolynomialPrefill(d, 0.0, 0.0, 0.0))
    rng = random.Random(3)
    t = 0.0
    reqs = []
    for i in range(20_000):
        t += rng.expovariate(0.5 / d)
        reqs.append(_req(i, t, 100, (), out=1))
    one = EngineConfig(max_num_seqs=1)
    cfg = SimConfig(policy="round_robin", n_prefill=1, n_decode=1, cost=cost, engine=one)
    res = simulate(reqs, cfg, outputs=max_tokens_outputs(reqs))
    mean_ttft = res.summary["ttft_s"]["mean"]  # type: ignore[index]
    assert mean_ttft == pytest.approx(1.5 * d, rel=0.04)


def test_two_requests_sharing_a_prefix_reuse_it() -> None:
    reqs = [
        _req(0, 0.0, 2048, (1, 2, 3, 4)),
        _req(1, 10.0, 2560, (1, 2, 3, 4, 5)),
    ]
    res = simulate(
        reqs,
        SimConfig(policy="mooncake", n_prefill=2, n_decode=1),
        outputs=max_tokens_outputs(reqs),
    )
    r0, r1 = res.records
    assert (r0.prefill, r1.prefill) == ("prefill-0", "prefill-0")
    assert r0.cached_tokens == 0
    assert r1.local_tokens == 2048 and r1.fetched_tokens == 0
    assert r1.ttft_s == pytest.approx(BASE.prefill_s(2560, 2048))


def test_remote_fetch_executes_and_replicates() -> None:
    """r1 lands on the idle prefill-1 and fetches the prefix that prefill-0 holds (which is
    busy with a long r2); the fetched blocks become a replica on prefill-1."""
    reqs = [
        _req(0, 0.0, 2048, (1, 2, 3, 4)),
        _req(2, 5.0, 60_000, tuple(range(100, 218))),
        _req(1, 5.1, 2560, (1, 2, 3, 4, 5)),
    ]
    res = simulate(
        reqs,
        SimConfig(policy="mooncake", n_prefill=2, n_decode=1),
        outputs=max_tokens_outputs(reqs),
    )
    _r0, r2, r1 = res.records
    assert r2.prefill == "prefill-0" and r1.prefill == "prefill-1"
    assert r1.fetched_tokens == 2048 and r1.local_tokens == 0
    xfer = BASE.transfer_s(2048)
    assert r1.ttft_s == pytest.approx(xfer + BASE.prefill_s(2560, 2048))
    assert res.summary["fetched_tokens"] == 2048


def test_without_kv_fetch_an_instance_reuses_only_its_own_cache() -> None:
    """The same arrivals as above on a cluster without a KV store between engines
    (``kv_fetch=False``, as behind ``conductor serve``): r1 computes its prefix, on whichever
    instance gives it the lower TTFT, and nothing is fetched."""
    reqs = [
        _req(0, 0.0, 2048, (1, 2, 3, 4)),
        _req(2, 5.0, 60_000, tuple(range(100, 218))),
        _req(1, 5.1, 2560, (1, 2, 3, 4, 5)),
    ]
    cfg = SimConfig(policy="mooncake", n_prefill=2, n_decode=1, kv_fetch=False)
    res = simulate(reqs, cfg, outputs=max_tokens_outputs(reqs))
    _r0, r2, r1 = res.records
    assert r2.prefill == "prefill-0" and r1.prefill == "prefill-1"
    assert r1.fetched_tokens == 0 and r1.local_tokens == 0
    assert r1.ttft_s == pytest.approx(BASE.prefill_s(2560, 0))
    assert res.summary["fetched_tokens"] == 0


def test_decode_batches_and_tbt() -> None:
    """Two requests decode together on one instance; TBT = mean of the longest 10% of
    intervals; with a constant step of 50 ms and an immediate join every interval is 50 ms
    except the first (KV hand-off tail + first step)."""
    cost = BASE.with_(decode=LinearDecode(0.05, 0.0, 0.0))
    reqs = [_req(0, 0.0, 512, (1,), out=21), _req(1, 0.0, 512, (2,), out=11)]
    res = simulate(
        reqs,
        SimConfig(policy="round_robin", n_prefill=2, n_decode=1, cost=cost),
        outputs=max_tokens_outputs(reqs),
    )
    a, b = res.records
    assert a.finish_s is not None and b.finish_s is not None
    # both prefills end at the same time; 20 and 10 decode steps of 50 ms follow
    assert a.finish_s - a.prefill_end_s == pytest.approx(
        20 * 0.05 + max(0.0, BASE.transfer_s(512) - a.prefill_compute_s)
    )  # type: ignore[operator]
    # b arrived while a's first iteration ran, so it joined at the next boundary: its
    # first interval is 100 ms and, with 10 intervals, the top 10% is that one.
    assert b.tbt_s == pytest.approx(0.1)
    assert b.finish_s - b.prefill_end_s == pytest.approx(0.05 + 10 * 0.05)  # type: ignore[operator]
    assert res.summary["completed"] == 2


def test_same_seed_same_result() -> None:
    reqs = [
        _req(i, i * 0.3, 1100 + 37 * i, (0, 1000 + i, 2000 + i), out=5 + i % 7) for i in range(200)
    ]
    cfg = SimConfig(policy="random", n_prefill=3, n_decode=2, seed=11, prefill_noise=0.1)
    a = simulate(reqs, cfg, outputs=max_tokens_outputs(reqs)).summary
    b = simulate(reqs, cfg, outputs=max_tokens_outputs(reqs)).summary
    a.pop("sim_wall_s")
    b.pop("sim_wall_s")
    assert a == b


def test_baseline_admission_rejects_after_prefill() -> None:
    cost = BASE.with_(decode=LinearDecode(0.05, 0.01, 0.0))
    reqs = [_req(i, 0.0, 512, (i,), out=50) for i in range(8)]
    sched = SchedulerConfig(admission="baseline", tbt_slo_s=0.0825)
    res = simulate(
        reqs,
        SimConfig(policy="round_robin", n_prefill=4, n_decode=1, cost=cost, scheduler=sched),
        outputs=max_tokens_outputs(reqs),
    )
    s = res.summary
    # step = 50 ms + 10 ms per request, x 1.1 for the first interval (k = 5): at most 2
    # requests keep the predicted TBT <= 82.5 ms
    assert s["completed"] == 2
    assert s["rejected_after_prefill"] == 6 and s["rejected"] == 6
    assert s["wasted_prefill_s"] == pytest.approx(6 * BASE.prefill_s(512, 0))


def test_lru_cache_evicts_oldest_and_keeps_chain() -> None:
    c = LruBlockCache(3)
    h = [BlockHash(i) for i in range(6)]
    assert c.insert(h[:2]) == ([h[0], h[1]], [])
    assert c.insert(h[2:4]) == ([h[2], h[3]], [h[0]])
    assert c.prefix_blocks(h[1:4]) == 3
    # a chain longer than the cache keeps its head
    # LRU order [1, 2, 3]; the chain's head [0, 1, 2] fits, so 3 (least recent) goes
    assert c.insert(h[:5]) == ([h[0]], [h[3]])
    assert c.prefix_blocks(h) == 3 and len(c) == 3


def test_a_running_prefill_holds_room_in_the_cache_until_it_stores() -> None:
    """vLLM allocates a prefill's KV blocks while it runs, evicting free cached blocks to
    do so: room held for 2 blocks evicts the 2 least recently used at once; a touched hit is
    not among them; the store then fits in the room given back."""
    c = LruBlockCache(4)
    h = [BlockHash(i) for i in range(8)]
    c.insert(h[:4])
    c.touch([h[0], h[7]])  # a prefill reusing block 0 started (7: not cached, ignored)
    assert c.reserve(2) == [h[1], h[2]]
    assert c.reserved == 2 and c.prefix_blocks(h[3:4]) == 1
    c.release(2)
    assert c.insert([h[0], h[5], h[6]]) == ([h[5], h[6]], [])  # LRU order now 3, 0, 5, 6
    assert c.reserved == 0 and len(c) == 4
    # room held by another prefill never makes a store evict its own chain
    assert c.reserve(2) == [h[3], h[0]]
    assert c.insert([h[5], h[6], h[7]]) == ([h[7]], [])
    assert len(c) == 3
    c.release(10)
    assert c.reserved == 0


def test_a_running_prefill_stores_its_chunks_in_the_room_it_holds() -> None:
    """Chunk by chunk: the new blocks take the room the prefill holds, evicting nothing; a
    block already cached is refreshed and takes no room; blocks beyond the room held go
    over the capacity until ``trim`` evicts the least recently used, never the newest."""
    c = LruBlockCache(4)
    h = [BlockHash(i) for i in range(8)]
    c.insert(h[:2])
    assert c.reserve(2) == []  # room for 2 more blocks: the cache holds 2 of 4
    assert c.store_held([h[2]], 2) == ([h[2]], 1)
    assert c.store_held([h[0], h[3]], 1) == ([h[3]], 1)  # 0 refreshed: LRU 1, 2, 0, 3
    assert c.reserved == 0 and len(c) == 4
    assert c.store_held([h[4], h[5]], 0) == ([h[4], h[5]], 0)
    assert len(c) == 6
    assert c.trim(2) == [h[1], h[2]]  # over by 2: the oldest go, not the 2 just stored
    assert c.prefix_blocks([h[0], h[3], h[4], h[5]]) == 4


@pytest.mark.parametrize("arrives", [5.5, 9.0])
def test_a_prefill_evicts_when_it_starts_not_when_it_ends(arrives: float) -> None:
    """One prefill instance with a cache of 4 blocks holding document A (2 blocks, stored
    by r0). r1's 4 new blocks start at t=5 and run in 512-token chunks (1 ms per token:
    about 2 s); the room they take evicts A when r1 starts, and the index hears it then. r2
    (A + 1 block) arriving at 5.5, while r1 runs, and at 9, after it, both find nothing
    cached and were planned so."""
    doc_a = (1, 2)
    reqs = [
        _req(0, 0.0, 2 * 512, doc_a, out=2),
        _req(1, 5.0, 4 * 512, (11, 12, 13, 14), out=2),
        _req(2, arrives, 3 * 512, (*doc_a, 3), out=2),
    ]
    cost = BASE.with_(prefill=PolynomialPrefill(0.01, 0.001, 0.0, 0.0))
    chunked = EngineConfig(max_num_batched_tokens=2048, long_prefill_token_threshold=512)
    res = simulate(
        reqs,
        SimConfig(
            policy="mooncake",
            n_prefill=1,
            n_decode=1,
            cost=cost,
            engine=chunked,
            cache_capacity_tokens=4 * 512,
        ),
        outputs=max_tokens_outputs(reqs),
    )
    r = {x.request_id: x for x in res.records}
    r1_end, r2_start = r["r1"].prefill_end_s, r["r2"].prefill_start_s
    assert r1_end is not None and r2_start is not None
    assert (r2_start < r1_end) is (arrives < 6)
    assert r["r2"].local_tokens == 0
    predicted = r["r2"].predicted_ttft_s
    assert predicted is not None and predicted >= cost.prefill_s(3 * 512, 0)


def test_background_replication_copies_a_hot_prefix() -> None:
    """sglang's cache_aware sends every request for a prefix to its holder (until 64 more
    are in flight there), so a hot prefix piles up on one instance; the background rule
    copies it to an idle one, where sglang's holder tie-break (lower load) then sends half."""
    hot = tuple(range(1, 61))  # 60 shared blocks (30k tokens), then 2 blocks of its own
    reqs = [_req(0, 0.0, 62 * 512, (*hot, 10_000, 20_000), out=2)]
    reqs += [
        _req(i, 10.0 + 0.1 * i, 62 * 512, (*hot, 10_000 + i, 20_000 + i), out=2)
        for i in range(1, 200)
    ]

    def run(replication: bool):  # type: ignore[no-untyped-def]
        sched = SchedulerConfig(replication_enabled=replication)
        cfg = SimConfig(policy="sglang", n_prefill=3, n_decode=1, scheduler=sched)
        return simulate(reqs, cfg, outputs=max_tokens_outputs(reqs))

    off, on = run(False), run(True)
    assert (off.copies, on.copies) == (0, 1)
    on_t, off_t = on.summary["ttft_s"], off.summary["ttft_s"]
    assert on_t["mean"] < 0.7 * off_t["mean"]  # type: ignore[index]
    assert on_t["p90"] < 0.5 * off_t["p90"]  # type: ignore[index]


def test_cpp_splits_a_long_prompt_and_lowers_its_ttft() -> None:
    n = 100_000
    blocks = tuple(range(1, -(-n // 512) + 1))
    reqs = [_req(0, 0.0, n, blocks, out=2)]
    single = simulate(
        reqs,
        SimConfig(policy="conductor", n_prefill=4, n_decode=1),
        outputs=max_tokens_outputs(reqs),
    )
    cpp = simulate(
        reqs,
        SimConfig(
            policy="conductor", n_prefill=4, n_decode=1, scheduler=SchedulerConfig(cpp_enabled=True)
        ),
        outputs=max_tokens_outputs(reqs),
    )
    r1, r4 = single.records[0], cpp.records[0]
    assert r1.cpp_nodes == 1 and r4.cpp_nodes == 4
    # alone, chunked in 4096-token steps (the long-prefill cap): step j costs P(e + c, e)
    cap = EngineConfig().long_prefill_token_threshold
    steps = [BASE.prefill_s(min(e + cap, n), e) for e in range(0, n, cap)]
    assert len(steps) == 25 and r1.ttft_s == pytest.approx(sum(steps))
    assert r4.ttft_s is not None and r1.ttft_s is not None
    assert r4.ttft_s < r1.ttft_s / 2.5
    assert r4.ttft_s == pytest.approx(r4.predicted_ttft_s)


def test_output_lengths_are_explicit() -> None:
    """No default output length: ``outputs`` is required, and ``max_tokens_outputs`` takes
    them from ``max_tokens`` only when every request has one."""
    reqs = [_req(0, 0.0, 512, (1,), out=7), _req(1, 0.1, 512, (2,), out=3)]
    assert max_tokens_outputs(reqs) == [7, 3]
    cfg = SimConfig(policy="round_robin", n_prefill=1, n_decode=1)
    res = simulate(reqs, cfg, outputs=[2, 5])
    assert [r.output_tokens for r in res.records] == [2, 5]
    bare = [replace(reqs[0], max_tokens=None), reqs[1]]
    with pytest.raises(InvalidInput) as caught:
        max_tokens_outputs(bare)
    assert (caught.value.field, caught.value.value) == ("requests[0].max_tokens", None)
    with pytest.raises(InvalidInput, match="must be one per request"):
        simulate(reqs, cfg, outputs=[1])
    with pytest.raises(TypeError, match="outputs"):
        simulate(reqs, cfg)  # type: ignore[call-arg]
