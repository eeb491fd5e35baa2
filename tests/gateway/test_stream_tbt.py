"""The TBT the gateway observes per relayed stream (conductor.gateway.stream_tbt)."""

from __future__ import annotations

from conductor.gateway.stream_tbt import TokenGaps


def test_gaps_start_at_the_first_token_and_merged_tokens_add_zero_gaps() -> None:
    gaps = TokenGaps()
    assert gaps.tbt_s() is None
    gaps.mark(1.0, 1)  # the first token: TTFT, no interval
    assert gaps.tbt_s() is None
    gaps.mark(1.5, 0)  # the rest of a split event: nothing
    gaps.mark(1.25, 1)
    gaps.mark(2.0, 3)  # three tokens in one chunk: 0.75, then 0, 0
    assert gaps.gaps == [0.25, 0.75, 0.0, 0.0]
    assert gaps.tbt_s() == 0.75  # ceil(0.1 x 4) = 1 longest interval


def test_first_chunk_with_several_tokens() -> None:
    gaps = TokenGaps()
    gaps.mark(3.0, 2)
    assert gaps.gaps == [0.0]
    assert gaps.tbt_s() == 0.0
