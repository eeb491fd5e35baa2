"""``conductor.core.types``: the request's copy-with-another-SLO."""

from __future__ import annotations

import dataclasses

from conductor.core.types import Request


def test_with_ttft_slo_is_replace() -> None:
    r = Request(
        "r1", 40, (1, 2, 3), max_tokens=7, arrival_s=2.5, ttft_slo_s=9.0, tbt_slo_s=0.1, tags=("a",)
    )
    got = r.with_ttft_slo(3.25)
    assert got == dataclasses.replace(r, ttft_slo_s=3.25)
    assert got.ttft_slo_s == 3.25 and r.ttft_slo_s == 9.0
    assert [f.name for f in dataclasses.fields(Request)] == [
        "request_id",
        "prompt_tokens",
        "block_hashes",
        "max_tokens",
        "arrival_s",
        "ttft_slo_s",
        "tbt_slo_s",
        "tags",
    ]  # with_ttft_slo passes them in this order: a new field must be added there too
