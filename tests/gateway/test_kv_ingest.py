"""EngineHashMapper (engine hashes -> ours, translation), SeqTracker and EngineKvIngest."""

from __future__ import annotations

import pytest

from conductor.core.events import AllBlocksCleared, BlocksRemoved, BlocksStored
from conductor.core.types import BlockHash, InstanceId, Tier
from conductor.gateway.kv_feed import EngineKvIngest, SeqCheck, SeqTracker, SeqVerdict
from conductor.gateway.kv_ingest import EngineHashMapper, MapperStats
from conductor.wire.events import (
    EngineAllBlocksCleared,
    EngineBlockHash,
    EngineBlockRemoved,
    EngineBlockStored,
    EngineEventBatch,
    EngineUnknownEvent,
)
from tests.gateway.hashing_standin import chain, hash_block

P0 = InstanceId("prefill-0")
H = EngineBlockHash
BS = 4
TOKENS = list(range(100, 116))  # 4 blocks of 4


def stored(
    hashes: list[int],
    tokens: list[int],
    parent: int | None = None,
    *,
    medium: str | None = "GPU",
    extra: tuple[tuple[object, ...] | None, ...] = (),
    group_idx: int | None = 0,
) -> EngineBlockStored:
    return EngineBlockStored(
        engine_hashes=tuple(H(h) for h in hashes),
        parent_engine_hash=None if parent is None else H(parent),
        token_ids=tuple(tokens),
        block_size=BS,
        medium=medium,
        extra_keys=extra,
        group_idx=group_idx,
    )


def removed(hashes: list[int], medium: str | None = "GPU") -> EngineBlockRemoved:
    return EngineBlockRemoved(engine_hashes=tuple(H(h) for h in hashes), medium=medium)


@pytest.fixture
def mapper() -> EngineHashMapper:
    return EngineHashMapper(P0, hash_block)


def test_stored_chain_from_root_yields_our_chained_hashes(mapper: EngineHashMapper) -> None:
    ours = chain(TOKENS[:8], BS)
    assert mapper.translate(stored([901, 902], TOKENS[:8]), seq=3) == BlocksStored(
        holder=P0, block_hashes=tuple(ours), tier=Tier.GPU, seq=3
    )
    assert mapper.ours(H(901)) == ours[0]
    assert mapper.ours(H(902)) == ours[1]
    assert len(mapper) == 2


def test_follow_up_event_chains_from_parents_our_hash(mapper: EngineHashMapper) -> None:
    mapper.translate(stored([901, 902], TOKENS[:8]))
    event = mapper.translate(stored([903, 904], TOKENS[8:], parent=902), seq=4)
    full = chain(TOKENS, BS)
    assert event == BlocksStored(holder=P0, block_hashes=tuple(full[2:]), tier=Tier.GPU, seq=4)
    # Same tokens in one event give the same hashes: the chain does not depend on batching.
    other = EngineHashMapper(InstanceId("decode-0"), hash_block)
    assert other.translate(stored([1, 2, 3, 4], TOKENS)) == BlocksStored(
        holder=InstanceId("decode-0"), block_hashes=tuple(full), tier=Tier.GPU
    )


def test_extra_keys_enter_the_hash_per_block(mapper: EngineHashMapper) -> None:
    extra: tuple[tuple[object, ...] | None, ...] = (("lora-a",), None)
    event = mapper.translate(stored([1, 2], TOKENS[:8], extra=extra))
    expected = chain(TOKENS[:8], BS, extras=[("lora-a",), ()])
    assert isinstance(event, BlocksStored)
    assert list(event.block_hashes) == expected
    assert expected != chain(TOKENS[:8], BS)


def test_unknown_parent_is_counted_and_skipped(mapper: EngineHashMapper) -> None:
    assert mapper.translate(stored([903], TOKENS[8:12], parent=777)) is None
    assert mapper.stats == MapperStats(missing_parent=1)
    assert len(mapper) == 0
    assert mapper.ours(H(903)) is None


def test_wrong_token_count_is_counted_and_skipped(mapper: EngineHashMapper) -> None:
    assert mapper.translate(stored([1, 2], TOKENS[:7])) is None
    assert mapper.translate(stored([], [])) is None
    assert mapper.stats == MapperStats(bad_length=2)
    assert len(mapper) == 0


def test_removal_maps_back_and_forgets(mapper: EngineHashMapper) -> None:
    full = chain(TOKENS, BS)
    mapper.translate(stored([1, 2, 3, 4], TOKENS))
    assert mapper.translate(removed([4, 3]), seq=9) == BlocksRemoved(
        holder=P0, block_hashes=(full[3], full[2]), tier=Tier.GPU, seq=9
    )
    assert mapper.ours(H(4)) is None
    assert mapper.ours(H(3)) is None
    assert mapper.ours(H(2)) == full[1]
    assert len(mapper) == 2
    # A child of a forgotten block now has a missing parent.
    assert mapper.translate(stored([5], TOKENS[12:], parent=4)) is None
    assert mapper.stats.missing_parent == 1


def test_removal_of_unknown_hashes_is_counted(mapper: EngineHashMapper) -> None:
    full = chain(TOKENS[:4], BS)
    mapper.translate(stored([1], TOKENS[:4]))
    assert mapper.translate(removed([1, 99, 98])) == BlocksRemoved(
        holder=P0, block_hashes=(full[0],), tier=Tier.GPU
    )
    assert mapper.translate(removed([1])) is None
    assert mapper.stats == MapperStats(unknown_removed=3)


def test_tiers_are_tracked_separately(mapper: EngineHashMapper) -> None:
    full = chain(TOKENS[:4], BS)
    assert mapper.translate(stored([1], TOKENS[:4], medium="CPU")) == BlocksStored(
        holder=P0, block_hashes=(full[0],), tier=Tier.DRAM
    )
    mapper.translate(stored([1], TOKENS[:4], medium=None))
    assert mapper.translate(removed([1], medium="GPU")) == BlocksRemoved(
        holder=P0, block_hashes=(full[0],), tier=Tier.GPU
    )
    # Still in the CPU tier, so still mapped (children can chain from it).
    assert mapper.ours(H(1)) == full[0]
    assert mapper.translate(removed([1], medium="cpu_tier")) == BlocksRemoved(
        holder=P0, block_hashes=(full[0],), tier=Tier.DRAM
    )
    assert mapper.ours(H(1)) is None


def test_medium_to_tier(mapper: EngineHashMapper) -> None:
    assert [mapper.tier_of(m) for m in (None, "GPU", "gpu", "CPU", "CPU_TIER", "DISK")] == [
        Tier.GPU,
        Tier.GPU,
        Tier.GPU,
        Tier.DRAM,
        Tier.DRAM,
        None,
    ]
    assert mapper.translate(stored([1], TOKENS[:4], medium="DISK")) is None
    assert mapper.translate(removed([1], medium="DISK")) is None
    assert mapper.stats == MapperStats(unknown_medium=2)


def test_other_kv_cache_groups_are_skipped(mapper: EngineHashMapper) -> None:
    assert mapper.translate(stored([1], TOKENS[:4], group_idx=1)) is None
    assert mapper.translate(EngineBlockRemoved(engine_hashes=(H(1),), group_idx=1)) is None
    assert mapper.translate(stored([1], TOKENS[:4], group_idx=None)) is not None
    assert mapper.stats == MapperStats(other_group=2)


def test_all_blocks_cleared_clears_the_map(mapper: EngineHashMapper) -> None:
    mapper.translate(stored([1, 2], TOKENS[:8]))
    assert mapper.translate(EngineAllBlocksCleared(), seq=5) == AllBlocksCleared(
        holder=P0, tier=None, seq=5
    )
    assert len(mapper) == 0
    assert mapper.translate(removed([1])) is None


def test_unknown_event_types_are_counted_and_skipped(mapper: EngineHashMapper) -> None:
    assert mapper.translate(EngineUnknownEvent("BlockReused")) is None
    assert mapper.stats == MapperStats(unknown_type=1)


def test_translate_all_keeps_order_and_drops_skipped(mapper: EngineHashMapper) -> None:
    full = chain(TOKENS, BS)
    out = mapper.translate_all(
        [stored([1], TOKENS[:4]), stored([9], TOKENS[:4], parent=8), removed([1])], seq=2
    )
    assert out == [
        BlocksStored(holder=P0, block_hashes=(full[0],), seq=2),
        BlocksRemoved(holder=P0, block_hashes=(full[0],), seq=2),
    ]


# --- SeqTracker -----------------------------------------------------------------------------


def test_seq_in_order_and_first() -> None:
    t = SeqTracker()
    assert t.observe(0, 1.0) == SeqCheck(SeqVerdict.FIRST, 0)
    assert t.observe(1, 1.1) == SeqCheck(SeqVerdict.IN_ORDER, 1, 1)
    assert t.observe(2, 1.1) == SeqCheck(SeqVerdict.IN_ORDER, 2, 2)
    assert t.expected == 3
    assert (t.gaps, t.missed, t.duplicates, t.restarts) == (0, 0, 0, 0)


def test_first_seq_can_be_mid_stream() -> None:
    t = SeqTracker()
    assert t.observe(41, 1.0) == SeqCheck(SeqVerdict.FIRST, 41)
    assert t.observe(42, 1.0).verdict is SeqVerdict.IN_ORDER


def test_seq_gap_reports_expected_and_got() -> None:
    t = SeqTracker()
    t.observe(0, 1.0)
    check = t.observe(4, 2.0)
    assert check == SeqCheck(SeqVerdict.GAP, 4, 1)
    assert check.missed == 3
    assert t.observe(5, 2.1).verdict is SeqVerdict.IN_ORDER
    assert (t.gaps, t.missed) == (1, 3)


def test_seq_duplicates_are_not_accepted() -> None:
    t = SeqTracker()
    t.observe(0, 1.0)
    t.observe(1, 2.0)
    t.observe(2, 3.0)
    assert t.observe(2, 3.0) == SeqCheck(SeqVerdict.DUPLICATE, 2, 3)
    assert t.observe(1, 2.0) == SeqCheck(SeqVerdict.DUPLICATE, 1, 3)
    assert t.observe(3, 4.0).verdict is SeqVerdict.IN_ORDER
    assert t.duplicates == 2


def test_seq_back_to_zero_or_backwards_with_newer_time_is_a_restart() -> None:
    t = SeqTracker()
    for seq in range(5):
        t.observe(seq, 10.0 + seq)
    assert t.observe(0, 20.0) == SeqCheck(SeqVerdict.RESTART, 0, 5)
    assert t.observe(1, 20.5).verdict is SeqVerdict.IN_ORDER
    # Another restart whose first batch was missed: seq 1 <= last seq 1, newer timestamp.
    assert t.observe(1, 30.0) == SeqCheck(SeqVerdict.RESTART, 1, 2)
    assert t.restarts == 2
    assert t.expected == 2


def test_replayed_overlap_after_a_gap_is_duplicate() -> None:
    t = SeqTracker()
    t.observe(0, 1.0)
    assert t.observe(3, 4.0).verdict is SeqVerdict.GAP
    # Batches 1 and 2 arrive late (older timestamps): duplicates of what a replay filled.
    assert t.observe(1, 2.0).verdict is SeqVerdict.DUPLICATE
    assert t.observe(2, 3.0).verdict is SeqVerdict.DUPLICATE


# --- EngineKvIngest -------------------------------------------------------------------------


def batch(seq: int, ts: float, *events: object) -> EngineEventBatch:
    return EngineEventBatch(topic=b"kv", seq=seq, ts=ts, events=tuple(events))  # type: ignore[arg-type]


def test_ingest_restart_clears_then_applies() -> None:
    ingest = EngineKvIngest(EngineHashMapper(P0, hash_block))
    full = chain(TOKENS, BS)
    check, out = ingest.ingest(batch(0, 1.0, stored([1, 2], TOKENS[:8])))
    assert check.verdict is SeqVerdict.FIRST
    assert out == [BlocksStored(holder=P0, block_hashes=tuple(full[:2]), seq=0)]
    check, out = ingest.ingest(batch(1, 2.0, stored([3], TOKENS[8:12], parent=2)))
    assert out == [BlocksStored(holder=P0, block_hashes=(full[2],), seq=1)]
    # Engine restarts: seq 0 again, later timestamp, new engine hashes for the same tokens.
    check, out = ingest.ingest(batch(0, 9.0, stored([71], TOKENS[:4])))
    assert check.verdict is SeqVerdict.RESTART
    assert out == [
        AllBlocksCleared(holder=P0, tier=None, seq=0),
        BlocksStored(holder=P0, block_hashes=(full[0],), seq=0),
    ]
    assert len(ingest.mapper) == 1
    check, out = ingest.ingest(batch(0, 9.0, stored([71], TOKENS[:4])))
    assert (check.verdict, out) == (SeqVerdict.DUPLICATE, [])


def test_ingest_gap_fill_order() -> None:
    ingest = EngineKvIngest(EngineHashMapper(P0, hash_block))
    full = chain(TOKENS, BS)
    ingest.ingest(batch(0, 1.0, stored([1], TOKENS[:4])))
    missed = batch(1, 2.0, stored([2], TOKENS[4:8], parent=1))
    late = batch(2, 3.0, stored([3], TOKENS[8:12], parent=2))
    check = ingest.check(late)
    assert check == SeqCheck(SeqVerdict.GAP, 2, 1)
    assert ingest.apply_unchecked(missed) == [
        BlocksStored(holder=P0, block_hashes=(full[1],), seq=1)
    ]
    assert ingest.apply(late, check) == [BlocksStored(holder=P0, block_hashes=(full[2],), seq=2)]
    assert ingest.mapper.stats == MapperStats()


def test_hash_standin_is_deterministic_and_chained() -> None:
    a = hash_block(None, [1, 2, 3, 4], ())
    assert a == hash_block(None, [1, 2, 3, 4], ())
    assert a != hash_block(None, [1, 2, 3, 5], ())
    assert hash_block(a, [1, 2, 3, 4], ()) != a
    assert hash_block(BlockHash(0), [1], ()) != hash_block(None, [1], ())
